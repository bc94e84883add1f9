package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// The background work of the engine's loop: every queue against its
// policy (mirror.Reconcile, carried out here), masters that deleted
// themselves, and the backlogs of slaves that never synced.

// reconciler does the loop's work on every queue: it carries out the
// policies' plans, keeps the trimmers in line with the records, forgets
// queues whose master deleted itself, marks caught-up slaves synchronised
// and handles the copies the proxy reported short of a publish (missed,
// the one state it owns). It runs on the loop's goroutine, except
// stopQueue (Engine.Deleted), purgeRemote (Engine.Purged) and copyGone
// (a trimmer that cannot start). It needs most of the engine's parts,
// each through its own narrow pointer.
type reconciler struct {
	store    *store.Store
	records  *recorder
	trimmers *trimmers
	syncs    *syncs
	liveness *liveness
	operator *operator
	policies *config.PolicyStore
	peers    Peers // nil for one proxy alone
	roles    roles
	backends []string
	log      *slog.Logger
	life     lifetime
	// missed are the slave copies the proxy reported short of a publish
	// (Engine.Missed, missed.go).
	missed missedCopies
	// held says, per queue of a vhost, what the proxies hold of its
	// messages (listing.held); an error when a proxy did not answer. Set
	// once at New.
	held func(ctx context.Context, vhost string) (map[mirror.QueueID]mirror.Held, error)
}

// all reconciles every recorded queue with its effective policy.
// Reconcile is pure and cheap, so every queue is looked at every time; only
// a plan that changes something touches a backend.
func (r *reconciler) all() {
	// Drained backends count as down here: no slave is added there, and a
	// master kept there is left alone until undrain (drain.go); so do the
	// backends that refuse the proxy's account in the queue's vhost.
	placeable := make(map[string]mirror.LiveSet)
	for _, m := range r.store.List() {
		if r.life.ctx.Err() != nil {
			return
		}
		live, ok := placeable[m.ID.VHost]
		if !ok {
			live = r.liveness.placeableIn(m.ID.VHost)
			placeable[m.ID.VHost] = live
		}
		def, _ := definition(r.policies, m.ID)
		plan := mirror.Reconcile(m, def, r.backends, live)
		if plan.Changed() {
			if r.roles.coordinates(m) {
				r.carryOut(m, plan, def)
			}
			continue
		}
		if sync := r.roles.syncTargets(plan.Sync, r.liveness.live()); len(sync) > 0 {
			r.syncs.start(m.ID, sync, def, false)
		}
	}
}

// carryOut carries out a plan in the order Plan documents: declare the new
// copies, record, start trimming and syncing them, and delete dropped
// copies last, once the metadata no longer names them.
func (r *reconciler) carryOut(read mirror.QueueMeta, plan mirror.Plan, def config.Definition) {
	log := r.log.With("queue", read.ID.Name, "vhost", read.ID.VHost)
	for _, b := range plan.Add {
		err := r.operator.declareCopy(b, plan.Meta)
		if err == nil {
			// A new slave starts empty: a copy left there (an old master
			// back after a promotion, a slave dropped while its backend
			// was down) is stale.
			err = r.operator.purgeCopy(b, plan.Meta.ID)
		}
		if err != nil {
			log.Warn("cannot add a slave; retrying later", "backend", b, "err", err)
			return
		}
	}
	ctx, cancel := r.life.operation()
	written, err := r.records.put(ctx, plan.Meta, read.Version)
	cancel()
	if err != nil {
		// A conflict means someone changed the queue meanwhile: the next
		// round decides again on what they wrote.
		level := slog.LevelWarn
		if errors.Is(err, store.ErrConflict) {
			level = slog.LevelDebug
		}
		log.Log(r.life.ctx, level, "cannot record a policy change; retrying later", "err", err)
		return
	}
	if len(plan.Add) > 0 {
		log.Info("slaves added", "backends", plan.Add, "slaves", written.Backends()[1:])
	}
	if plan.HandOver.To != "" {
		// The new master's copy was a slave: its trimmer gives back what
		// it held, so clients find every message there.
		r.trimmers.stop(written.ID, plan.HandOver.To)
		log.Info("master handed over", "from", plan.HandOver.From, "to", plan.HandOver.To, "epoch", written.Epoch)
	}
	for _, b := range plan.Add {
		r.trimmers.ensure(written, b)
	}
	if sync := r.roles.syncTargets(plan.Sync, r.liveness.live()); len(sync) > 0 {
		r.syncs.start(written.ID, sync, def, false)
	} else if len(plan.Add) > 0 {
		// A slave that joins an empty queue is synchronised at once.
		r.checkBacklogsOf([]mirror.QueueMeta{written})
	}
	for _, b := range plan.Drop {
		r.trimmers.stop(written.ID, b)
		if err := r.operator.deleteCopy(b, written.ID); err != nil {
			log.Warn("cannot delete a dropped copy", "backend", b, "err", err)
			continue
		}
		log.Info("copy dropped", "backend", b)
	}
}

// checkExpired finds queues whose master deleted itself (auto-delete after
// its last consumer went, x-expires) and removes their slaves and record.
func (r *reconciler) checkExpired() {
	live := r.liveness.live()
	for _, m := range r.store.List() {
		if !m.AutoDelete && !hasKey(m.Arguments, "x-expires") || !live.Has(m.Master) || !r.roles.coordinates(m) {
			continue
		}
		if ok, err := r.operator.exists(m.Master, m.ID); ok || err != nil {
			continue
		}
		r.forget(m, "its master deleted itself")
	}
}

// forget removes a queue whose master is gone: its slaves' copies and its
// record.
func (r *reconciler) forget(m mirror.QueueMeta, why string) {
	r.stopQueue(m.ID)
	for _, s := range m.Slaves {
		if err := r.operator.deleteCopy(s.Backend, m.ID); err != nil {
			r.log.Warn("cannot delete a slave copy", "queue", m.ID.Name, "vhost", m.ID.VHost, "backend", s.Backend, "err", err)
		}
	}
	ctx, cancel := r.life.operation()
	defer cancel()
	if err := r.records.remove(ctx, m.ID, m.Version); err != nil {
		r.log.Warn("cannot remove a queue's record", "queue", m.ID.Name, "vhost", m.ID.VHost, "err", err)
		return
	}
	r.log.Info("queue forgotten", "queue", m.ID.Name, "vhost", m.ID.VHost, "why", why)
}

// checkBacklogs marks never-synced slaves synchronised once the master's
// backlog at their join is settled (checkBacklog).
func (r *reconciler) checkBacklogs() { r.checkBacklogsOf(r.store.List()) }

// checkBacklogsOf checks the queues of metas that have a slave waiting
// for its backlog here, a vhost at a time. The master's ready count says
// nothing while a copy from the master (a sync, run by any proxy) holds
// its messages: the master looks empty, and a slave called caught up then
// lacks the whole backlog. So what the proxies hold is asked before and
// after the masters are looked at, and a queue whose copies began or
// ended in between, or still run, waits for a later round.
func (r *reconciler) checkBacklogsOf(metas []mirror.QueueMeta) {
	byVHost := make(map[string][]mirror.QueueMeta)
	for _, m := range metas {
		if r.awaitsBacklog(m) {
			byVHost[m.ID.VHost] = append(byVHost[m.ID.VHost], m)
		}
	}
	for vhost, waiting := range byVHost {
		if r.life.ctx.Err() != nil {
			return
		}
		before, err := r.held(r.life.ctx, vhost)
		if err != nil {
			continue // decided in a later round, with every proxy's count
		}
		ready := make(map[mirror.QueueID]int, len(waiting))
		for _, m := range waiting {
			if q, err := r.operator.inspect(m.Master, m.ID); err == nil {
				ready[m.ID] = q.Messages
			}
		}
		after, err := r.held(r.life.ctx, vhost)
		if err != nil {
			continue
		}
		for _, m := range waiting {
			n, looked := ready[m.ID]
			copies := after[m.ID].Copies
			if !looked || copies != before[m.ID].Copies || copies.Running() {
				continue
			}
			// A consumer's unacknowledged messages are not in the broker's
			// count, yet the slave lacks them too: an empty-looking master
			// may have every message out with its consumers.
			r.checkBacklog(m, n+max(before[m.ID].Unacked, after[m.ID].Unacked))
		}
	}
}

// awaitsBacklog reports whether the queue has a slave that waits here for
// its backlog: under ha-sync-mode manual, unsynchronised, on a live
// backend, trimmed by this proxy, with the master live and no sync of the
// queue running here. The master is asked with a passive declare, which
// RabbitMQ counts as a use of the queue: queues with x-expires are left
// out, or the check would keep them alive for ever (their slaves
// synchronise by sync_queue or ha-sync-mode automatic).
func (r *reconciler) awaitsBacklog(m mirror.QueueMeta) bool {
	if len(m.SynchronisedSlaves()) == len(m.Slaves) {
		return false
	}
	live := r.liveness.live()
	if !live.Has(m.Master) || hasKey(m.Arguments, "x-expires") || r.syncs.running(m.ID) != nil {
		return false
	}
	// Under ha-sync-mode automatic the sync marks the slave once it copied
	// what the master holds. The backlog is manual mode's approximation: it
	// could call the slave synchronised while clients hold messages it lacks.
	if def, _ := definition(r.policies, m.ID); mirror.AutomaticSync(def) {
		return false
	}
	for _, s := range m.Slaves {
		if !s.Synchronised && live.Has(s.Backend) && r.trimmers.get(m.ID, s.Backend) != nil {
			return true
		}
	}
	return false
}

// checkBacklog checks the unsynchronised slaves of one queue under
// ha-sync-mode manual (mirror.Backlog): the backlog is what the master
// holds when the engine first looks at the slave (held: its ready messages
// and those the proxies' clients hold unacknowledged), and is settled by
// the settlements the slave's trimmer missed (the messages it never had).
// A priority queue delivers out of order, so only an empty master counts
// there.
func (r *reconciler) checkBacklog(m mirror.QueueMeta, held int) {
	live := r.liveness.live()
	priority := hasKey(m.Arguments, "x-max-priority")
	for _, s := range m.Slaves {
		if s.Synchronised || !live.Has(s.Backend) {
			continue
		}
		tr := r.trimmers.get(m.ID, s.Backend)
		if tr == nil {
			continue
		}
		missed := tr.t.Missed()
		bl := r.trimmers.backlog(m.ID, s.Backend, held, missed)
		b := mirror.Backlog{Held: bl.held, Settled: missed - bl.missedBase}
		if priority {
			b.Settled = 0
			b.Held = max(b.Held, 1)
		}
		if b.CaughtUp(held == 0) {
			// On the loop's goroutine: a short question, asked again next round.
			if err := r.syncs.reachedByEveryProxy(r.life.ctx, s.Backend, countDownTimeout); err != nil {
				continue // a proxy that counts it down sends it nothing
			}
			if err := r.records.markSlave(m.ID, s.Backend, true); err != nil {
				r.log.Warn("cannot record a caught-up slave", "queue", m.ID.Name, "backend", s.Backend, "err", err)
			}
		}
	}
}

// ensureTrimmers brings the trimmers in line with the metadata: one per
// slave on a live backend, on its current connection; none for queues or
// slaves the metadata no longer has (another proxy dropped them).
func (r *reconciler) ensureTrimmers() {
	metas := r.store.List()
	byID := make(map[mirror.QueueID]mirror.QueueMeta, len(metas))
	for _, m := range metas {
		byID[m.ID] = m
		r.trimmers.startAll(m)
	}
	stale, missing, unrecorded := r.trimmers.sweep(byID, time.Now())
	unrecorded = append(unrecorded, r.syncs.idle(byID)...)
	for _, ref := range stale {
		r.trimmers.stop(ref.id, ref.backend)
	}
	for _, id := range unrecorded {
		if r.syncs.running(id) != nil {
			// Its trimmers go (the records have no slave), the sync ends
			// by itself.
			for _, b := range r.trimmers.backends(id) {
				r.trimmers.stop(id, b)
			}
			continue
		}
		r.stopQueue(id)
	}
	for _, ref := range missing {
		r.copyGone(byID[ref.id], ref.backend)
	}
}

// missingGrace is how long a slave copy must be missing before the engine
// acts on it. A client's queue.delete removes every copy and then tells
// the engine (Deleted); a trimmer sees its copy go in between, and acting
// at once would declare the copy again behind the client's back.
const missingGrace = 5 * time.Second

// copyGone handles a slave copy that is gone (someone deleted it on its
// broker, or a client deleted the queue and the proxy has not said so
// yet). Once it has been gone for missingGrace: when the master is gone
// too (it deleted itself, or was deleted past the proxy) the queue is
// forgotten; otherwise the slave leaves the record, and the policy adds it
// again like any new slave (declared, empty, synchronised per ha-sync-mode).
func (r *reconciler) copyGone(m mirror.QueueMeta, backend string) {
	since, seen := r.trimmers.markMissing(m.ID, backend)
	if !seen || time.Since(since) < missingGrace || !r.liveness.live().Has(m.Master) {
		return
	}
	if _, recorded := r.store.Get(m.ID); !recorded {
		return
	}
	exists, err := r.operator.exists(m.Master, m.ID)
	if err != nil {
		return
	}
	if !exists {
		r.forget(m, "its master and a slave copy are gone")
		return
	}
	r.trimmers.stop(m.ID, backend)
	_, err = r.records.update(m.ID, func(cur mirror.QueueMeta) (mirror.QueueMeta, bool) {
		i := cur.SlaveIndex(backend)
		if i < 0 {
			return cur, false
		}
		cur = cur.Clone()
		cur.Slaves = append(cur.Slaves[:i], cur.Slaves[i+1:]...)
		if len(cur.Slaves) == 0 {
			cur.Slaves = nil
		}
		return cur, true
	})
	if err != nil {
		r.log.Warn("cannot record a slave whose copy is gone", "queue", m.ID.Name, "vhost", m.ID.VHost, "backend", backend, "err", err)
		return
	}
	r.log.Warn("a slave copy is gone; the slave leaves the record (the policy adds it again)", "queue", m.ID.Name, "vhost", m.ID.VHost, "backend", backend)
}

// stopQueue stops what the engine runs for a queue (trimmers, sync) and
// forgets it.
func (r *reconciler) stopQueue(id mirror.QueueID) {
	runs := r.trimmers.forget(id)
	if run := r.syncs.forget(id); run != nil {
		run.cancel()
		<-run.done
	}
	for _, tr := range runs {
		tr.t.Close()
	}
}

// handleMissed makes every reported synchronised slave rejoin as the
// youngest unsynchronised slave (mirror.Rejoin), as a RabbitMQ mirror that
// lost messages restarts as a new mirror: it no longer counts towards
// confirms or as a promotion candidate, and it synchronises again (at once
// with ha-sync-mode automatic). The reports of a backend counted down wait
// until it is up again: usually its loss is recorded meanwhile (its slaves
// rejoin purged when it is back, unsynchronised, and the report finds
// nothing to do), but a loss this proxy did not record (it was paused in a
// minority, and the backend was back before it served again) leaves the
// slave synchronised in the log, without the publishes this proxy could
// not send it while it counted the backend down.
func (r *reconciler) handleMissed() {
	reports := r.missed.take()
	if len(reports) == 0 {
		return
	}
	live := r.liveness.live()
	for backend, on := range reports {
		if !live.Has(backend) {
			r.missed.keep(backend, on)
			continue
		}
		for _, m := range r.store.List() {
			i := m.SlaveIndex(backend)
			if i < 0 || !m.Slaves[i].Synchronised || !on.all && !on.queues[m.ID] {
				continue
			}
			r.resyncSlave(m.ID, backend)
		}
	}
}

// resyncSlave turns the synchronised slave of queue id on backend into the
// youngest unsynchronised one whose copy is emptied before it is copied to
// again. Beside its trimmer (trimsHere) the copy is marked partial, which
// the next sync purges first; a slave another proxy trims is purged through
// that proxy before the record changes, so that its own sync never copies
// to it before the purge.
func (r *reconciler) resyncSlave(id mirror.QueueID, backend string) {
	log := r.log.With("queue", id.Name, "vhost", id.VHost, "backend", backend)
	local := r.roles.trimsHere(backend)
	if !local {
		ctx, cancel := r.life.operation()
		err := r.purgeRemote(ctx, backend, id)
		cancel()
		if err != nil {
			log.Warn("a slave missed publishes and cannot be purged; trying again later", "err", err)
			r.missed.add(backend, &id)
			return
		}
	} else {
		r.syncs.cancelTo(id, backend) // it must not call the slave synchronised
		r.syncs.markPartial(id, []string{backend})
	}
	_, err := r.records.update(id, func(cur mirror.QueueMeta) (mirror.QueueMeta, bool) {
		if i := cur.SlaveIndex(backend); i < 0 || !cur.Slaves[i].Synchronised {
			return cur, false
		}
		rejoin := mirror.Rejoin(cur, backend)
		return rejoin.Meta, rejoin.Joined
	})
	if err != nil {
		log.Warn("a slave missed publishes; cannot record it unsynchronised; trying again later", "err", err)
		r.missed.add(backend, &id)
		return
	}
	log.Warn("a slave missed publishes (nacked, a client's link to it broke before it confirmed, or not sent while its backend was counted down): no longer synchronised, it rejoined as the youngest slave")
}

// purgeRemote empties a slave copy another node's proxy trims, through
// that proxy; when it cannot be asked (it is down, and its trimmer's
// messages are back in the copy) the copy is purged directly.
func (r *reconciler) purgeRemote(ctx context.Context, backend string, id mirror.QueueID) error {
	err := r.peers.PurgeSlave(ctx, backend, id)
	if err == nil {
		return nil
	}
	r.log.Warn("the proxy beside a slave could not purge it; purging it directly", "queue", id.Name, "vhost", id.VHost, "backend", backend, "err", err)
	return r.operator.purgeCopy(backend, id)
}
