package engine

import (
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Settles can come before the trimmer they are for: the proxy beside a
// new queue's slave starts its trimmer once its copy of the metadata log
// has the record (and logChangeCoalesce has passed), while the master's
// clients ack from the first message on, and a trimmer replaced on the
// watcher's new connection is gone for a moment too. A settle with no trimmer to take it would leave
// its message on the slave, to come back (redelivered) after a promotion
// although it was acked. So the settles of a slave copy this proxy trims
// whose trimmer is not running wait for it, at most earlyCap of them per
// copy (about 300 KiB) and for earlyKeep: a trimmer that cannot start for
// longer (its backend refuses the proxy's account) is a copy the engine
// stops counting on anyway.

const (
	// earlyCap bounds the settles waiting for one slave copy's trimmer.
	earlyCap = 1 << 14
	// earlyKeep is how long settles wait for a trimmer: many times the
	// engine's Interval, within which a recorded slave's trimmer starts.
	earlyKeep = time.Minute
)

// earlySettles are the settles waiting for one slave copy's trimmer.
type earlySettles struct {
	since   time.Time // of the first
	settles []earlySettle
	capped  bool // settles beyond earlyCap were dropped (logged once)
}

type earlySettle struct {
	id      mirror.MessageID
	outcome mirror.Outcome
}

// awaitedLocked returns the slaves of the queue, as its record has them,
// that this proxy trims and that have no trimmer running in q (nil: none
// yet). Call with mu held.
func (t *trimmers) awaitedLocked(id mirror.QueueID, q *queueTrimmers, out []string) []string {
	m, ok := t.lookup(id)
	if !ok {
		return out
	}
	for _, s := range m.Slaves {
		if !t.roles.trimsHere(s.Backend) {
			continue
		}
		if q == nil || q.runs[s.Backend] == nil {
			out = append(out, s.Backend)
		}
	}
	return out
}

// keepEarly keeps settles for the slaves on backends until their trimmers
// start, or hands them to a trimmer that started meanwhile.
func (t *trimmers) keepEarly(id mirror.QueueID, backends []string, ids []mirror.MessageID, outcome mirror.Outcome) {
	var started []*trimmerRun
	now := time.Now()
	t.mu.Lock()
	for _, b := range backends {
		if q := t.byQueue[id]; q != nil && q.runs[b] != nil {
			started = append(started, q.runs[b])
			continue
		}
		ref := trimmerRef{id, b}
		e := t.early[ref]
		if e == nil {
			e = &earlySettles{since: now}
			t.early[ref] = e
		}
		room := max(0, earlyCap-len(e.settles))
		if room < len(ids) && !e.capped {
			e.capped = true
			t.log.Warn("too many settles wait for a slave copy's trimmer; the rest come back (redelivered) if that slave is promoted",
				"queue", id.Name, "vhost", id.VHost, "backend", b, "waiting", earlyCap)
		}
		for _, mid := range ids[:min(room, len(ids))] {
			e.settles = append(e.settles, earlySettle{id: mid, outcome: outcome})
		}
	}
	t.mu.Unlock()
	for _, tr := range started {
		settleRun(tr, ids, outcome)
	}
}

// takeEarlyLocked removes and returns the settles waiting for the slave on
// backend. Call with mu held for writing.
func (t *trimmers) takeEarlyLocked(id mirror.QueueID, backend string) *earlySettles {
	ref := trimmerRef{id, backend}
	e := t.early[ref]
	delete(t.early, ref)
	return e
}

// handEarly gives a trimmer that just started the settles that waited for
// it, in the order they came.
func handEarly(tr *trimmerRun, e *earlySettles) {
	if e == nil {
		return
	}
	var ids []mirror.MessageID
	for i, s := range e.settles {
		ids = append(ids, s.id)
		if i == len(e.settles)-1 || e.settles[i+1].outcome != s.outcome {
			settleRun(tr, ids, s.outcome)
			ids = ids[:0]
		}
	}
}

// settleRun hands the outcome of ids at the master to one trimmer.
func settleRun(tr *trimmerRun, ids []mirror.MessageID, outcome mirror.Outcome) {
	switch outcome {
	case mirror.Acked:
		tr.t.Settle(ids...)
	case mirror.Rejected:
		tr.t.Reject(ids...)
	case mirror.Delivered:
		tr.t.Delivered(ids...)
	case mirror.Requeued:
		tr.t.Requeued(ids...)
	}
}

// sweepEarlyLocked drops the settles waiting for slaves the records no
// longer have, and those waiting longer than earlyKeep.
// Call with mu held for writing.
func (t *trimmers) sweepEarlyLocked(byID map[mirror.QueueID]mirror.QueueMeta, now time.Time) {
	for ref, e := range t.early {
		m, ok := byID[ref.id]
		if !ok || m.SlaveIndex(ref.backend) < 0 || now.Sub(e.since) >= earlyKeep {
			delete(t.early, ref)
		}
	}
}
