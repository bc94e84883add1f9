package engine

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
)

// A trimmer per slave copy, on the watcher's connection to the slave's
// backend in the queue's vhost. A trimmer lives as long as that
// connection: when the watcher reconnects (the backend went down and came
// back), the trimmer is replaced by one on the new connection.

// startTrimmers starts the missing trimmers of m's slaves on live
// backends.
func (e *Engine) startTrimmers(m mirror.QueueMeta) {
	for _, s := range m.Slaves {
		e.ensureTrimmer(m, s.Backend)
	}
}

// ensureTrimmer makes sure the slave on backend has a trimmer on the
// watcher's current connection to it.
func (e *Engine) ensureTrimmer(m mirror.QueueMeta, backend string) {
	if !e.roles.trimsHere(backend) {
		return // another node's proxy trims it (cluster.go)
	}
	conn, gen, err := e.operator.conn(backend, m.ID.VHost)
	if err != nil {
		e.stopTrimmer(m.ID, backend) // its connection is gone with the backend, or refused
		return
	}
	e.mu.RLock()
	var current *trimmerRun
	if qs := e.queues[m.ID]; qs != nil {
		current = qs.trimmers[backend]
	}
	e.mu.RUnlock()
	if current != nil && current.generation == gen {
		return
	}
	if current != nil {
		e.stopTrimmer(m.ID, backend)
	}
	t, err := controllink.StartTrimmer(conn, m.ID.Name, e.trimmerOptions(m))
	if replyCode(err) == amqp.NotFound {
		e.copyGone(m, backend)
		return
	}
	if err != nil {
		e.log.Warn("cannot trim a slave copy; retrying", "queue", m.ID.Name, "vhost", m.ID.VHost, "backend", backend, "err", err)
		return
	}
	e.mu.Lock()
	_, recorded := e.opts.Store.Get(m.ID)
	qs := e.stateLocked(m.ID)
	if old := qs.trimmers[backend]; old != nil || !recorded {
		// Someone else started one meanwhile, or the queue was deleted.
		e.mu.Unlock()
		t.Close()
		if !recorded {
			e.mu.Lock()
			if qs := e.queues[m.ID]; qs != nil && len(qs.trimmers) == 0 && qs.sync == nil {
				delete(e.queues, m.ID)
			}
			e.mu.Unlock()
		}
		return
	}
	qs.trimmers[backend] = &trimmerRun{t: t, generation: gen}
	e.mu.Unlock()
}

func (e *Engine) trimmerOptions(m mirror.QueueMeta) controllink.TrimmerOptions {
	o := e.opts.Trimmer
	o.Logger = e.opts.Logger.With("vhost", m.ID.VHost)
	// The trimmer gives back held messages once the queue's TTL has passed,
	// for the slave's broker to expire them as the master's does.
	args, err := amqpTable(m.Arguments)
	if err != nil {
		o.Logger.Warn("cannot decode the queue's arguments; its slave copies are trimmed without a message TTL", "queue", m.ID.Name, "err", err)
	}
	o.MessageTTL = controllink.QueueTTL(args)
	return o
}

// stopTrimmer stops the trimmer of the slave on backend, if any.
func (e *Engine) stopTrimmer(id mirror.QueueID, backend string) {
	e.mu.Lock()
	var tr *trimmerRun
	if qs := e.queues[id]; qs != nil {
		tr = qs.trimmers[backend]
		delete(qs.trimmers, backend)
		delete(qs.backlogs, backend)
	}
	e.mu.Unlock()
	if tr != nil {
		tr.t.Close()
	}
}

// trimmer returns the trimmer of the slave on backend, nil when none.
func (e *Engine) trimmer(id mirror.QueueID, backend string) *trimmerRun {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if qs := e.queues[id]; qs != nil {
		return qs.trimmers[backend]
	}
	return nil
}

// ensureTrimmers brings the trimmers in line with the metadata: one per
// slave on a live backend, on its current connection; none for queues or
// slaves the metadata no longer has (another proxy dropped them).
func (e *Engine) ensureTrimmers() {
	metas := e.opts.Store.List()
	byID := make(map[mirror.QueueID]mirror.QueueMeta, len(metas))
	for _, m := range metas {
		byID[m.ID] = m
		e.startTrimmers(m)
	}
	type stale struct {
		id      mirror.QueueID
		backend string
	}
	var stop, missing []stale
	var gone []mirror.QueueID
	now := time.Now()
	e.mu.Lock()
	for id, qs := range e.queues {
		m, ok := byID[id]
		if !ok && qs.sync == nil {
			gone = append(gone, id)
			continue
		}
		for b, tr := range qs.trimmers {
			switch {
			case m.SlaveIndex(b) < 0:
				stop = append(stop, stale{id, b})
			case tr.t.QueueMissing():
				missing = append(missing, stale{id, b})
			default:
				delete(qs.missing, b) // there again, or never gone
				if !tr.copiesUntil.IsZero() && now.After(tr.copiesUntil) {
					tr.copiesUntil = time.Time{}
					tr.t.ExpectCopies(false)
				}
			}
		}
	}
	e.mu.Unlock()
	for _, s := range stop {
		e.stopTrimmer(s.id, s.backend)
	}
	for _, id := range gone {
		e.stopQueue(id)
	}
	for _, s := range missing {
		e.copyGone(byID[s.id], s.backend)
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
func (e *Engine) copyGone(m mirror.QueueMeta, backend string) {
	e.mu.Lock()
	qs := e.stateLocked(m.ID)
	if qs.missing == nil {
		qs.missing = make(map[string]time.Time)
	}
	since, seen := qs.missing[backend]
	if !seen {
		qs.missing[backend] = time.Now()
	}
	e.mu.Unlock()
	if !seen || time.Since(since) < missingGrace || !e.liveness.live().Has(m.Master) {
		return
	}
	if _, recorded := e.opts.Store.Get(m.ID); !recorded {
		return
	}
	exists, err := e.operator.exists(m.Master, m.ID)
	if err != nil {
		return
	}
	if !exists {
		e.forget(m, "its master and a slave copy are gone")
		return
	}
	e.stopTrimmer(m.ID, backend)
	_, err = e.records.update(m.ID, func(cur mirror.QueueMeta) (mirror.QueueMeta, bool) {
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
		e.log.Warn("cannot record a slave whose copy is gone", "queue", m.ID.Name, "vhost", m.ID.VHost, "backend", backend, "err", err)
		return
	}
	e.log.Warn("a slave copy is gone; the slave leaves the record (the policy adds it again)", "queue", m.ID.Name, "vhost", m.ID.VHost, "backend", backend)
}
