package engine

import (
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
)

// Backend events in the metadata: a master lost is replaced by its oldest
// live synchronised slave (mirror.Promote), a synchronised slave lost is
// no longer synchronised (mirror.SlaveLost), and a backend that returns
// takes its place as the youngest slave of the queues it held, purged
// first (mirror.Rejoin). The data path's side of a failover (moving
// consumers, requeueing what clients had not acked, epoch-scoped tags) is
// the proxy's; here the new master's trimmer is stopped, so that what it
// held returns to its queue, ready.

// takeEvents returns the backend events received since the last call.
func (e *Engine) takeEvents() []controllink.Event {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	evs := e.events
	e.events = nil
	return evs
}

// addEvent queues a watcher event for the loop; it never blocks.
func (e *Engine) addEvent(ev controllink.Event) {
	e.evMu.Lock()
	e.events = append(e.events, ev)
	e.evMu.Unlock()
	e.poke()
}

// SetPaused tells the engine that its proxy pauses (pause_minority: it
// sees no more than half of its cluster) or serves again. What a paused
// proxy takes for lost backends is its side of a partition's view: the
// majority decides for those it cannot reach. So a paused engine records
// no loss; each waits until the proxy serves again, and is recorded then
// if the backend is still down. Recorded at once, after the healing but
// before this proxy's serf has seen the majority alive again (it is paused
// until then), a stale verdict could move a master away from a live broker,
// to a slave that rejoined unsynchronised meanwhile. For ResumeSettle after
// it serves again, it leaves promotions to the other proxies, which were
// never cut off: its serf may have seen only one of them alive again so
// far, and its own probes of the brokers reconnect after the healing too.
func (e *Engine) SetPaused(paused bool) { e.liveness.setPaused(paused) }

// backendLost records a backend's loss in the metadata of every queue with
// a copy there.
func (e *Engine) backendLost(ev controllink.Event) {
	if e.liveness.isPaused() {
		e.log.Info("backend lost while this proxy is paused in a minority; recorded once it serves again, if still down", "backend", ev.Backend)
		e.retryLoss(ev)
		return
	}
	cause := mirror.CauseFailure
	if ev.Cause == controllink.CauseShutdown {
		cause = mirror.CauseShutdown
	}
	live := e.liveness.live()
	delete(live, ev.Backend) // whatever the watcher says now, this event is a loss
	failed, deferred := false, false
	settling := e.liveness.settlingAfterPause()
	for _, m := range e.opts.Store.List() {
		e.syncs.cancelTo(m.ID, ev.Backend)
		var err error
		switch {
		case m.Master == ev.Backend && settling:
			deferred = true
		case m.Master == ev.Backend:
			err = e.promote(m.ID, ev, cause, live)
		case m.SlaveIndex(ev.Backend) >= 0:
			_, err = e.records.update(m.ID, func(m mirror.QueueMeta) (mirror.QueueMeta, bool) {
				return mirror.SlaveLost(m, ev.Backend)
			})
		}
		failed = failed || err != nil
	}
	if deferred {
		e.log.Info("a master's backend lost soon after this proxy served again; its promotion is left to the other proxies for now", "backend", ev.Backend)
	}
	if failed || deferred {
		// A write that could not be recorded (in a cluster: no leader
		// during an election) is decided again a moment later, while the
		// backend is still down.
		e.retryLoss(ev)
	}
}

// retryLoss decides a backend's loss again a second from now if the
// backend is still down then, and waits on while the proxy is paused.
func (e *Engine) retryLoss(ev controllink.Event) {
	if e.ctx.Err() != nil {
		return
	}
	time.AfterFunc(time.Second, func() {
		switch {
		case e.ctx.Err() != nil || e.liveness.up(ev.Backend):
		case e.liveness.isPaused():
			e.retryLoss(ev)
		default:
			e.addEvent(ev)
		}
	})
}

// promote replaces the lost master of a queue, deciding again on the
// current record if another writer got there first.
func (e *Engine) promote(id mirror.QueueID, ev controllink.Event, cause mirror.Cause, live mirror.LiveSet) error {
	def, _ := definition(e.opts.Policies, id)
	var p mirror.Promotion
	meanwhile := false
	written, err := e.records.update(id, func(m mirror.QueueMeta) (mirror.QueueMeta, bool) {
		if m.Master != ev.Backend {
			meanwhile = true // by another proxy of a cluster, or an earlier event
			return m, false
		}
		p = mirror.Promote(m, live, cause, def)
		return p.Meta, p.Promoted()
	})
	log := e.log.With("queue", id.Name, "vhost", id.VHost)
	switch {
	case err != nil:
		log.Warn("cannot record a promotion", "from", ev.Backend, "err", err)
	case meanwhile:
		log.Info("master lost; already replaced", "from", ev.Backend, "master", written.Master, "epoch", written.Epoch)
	case !p.Promoted():
		log.Warn("master lost; nobody promoted", "master", ev.Backend, "cause", cause.String(), "reason", p.Reason)
	default:
		// What the new master's trimmer held is ready again there once it
		// stops: the messages clients may not have acked, requeued.
		requeued := 0
		if tr := e.trimmers.get(id, p.To); tr != nil {
			requeued, _ = tr.t.Stats()
		}
		e.trimmers.stop(id, p.To)
		log.Warn("master lost; slave promoted", "from", p.From, "to", p.To, "epoch", written.Epoch, "requeued", requeued,
			"synchronised", p.Synchronised, "loses_messages", p.LosesMessages(), "cause", cause.String(),
			"since_detection", time.Since(ev.At), "reason", p.Reason)
	}
	return err
}

// backendBack lets the copies a returning backend held when it was lost
// (those of queues) rejoin as the youngest slaves, purged: the old
// masters that were replaced, and the slaves. A queue that waited for its
// master has nothing to do. Copies that rejoined leave queues; the loop
// tries the rest again later.
func (e *Engine) backendBack(backend string, queues map[mirror.QueueID]bool) {
	if !e.roles.trimsHere(backend) {
		// In a cluster the proxy beside the backend lets its copies rejoin
		// (cluster.go): a purge from a second proxy could come after the
		// rejoin and empty what was published to the copy since.
		clear(queues)
		return
	}
	for id := range queues {
		m, ok := e.opts.Store.Get(id)
		if !ok {
			// Deleted while the backend was down: its copy goes too.
			if _, err := e.operator.buryCopies(id, []string{backend}); err != nil {
				e.log.Warn("cannot delete a returning copy of a deleted queue; retrying", "queue", id.Name, "vhost", id.VHost, "backend", backend, "err", err)
				continue
			}
		}
		if !ok || m.Master == backend {
			delete(queues, id)
			continue
		}
		// The copy is purged through a trimmer on the new connection,
		// started first: from then on settlements reach it, so messages
		// published to it after the purge are trimmed like any.
		e.syncs.cancelTo(id, backend) // it must not call the purged copy synchronised
		e.trimmers.stop(id, backend)
		err := e.operator.declareCopy(backend, m) // a transient copy did not survive a restart
		if err == nil {
			e.trimmers.ensure(m, backend)
			if tr := e.trimmers.get(id, backend); tr != nil {
				ctx, cancel := e.life.operation()
				_, err = tr.t.Purge(ctx)
				cancel()
			} else {
				err = e.operator.purgeCopy(backend, id)
			}
		}
		if err == nil {
			_, err = e.records.update(id, func(cur mirror.QueueMeta) (mirror.QueueMeta, bool) {
				if cur.Master == backend {
					return cur, false
				}
				r := mirror.Rejoin(cur, backend)
				return r.Meta, r.Joined
			})
		}
		if err != nil {
			e.log.Warn("a returning copy cannot rejoin; retrying", "queue", id.Name, "vhost", id.VHost, "backend", backend, "err", err)
			continue
		}
		delete(queues, id)
		e.log.Info("copy rejoined as the youngest slave, purged", "queue", id.Name, "vhost", id.VHost, "backend", backend)
	}
}
