package engine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"

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

// failover carries out backend events in the metadata: it takes the
// watcher's events (and serf's verdicts, as events) for the loop, records
// promotions and lost slaves, and lets returning copies rejoin. The events
// queue is guarded by mu, taken alone; lost and ownCopies are the loop's
// (only its goroutine touches them).
type failover struct {
	store    *store.Store
	records  *recorder
	trimmers *trimmers
	syncs    *syncs
	liveness *liveness
	peers    Peers    // the other proxies of a sidecar cluster; nil alone
	history  *history // the promotions written here, for the status page
	operator *operator
	policies *config.PolicyStore
	roles    roles
	// rejoins hears of every copy that rejoins purged, for the forwarder
	// of dead-letters (deadletters.go).
	rejoins *rejoins
	log     *slog.Logger
	life    lifetime
	poke    func() // wakes the loop (Engine.poke)
	metrics *counters

	mu     sync.Mutex
	events []controllink.Event // taken by the loop
	// lost are the backends seen going down, with the queues that held a
	// copy there then, owned by the loop: those copies rejoin when the
	// backend is back (the watcher's first Up of a backend is no return).
	lost map[string]map[mirror.QueueID]bool
	// ownCopies is the loop's check of this node's copies at a cluster
	// proxy's start (checkOwnCopies).
	ownCopies ownCopiesCheck
	// outvoted are the backends this proxy counts down and a majority of
	// the proxies did not, when last asked (majorityDown), owned by the
	// loop: said once per episode.
	outvoted map[string]bool
	// unpromoted holds, per queue whose lost master nobody replaced, the
	// reason last logged (mirror.QueueID → string), so that a decision
	// taken again every second is logged once.
	unpromoted sync.Map
}

// takeEvents returns the backend events received since the last call.
func (f *failover) takeEvents() []controllink.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	evs := f.events
	f.events = nil
	return evs
}

// addEvent queues a watcher event for the loop; it never blocks.
func (f *failover) addEvent(ev controllink.Event) {
	f.mu.Lock()
	f.events = append(f.events, ev)
	f.mu.Unlock()
	f.poke()
}

// backendLost records a backend's loss in the metadata of every queue with
// a copy there.
func (f *failover) backendLost(ev controllink.Event) {
	if f.liveness.isPaused() {
		f.log.Info("backend lost while this proxy is paused in a minority; recorded once it serves again, if still down", "backend", ev.Backend)
		f.retryLoss(ev)
		return
	}
	cause := mirror.CauseFailure
	if ev.Cause == controllink.CauseShutdown {
		cause = mirror.CauseShutdown
	}
	live := f.liveness.live()
	delete(live, ev.Backend) // whatever the watcher says now, this event is a loss
	settling := f.liveness.settlingAfterPause()
	outvoted := !settling && f.mastersOn(ev.Backend) && !f.majorityDown(ev)
	var (
		mu                        sync.Mutex
		failed, deferred, waiting bool
	)
	queues := make(chan mirror.QueueMeta)
	var workers sync.WaitGroup
	for range lossWorkers {
		workers.Go(func() {
			for m := range queues {
				f.syncs.cancelTo(m.ID, ev.Backend)
				var err error
				noLiveSlave, deferredHere := false, false
				switch {
				case m.Master == ev.Backend && (settling || outvoted):
					deferredHere = true
				case m.Master == ev.Backend:
					noLiveSlave, err = f.promote(m.ID, ev, cause, live)
				case m.SlaveIndex(ev.Backend) >= 0:
					_, err = f.records.update(m.ID, func(m mirror.QueueMeta) (mirror.QueueMeta, bool) {
						return mirror.SlaveLost(m, ev.Backend)
					})
				}
				mu.Lock()
				failed, deferred, waiting = failed || err != nil, deferred || deferredHere, waiting || noLiveSlave
				mu.Unlock()
			}
		})
	}
	for _, m := range f.store.List() {
		queues <- m
	}
	close(queues)
	workers.Wait()
	if deferred && !outvoted {
		f.log.Info("a master's backend lost soon after this proxy served again; its promotion is left to the other proxies for now", "backend", ev.Backend)
	}
	if failed || deferred || waiting {
		// A write that could not be recorded (in a cluster: no leader
		// during an election), or a queue whose slaves' backends all
		// counted down at that moment (probes that time out on a loaded
		// host), is decided again a moment later, while the backend is
		// still down.
		f.retryLoss(ev)
	}
}

// mastersOn reports whether the metadata records a master on backend.
func (f *failover) mastersOn(backend string) bool {
	for _, m := range f.store.List() {
		if m.Master == backend {
			return true
		}
	}
	return false
}

// majorityDown reports whether the masters of a backend this proxy counts
// down may be promoted away: always for one proxy alone, and when serf
// declared the proxy beside the backend failed (the node is gone); in a
// cluster otherwise only when a majority of the proxies count the backend
// down. A proxy cut off from a broker the others still reach (a partial
// partition) must not depose its masters: the other proxies would go on
// delivering from them until their logs apply the promotion, while the new
// master delivers the same messages again. Its own clients of those queues
// wait meanwhile, as during failover_grace. Each proxy's probe sees a
// broker that dies within moments of the others', so the second proxy to
// see it finds a majority of three.
func (f *failover) majorityDown(ev controllink.Event) bool {
	if f.peers == nil || errors.Is(ev.Err, errMemberFailed) {
		return true
	}
	ctx, cancel := context.WithTimeout(f.life.ctx, countDownTimeout)
	defer cancel()
	down, members, err := f.peers.CountDown(ctx, ev.Backend)
	down++ // this proxy's own verdict
	if 2*down > members {
		if f.outvoted[ev.Backend] {
			f.log.Info("a majority of the proxies counts the backend down too; promoting away from it", "backend", ev.Backend, "down", down, "members", members)
			delete(f.outvoted, ev.Backend)
		}
		return true
	}
	if !f.outvoted[ev.Backend] {
		f.outvoted[ev.Backend] = true
		log := f.log.With("backend", ev.Backend, "down", down, "members", members)
		if err != nil {
			log = log.With("err", err)
		}
		log.Warn("this proxy counts a backend down that most proxies still reach; its masters stay, and this proxy's clients of their queues wait until it reaches the backend again")
	}
	return false
}

// countDownTimeout bounds majorityDown's question to the other proxies.
const countDownTimeout = time.Second

// lossWorkers is how many queues a backend's loss changes at once. Each
// change is a write to the metadata log, and raft appends the writes that
// wait together in one batch: a broker that masters a thousand queues is
// failed over in a few log writes instead of a thousand in a row, and the
// consumers of the last queue wait for that much less.
const lossWorkers = 32

// retryLoss decides a backend's loss again a second from now if the
// backend is still down then, and waits on while the proxy is paused.
func (f *failover) retryLoss(ev controllink.Event) {
	if f.life.ctx.Err() != nil {
		return
	}
	time.AfterFunc(time.Second, func() {
		switch {
		case f.life.ctx.Err() != nil || f.liveness.up(ev.Backend):
		case f.liveness.isPaused():
			f.retryLoss(ev)
		default:
			f.addEvent(ev)
		}
	})
}

// promote replaces the lost master of a queue, deciding again on the
// current record if another writer got there first. noLiveSlave reports
// that nobody was promoted for want of a live slave.
func (f *failover) promote(id mirror.QueueID, ev controllink.Event, cause mirror.Cause, live mirror.LiveSet) (noLiveSlave bool, err error) {
	def, _ := definition(f.policies, id)
	var p mirror.Promotion
	meanwhile := false
	written, err := f.records.update(id, func(m mirror.QueueMeta) (mirror.QueueMeta, bool) {
		if m.Master != ev.Backend {
			meanwhile = true // by another proxy of a cluster, or an earlier event
			return m, false
		}
		p = mirror.Promote(m, live, cause, def)
		return p.Meta, p.Promoted()
	})
	log := f.log.With("queue", id.Name, "vhost", id.VHost)
	switch {
	case err != nil:
		log.Warn("cannot record a promotion", "from", ev.Backend, "err", err)
	case meanwhile:
		log.Info("master lost; already replaced", "from", ev.Backend, "master", written.Master, "epoch", written.Epoch)
	case !p.Promoted():
		// Decided again every second while it waits for a slave's backend:
		// said once per queue and reason.
		if last, seen := f.unpromoted.Swap(id, p.Reason); !seen || last != p.Reason {
			log.Warn("master lost; nobody promoted", "master", ev.Backend, "cause", cause.String(), "reason", p.Reason)
		}
	default:
		f.history.promoted(id, p, cause, written.Epoch, ev.At, time.Now())
		f.metrics.promoted(int(cause), p.Synchronised, ev.At)
		f.unpromoted.Delete(id)
		// What the new master's trimmer held is ready again there once it
		// stops: the messages clients may not have acked, requeued.
		requeued := 0
		if tr := f.trimmers.get(id, p.To); tr != nil {
			requeued, _ = tr.t.Stats()
		}
		f.trimmers.stop(id, p.To)
		log.Warn("master lost; slave promoted", "from", p.From, "to", p.To, "epoch", written.Epoch, "requeued", requeued,
			"synchronised", p.Synchronised, "loses_messages", p.LosesMessages(), "cause", cause.String(),
			"since_detection", time.Since(ev.At), "reason", p.Reason)
	}
	return p.NoLiveSlave && err == nil && !meanwhile, err
}

// backendBack lets the copies a returning backend held when it was lost
// (those of queues) rejoin as the youngest slaves, purged: the old
// masters that were replaced, and the slaves. A queue that waited for its
// master has nothing to do. Copies that rejoined leave queues; the loop
// tries the rest again later.
func (f *failover) backendBack(backend string, queues map[mirror.QueueID]bool) {
	if !f.roles.trimsHere(backend) {
		// In a cluster the proxy beside the backend lets its copies rejoin
		// (cluster.go): a purge from a second proxy could come after the
		// rejoin and empty what was published to the copy since.
		clear(queues)
		return
	}
	for id := range queues {
		m, ok := f.store.Get(id)
		if !ok {
			// Deleted while the backend was down: its copy goes too.
			if _, err := f.operator.buryCopies(id, []string{backend}); err != nil {
				f.log.Warn("cannot delete a returning copy of a deleted queue; retrying", "queue", id.Name, "vhost", id.VHost, "backend", backend, "err", err)
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
		f.syncs.cancelTo(id, backend) // it must not call the purged copy synchronised
		f.trimmers.stop(id, backend)
		err := f.operator.declareCopy(backend, m) // a transient copy did not survive a restart
		if err == nil {
			f.trimmers.ensure(m, backend)
			if tr := f.trimmers.get(id, backend); tr != nil {
				ctx, cancel := f.life.operation()
				_, err = tr.t.Purge(ctx)
				cancel()
			} else {
				err = f.operator.purgeCopy(backend, id)
			}
		}
		if err == nil {
			// Before the copy is recorded a slave again: nothing is
			// published to it until then, so what its broker dropped
			// before now is stale (deadletters.go).
			f.rejoins.note(id, backend, time.Now())
			_, err = f.records.update(id, func(cur mirror.QueueMeta) (mirror.QueueMeta, bool) {
				if cur.Master == backend {
					return cur, false
				}
				r := mirror.Rejoin(cur, backend)
				return r.Meta, r.Joined
			})
		}
		if err != nil {
			f.log.Warn("a returning copy cannot rejoin; retrying", "queue", id.Name, "vhost", id.VHost, "backend", backend, "err", err)
			continue
		}
		delete(queues, id)
		f.log.Info("copy rejoined as the youngest slave, purged", "queue", id.Name, "vhost", id.VHost, "backend", backend)
	}
}

// handleEvent applies a backend event: a loss at once, a return only after
// a loss this engine saw.
func (f *failover) handleEvent(ev controllink.Event) {
	switch ev.State {
	case controllink.Down:
		queues := f.lost[ev.Backend]
		if queues == nil {
			queues = make(map[mirror.QueueID]bool)
			f.lost[ev.Backend] = queues
		}
		for _, m := range f.store.List() {
			if m.Holds(ev.Backend) {
				queues[m.ID] = true
			}
		}
		f.backendLost(ev)
	case controllink.Up:
		delete(f.outvoted, ev.Backend)
		f.retryRejoins()
	}
}

// retryRejoins lets the copies on backends that are up again rejoin, also
// those that could not at the backend's return.
func (f *failover) retryRejoins() {
	for b, queues := range f.lost {
		if !f.liveness.up(b) {
			continue
		}
		f.backendBack(b, queues)
		if len(queues) == 0 {
			delete(f.lost, b)
		}
	}
}

// ownCopiesDelay is how long a cluster proxy that starts lets its copy
// of the log catch up with the leader before it looks at its own node's
// slaves.
const ownCopiesDelay = 3 * time.Second

// ownCopiesCheck is the state of checkOwnCopies, owned by the loop.
type ownCopiesCheck struct {
	first time.Time // the loop's first tick
	// atStart are this node's unsynchronised slaves at the first tick: a
	// slave added later was purged by whoever added it, and may be syncing
	// by the time the check runs.
	atStart map[mirror.QueueID]bool
	done    bool
}

// checkOwnCopies makes a cluster proxy that starts treat its own node's
// unsynchronised slaves as copies that come back: they missed what
// happened while this node was down (its broker, or this proxy that trims
// them), so they rejoin purged (backendBack) as soon as the backend is up.
// Only the proxy beside a backend lets its copies rejoin, and a proxy
// that was down saw no loss to remember. It takes the slaves unsynchronised
// at its first tick with a leader (serve starts the engine once its log
// caught up) and lets those still unsynchronised rejoin a few seconds
// later; a slave added since was purged by whoever added it, and may be
// synchronising by then.
func (f *failover) checkOwnCopies() {
	c := &f.ownCopies
	if c.done || !f.roles.clustered || f.roles.node == "" {
		return
	}
	if c.first.IsZero() {
		if leader, _ := f.store.Leader(); leader == "" {
			return
		}
		c.first = time.Now()
		c.atStart = f.ownUnsynchronised()
	}
	if time.Since(c.first) < ownCopiesDelay {
		return
	}
	c.done = true
	queues := f.lost[f.roles.node]
	for _, m := range f.store.List() {
		if !c.atStart[m.ID] {
			continue
		}
		if i := m.SlaveIndex(f.roles.node); i >= 0 && !m.Slaves[i].Synchronised {
			if queues == nil {
				queues = make(map[mirror.QueueID]bool)
				f.lost[f.roles.node] = queues
			}
			queues[m.ID] = true
		}
	}
	if len(queues) > 0 {
		f.log.Info("this node's unsynchronised slaves rejoin, purged", "queues", len(queues))
	}
	f.buryMissedDeletes()
}

// ownUnsynchronised returns the queues with an unsynchronised slave on
// this node.
func (f *failover) ownUnsynchronised() map[mirror.QueueID]bool {
	out := make(map[mirror.QueueID]bool)
	for _, m := range f.store.List() {
		if i := m.SlaveIndex(f.roles.node); i >= 0 && !m.Slaves[i].Synchronised {
			out[m.ID] = true
		}
	}
	return out
}

// buryMissedDeletes deletes the copies this node's broker kept of queues
// deleted while this proxy was down: the tombstones newer than what its
// log held at start that name this node. A copy it cannot delete now (the
// broker is not up yet) goes when a client names the queue (Resolve).
func (f *failover) buryMissedDeletes() {
	if !f.liveness.up(f.roles.node) {
		return
	}
	buried := 0
	for _, ts := range f.store.Tombstones() {
		if ts.Index <= f.store.OpenedAt() || !slices.Contains(ts.Backends, f.roles.node) {
			continue
		}
		if _, recorded := f.store.Get(ts.ID); recorded {
			continue // declared again since
		}
		if _, err := f.operator.buryCopies(ts.ID, []string{f.roles.node}); err != nil {
			f.log.Warn("cannot delete this node's copy of a queue deleted while it was down", "queue", ts.ID.Name, "vhost", ts.ID.VHost, "err", err)
			continue
		}
		buried++
	}
	if buried > 0 {
		f.log.Info("copies of queues deleted while this proxy was down are deleted", "queues", buried)
	}
}
