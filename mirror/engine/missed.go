package engine

import (
	"sync"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// missedCopies collects the proxy's reports of slave copies that may lack
// a publish (Missed) until the background loop handles them.
type missedCopies struct {
	mu sync.Mutex
	// byBackend holds, per backend, the queues reported; all is set for a
	// backend an exchange publish may have missed (any queue there).
	byBackend map[string]*missedOn
}

type missedOn struct {
	all    bool
	queues map[mirror.QueueID]bool
}

func (m *missedCopies) add(backend string, queue *mirror.QueueID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byBackend == nil {
		m.byBackend = make(map[string]*missedOn)
	}
	on := m.byBackend[backend]
	if on == nil {
		on = &missedOn{queues: make(map[mirror.QueueID]bool)}
		m.byBackend[backend] = on
	}
	if queue == nil {
		on.all = true
		return
	}
	on.queues[*queue] = true
}

// keep puts back a backend's reports that take returned, merged with any
// made since.
func (m *missedCopies) keep(backend string, on *missedOn) {
	if on.all {
		m.add(backend, nil)
	}
	for q := range on.queues {
		m.add(backend, &q)
	}
}

func (m *missedCopies) take() map[string]*missedOn {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.byBackend
	m.byBackend = nil
	return out
}

// Missed records that the slave copy on backend of queue (of every queue
// with a slave there, when queue is nil) may lack a publish: the backend
// nacked it, a client's link to it broke before the backend confirmed it,
// or the proxy did not send it there because it counted the backend down.
// The background loop makes such a slave unsynchronised. It does not
// block: the proxy calls it from a link's read loop.
func (e *Engine) Missed(backend string, queue *mirror.QueueID) {
	e.missed.add(backend, queue)
	e.poke()
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
// not send it while it counted the backend down (TestSidecarPartition
// in CI: 91 messages the master held and such a slave lacked).
func (e *Engine) handleMissed() {
	reports := e.missed.take()
	if len(reports) == 0 {
		return
	}
	live := e.liveness.live()
	for backend, on := range reports {
		if !live.Has(backend) {
			e.missed.keep(backend, on)
			continue
		}
		for _, m := range e.opts.Store.List() {
			i := m.SlaveIndex(backend)
			if i < 0 || !m.Slaves[i].Synchronised || !on.all && !on.queues[m.ID] {
				continue
			}
			e.resyncSlave(m.ID, backend)
		}
	}
}

// resyncSlave turns the synchronised slave of queue id on backend into the
// youngest unsynchronised one whose copy is emptied before it is copied to
// again. Beside its trimmer (trimsHere) the copy is marked partial, which
// the next sync purges first; a slave another proxy trims is purged through
// that proxy before the record changes, so that its own sync never copies
// to it before the purge.
func (e *Engine) resyncSlave(id mirror.QueueID, backend string) {
	log := e.log.With("queue", id.Name, "vhost", id.VHost, "backend", backend)
	local := e.roles.trimsHere(backend)
	if !local {
		ctx, cancel := e.life.operation()
		err := e.purgeRemote(ctx, backend, id)
		cancel()
		if err != nil {
			log.Warn("a slave missed publishes and cannot be purged; trying again later", "err", err)
			e.missed.add(backend, &id)
			return
		}
	} else {
		e.syncs.cancelTo(id, backend) // it must not call the slave synchronised
		e.syncs.markPartial(id, []string{backend})
	}
	_, err := e.records.update(id, func(cur mirror.QueueMeta) (mirror.QueueMeta, bool) {
		if i := cur.SlaveIndex(backend); i < 0 || !cur.Slaves[i].Synchronised {
			return cur, false
		}
		r := mirror.Rejoin(cur, backend)
		return r.Meta, r.Joined
	})
	if err != nil {
		log.Warn("a slave missed publishes; cannot record it unsynchronised; trying again later", "err", err)
		e.missed.add(backend, &id)
		return
	}
	log.Warn("a slave missed publishes (nacked, a client's link to it broke before it confirmed, or not sent while its backend was counted down): no longer synchronised, it rejoined as the youngest slave")
}

// Holds reports whether the metadata counts backend as the master or a
// synchronised slave of queue, or with queue nil of any queue that has
// slaves (a queue alone on its backend has nothing the metadata could
// record about its loss). The proxy keeps a publish whose copy there was
// lost waiting until it does not: confirms never count fewer copies than
// the log, which a proxy cut off from the majority cannot change.
func (e *Engine) Holds(backend string, queue *mirror.QueueID) bool {
	holds := func(m mirror.QueueMeta) bool {
		if len(m.Slaves) == 0 {
			return false
		}
		if m.Master == backend {
			return true
		}
		i := m.SlaveIndex(backend)
		return i >= 0 && m.Slaves[i].Synchronised
	}
	if queue != nil {
		m, ok := e.Lookup(*queue)
		return ok && holds(m)
	}
	return e.view.anyQueue(holds)
}
