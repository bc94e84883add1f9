package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// `ctl drain BACKEND`: a controlled stop of one backend. Every queue
// mastered there is promoted as on the backend's clean shutdown
// (mirror.Promote with CauseShutdown, so ha-promote-on-shutdown decides,
// when-synced by default); every slave there leaves its queue's record and
// its copy is deleted; and until `ctl undrain BACKEND` the engine places no
// new master or slave there (Place and reconciler.all leave drained backends
// out of the live set they decide on).
//
// Which backends are drained is kept in this engine's memory only: a
// restart of the proxy forgets it (the backend is then placed on again),
// and in a sidecar cluster only the proxy that was asked knows it, so the
// other proxies may add slaves there again for queues they coordinate.
// The promotions themselves are in the metadata log like any.

// ErrUnknownBackend is Drain's and Undrain's answer for a backend that is
// not configured (wrapped).
var ErrUnknownBackend = errors.New("unknown backend")

// Roles of the drained backend in a queue, in DrainedQueue.Role.
const (
	RoleMaster = "master"
	RoleSlave  = "slave"
)

// DrainReport is what Drain did, one entry per queue that had a copy on
// the backend, in the order of the metadata log's listing.
type DrainReport struct {
	Backend string         `json:"backend"`
	Queues  []DrainedQueue `json:"queues"`
}

// DrainedQueue is what Drain did to one queue.
type DrainedQueue struct {
	ID mirror.QueueID `json:"id"`
	// Role is what the drained backend was: RoleMaster or RoleSlave.
	Role string `json:"role"`
	// To is the slave promoted in the master's place; "" when the master
	// stays (no synchronised slave under when-synced, no live slave) or
	// Role is slave.
	To string `json:"to,omitempty"`
	// Synchronised tells whether To was a synchronised slave; false under
	// ha-promote-on-shutdown always with none, which loses what only the
	// old master held.
	Synchronised bool `json:"synchronised,omitempty"`
	// Epoch is the queue's epoch afterwards.
	Epoch uint64 `json:"epoch"`
	// Reason is mirror.Promote's explanation for a master.
	Reason string `json:"reason,omitempty"`
	// Error is set when the change could not be recorded (in a cluster:
	// no leader); draining again retries it.
	Error string `json:"error,omitempty"`
}

// Moved reports whether the queue's master left the backend.
func (q DrainedQueue) Moved() bool { return q.Role == RoleMaster && q.To != "" && q.Error == "" }

// Kept reports whether the queue's master stays on the backend.
func (q DrainedQueue) Kept() bool { return q.Role == RoleMaster && q.To == "" && q.Error == "" }

// Dropped reports whether the backend's slave left the queue.
func (q DrainedQueue) Dropped() bool { return q.Role == RoleSlave && q.Error == "" }

// drainedSet is the set of drained backends; its zero value is empty.
type drainedSet struct {
	mu sync.Mutex
	m  map[string]bool
}

func (d *drainedSet) set(backend string, drained bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = make(map[string]bool)
	}
	if drained {
		d.m[backend] = true
	} else {
		delete(d.m, backend)
	}
}

func (d *drainedSet) has(backend string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m[backend]
}

// list returns the drained backends, sorted.
func (d *drainedSet) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.m))
	for b := range d.m {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}

// Drained returns the drained backends, sorted.
func (e *Engine) Drained() []string { return e.liveness.drained.list() }

// Drain stops placing copies on backend and moves every queue off it: the
// masters there are promoted per ha-promote-on-shutdown (the epoch rises),
// the slaves there leave their queues' records and their copies are
// deleted. A master with no synchronised slave under when-synced stays
// and is reported; draining again after its slaves synchronised moves it.
// The old masters' copies stay on the broker: clients may still consume
// from them until the proxy moves them (it follows the new master by
// itself); such a copy is purged before it is a slave again.
//
// Changes that could not be recorded are in the report (Error); the call
// fails only for an unknown backend or when ctx ends.
func (e *Engine) Drain(ctx context.Context, backend string) (DrainReport, error) {
	if err := e.liveness.configured(backend); err != nil {
		return DrainReport{}, err
	}
	report, err := e.drainer.drain(ctx, backend)
	if err != nil {
		return report, err
	}
	e.poke() // exactly: replacements for the dropped slaves
	return report, nil
}

// drainer carries out Drain: promotions away from a backend and the
// removal of its slaves. The drained set itself is liveness's; drainer
// keeps no state.
type drainer struct {
	store    *store.Store
	records  *recorder
	liveness *liveness
	trimmers *trimmers
	syncs    *syncs
	operator *operator
	policies *config.PolicyStore
	log      *slog.Logger
	metrics  *counters
}

// drain is Drain on a configured backend, but for waking the loop.
func (d *drainer) drain(ctx context.Context, backend string) (DrainReport, error) {
	// Drained first, so that no reconcile from now on adds a slave there.
	d.liveness.drained.set(backend, true)
	d.log.Info("draining backend", "backend", backend)
	report := DrainReport{Backend: backend, Queues: []DrainedQueue{}}
	// A reconcile that decided before the backend was drained can still
	// record a slave there after the first pass looked at its queue: the
	// second pass drops it.
	for range 2 {
		for _, m := range d.store.List() {
			if err := ctx.Err(); err != nil {
				return report, err
			}
			var q DrainedQueue
			switch {
			case m.Master == backend:
				if i := slices.IndexFunc(report.Queues, func(d DrainedQueue) bool { return d.ID == m.ID }); i >= 0 {
					continue // kept in the first pass; said once
				}
				q = d.master(m.ID, backend)
			case m.SlaveIndex(backend) >= 0:
				q = d.slave(m.ID, backend)
			default:
				continue
			}
			report.Queues = append(report.Queues, q)
		}
	}
	return report, nil
}

// master promotes a slave of the queue in backend's place.
func (d *drainer) master(id mirror.QueueID, backend string) DrainedQueue {
	def, _ := definition(d.policies, id)
	live := d.liveness.placeable()
	delete(live, backend)
	q := DrainedQueue{ID: id, Role: RoleMaster}
	var p mirror.Promotion
	meanwhile := false
	written, err := d.records.update(id, func(m mirror.QueueMeta) (mirror.QueueMeta, bool) {
		if m.Master != backend {
			meanwhile = true // by another proxy of a cluster, or a failover
			return m, false
		}
		p = mirror.Promote(m, live, mirror.CauseShutdown, def)
		return p.Meta, p.Promoted()
	})
	log := d.log.With("queue", id.Name, "vhost", id.VHost)
	q.To, q.Synchronised, q.Reason, q.Epoch = p.To, p.Synchronised, p.Reason, written.Epoch
	switch {
	case err != nil:
		q.To, q.Error = "", err.Error()
		log.Warn("drain: cannot record a promotion", "from", backend, "err", err)
	case meanwhile:
		q.To, q.Reason = written.Master, fmt.Sprintf("master %s already replaced by %s", backend, written.Master)
	case !p.Promoted():
		log.Warn("drain: master stays", "master", backend, "reason", p.Reason)
	default:
		// The new master's copy was a slave: its trimmer gives back what it
		// held, so clients find every message there. A sync running from
		// the old master or into the new one stops; the loop starts the
		// next one from the new master.
		d.metrics.promoted(causeDrain, p.Synchronised, time.Time{})
		d.trimmers.stop(id, p.To)
		d.syncs.stop(id)
		log.Warn("drain: slave promoted", "from", backend, "to", p.To, "epoch", written.Epoch,
			"synchronised", p.Synchronised, "loses_messages", p.LosesMessages(), "cause", mirror.CauseShutdown.String())
	}
	return q
}

// slave drops the backend's slave from the queue's record, then stops
// its trimmer and deletes its copy.
func (d *drainer) slave(id mirror.QueueID, backend string) DrainedQueue {
	q := DrainedQueue{ID: id, Role: RoleSlave}
	d.syncs.cancelTo(id, backend)
	written, err := d.records.update(id, func(m mirror.QueueMeta) (mirror.QueueMeta, bool) {
		i := m.SlaveIndex(backend)
		if i < 0 {
			return m, false
		}
		m = m.Clone()
		m.Slaves = slices.Delete(m.Slaves, i, i+1)
		if len(m.Slaves) == 0 {
			m.Slaves = nil
		}
		return m, true
	})
	q.Epoch = written.Epoch
	log := d.log.With("queue", id.Name, "vhost", id.VHost, "backend", backend)
	if err != nil {
		q.Error = err.Error()
		log.Warn("drain: cannot record a dropped slave", "err", err)
		return q
	}
	// Deleted only now that the record no longer names it. In a cluster the
	// trimmer is on the proxy beside the backend, which stops it when it
	// sees the record.
	d.trimmers.stop(id, backend)
	if err := d.operator.deleteCopy(backend, id); err != nil {
		log.Warn("drain: slave dropped; cannot delete its copy", "err", err)
	} else {
		log.Info("drain: slave dropped, copy deleted")
	}
	return q
}

// Undrain lets the engine place masters and slaves on backend again; the
// policies' slaves come back at the next reconcile (purged, then
// synchronised per ha-sync-mode). Masters that moved stay where they are.
func (e *Engine) Undrain(ctx context.Context, backend string) error {
	if err := e.liveness.configured(backend); err != nil {
		return err
	}
	e.liveness.drained.set(backend, false)
	e.log.Info("backend undrained", "backend", backend)
	e.poke()
	return nil
}
