package engine

import (
	"errors"
	"log/slog"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// The background work of the engine's loop: every queue against its
// policy (mirror.Reconcile, carried out here), masters that deleted
// themselves, and the backlogs of slaves that never synced.

// reconcileAll reconciles every recorded queue with its effective policy.
// Reconcile is pure and cheap, so every queue is looked at every time; only
// a plan that changes something touches a backend.
func (e *Engine) reconcileAll() {
	// Drained backends count as down here: no slave is added there, and a
	// master kept there is left alone until undrain (drain.go); so do the
	// backends that refuse the proxy's account in the queue's vhost.
	placeable := make(map[string]mirror.LiveSet)
	for _, m := range e.opts.Store.List() {
		if e.ctx.Err() != nil {
			return
		}
		live, ok := placeable[m.ID.VHost]
		if !ok {
			live = e.liveness.placeableIn(m.ID.VHost)
			placeable[m.ID.VHost] = live
		}
		def, _ := definition(e.opts.Policies, m.ID)
		plan := mirror.Reconcile(m, def, e.backends, live)
		if plan.Changed() {
			if e.roles.coordinates(m) {
				e.carryOut(m, plan, def)
			}
			continue
		}
		if sync := e.roles.syncTargets(plan.Sync, e.liveness.live()); len(sync) > 0 {
			e.syncs.start(m.ID, sync, def, false)
		}
	}
}

// carryOut carries out a plan in the order Plan documents: declare the new
// copies, record, start trimming and syncing them, and delete dropped
// copies last, once the metadata no longer names them.
func (e *Engine) carryOut(read mirror.QueueMeta, plan mirror.Plan, def config.Definition) {
	log := e.log.With("queue", read.ID.Name, "vhost", read.ID.VHost)
	for _, b := range plan.Add {
		err := e.operator.declareCopy(b, plan.Meta)
		if err == nil {
			// A new slave starts empty: a copy left there (an old master
			// back after a promotion, a slave dropped while its backend
			// was down) is stale.
			err = e.operator.purgeCopy(b, plan.Meta.ID)
		}
		if err != nil {
			log.Warn("cannot add a slave; retrying later", "backend", b, "err", err)
			return
		}
	}
	ctx, cancel := e.life.operation()
	written, err := e.opts.Writer.Put(ctx, plan.Meta, read.Version)
	cancel()
	if err != nil {
		// A conflict means someone changed the queue meanwhile: the next
		// round decides again on what they wrote.
		level := slog.LevelWarn
		if errors.Is(err, store.ErrConflict) {
			level = slog.LevelDebug
		}
		log.Log(e.ctx, level, "cannot record a policy change; retrying later", "err", err)
		return
	}
	e.view.noteWrite(written)
	if len(plan.Add) > 0 {
		log.Info("slaves added", "backends", plan.Add, "slaves", written.Backends()[1:])
	}
	if plan.HandOver.To != "" {
		// The new master's copy was a slave: its trimmer gives back what
		// it held, so clients find every message there.
		e.trimmers.stop(written.ID, plan.HandOver.To)
		log.Info("master handed over", "from", plan.HandOver.From, "to", plan.HandOver.To, "epoch", written.Epoch)
	}
	for _, b := range plan.Add {
		e.trimmers.ensure(written, b)
	}
	if sync := e.roles.syncTargets(plan.Sync, e.liveness.live()); len(sync) > 0 {
		e.syncs.start(written.ID, sync, def, false)
	} else if len(plan.Add) > 0 {
		// A slave that joins an empty queue is synchronised at once.
		e.checkBacklog(written)
	}
	for _, b := range plan.Drop {
		e.trimmers.stop(written.ID, b)
		if err := e.operator.deleteCopy(b, written.ID); err != nil {
			log.Warn("cannot delete a dropped copy", "backend", b, "err", err)
			continue
		}
		log.Info("copy dropped", "backend", b)
	}
}

// checkExpired finds queues whose master deleted itself (auto-delete after
// its last consumer went, x-expires) and removes their slaves and record.
func (e *Engine) checkExpired() {
	live := e.liveness.live()
	for _, m := range e.opts.Store.List() {
		if !m.AutoDelete && !hasKey(m.Arguments, "x-expires") || !live.Has(m.Master) || !e.roles.coordinates(m) {
			continue
		}
		if ok, err := e.operator.exists(m.Master, m.ID); ok || err != nil {
			continue
		}
		e.forget(m, "its master deleted itself")
	}
}

// forget removes a queue whose master is gone: its slaves' copies and its
// record.
func (e *Engine) forget(m mirror.QueueMeta, why string) {
	e.stopQueue(m.ID)
	for _, s := range m.Slaves {
		if err := e.operator.deleteCopy(s.Backend, m.ID); err != nil {
			e.log.Warn("cannot delete a slave copy", "queue", m.ID.Name, "vhost", m.ID.VHost, "backend", s.Backend, "err", err)
		}
	}
	ctx, cancel := e.life.operation()
	defer cancel()
	if err := e.opts.Writer.Delete(ctx, m.ID, m.Version); err != nil {
		e.log.Warn("cannot remove a queue's record", "queue", m.ID.Name, "vhost", m.ID.VHost, "err", err)
		return
	}
	e.view.noteDelete(m.ID)
	e.log.Info("queue forgotten", "queue", m.ID.Name, "vhost", m.ID.VHost, "why", why)
}

// checkBacklogs marks never-synced slaves synchronised once the master's
// backlog at their join is gone. It asks the master with a passive declare,
// which RabbitMQ counts as a use of the queue: queues with x-expires are
// left out, or the check would keep them alive for ever (their slaves
// synchronise by sync_queue or ha-sync-mode automatic).
func (e *Engine) checkBacklogs() {
	for _, m := range e.opts.Store.List() {
		if e.ctx.Err() != nil {
			return
		}
		if len(m.SynchronisedSlaves()) < len(m.Slaves) {
			e.checkBacklog(m)
		}
	}
}

// checkBacklog checks the unsynchronised slaves of one queue (mirror.Backlog):
// the backlog is the master's message count when the engine first looks at
// the slave, and is settled by the settlements the slave's trimmer missed
// (the messages it never had). A priority queue delivers out of order, so
// only an empty master counts there.
func (e *Engine) checkBacklog(m mirror.QueueMeta) {
	live := e.liveness.live()
	if !live.Has(m.Master) || hasKey(m.Arguments, "x-expires") {
		return
	}
	if e.syncs.running(m.ID) != nil {
		return
	}
	q, err := e.operator.inspect(m.Master, m.ID)
	if err != nil {
		return
	}
	priority := hasKey(m.Arguments, "x-max-priority")
	for _, s := range m.Slaves {
		if s.Synchronised || !live.Has(s.Backend) {
			continue
		}
		tr := e.trimmers.get(m.ID, s.Backend)
		if tr == nil {
			continue
		}
		missed := tr.t.Missed()
		bl := e.trimmers.backlog(m.ID, s.Backend, q.Messages, missed)
		b := mirror.Backlog{Held: bl.held, Settled: missed - bl.missedBase}
		if priority {
			b.Settled = 0
			b.Held = max(b.Held, 1)
		}
		if b.CaughtUp(q.Messages == 0) {
			if err := e.records.markSlave(m.ID, s.Backend, true); err != nil {
				e.log.Warn("cannot record a caught-up slave", "queue", m.ID.Name, "backend", s.Backend, "err", err)
			}
		}
	}
}
