package proxy

import (
	"sort"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// publisherConfirms tracks, on one channel in confirm mode, which of the
// client's publishes the backends have confirmed. The client's sequence
// numbers are the proxy's own. Each publish is sent to one or more backends,
// each numbering it in its own sequence. A client publish is confirmed when
// every backend of its quorum (the master and the synchronised slaves of a
// mirrored queue; every backend for an exchange publish) has answered, and
// nacked when one nacked it, or when every backend that would have held it
// was lost before acking. Backends outside the quorum (unsynchronised
// slaves) are numbered but not waited for.
//
// The same bookkeeping serves the proxy's own confirm mode (ownConfirms in
// channelState): there nothing reaches the client, but a slave's nack, or a
// slave's link lost before it confirmed, says which copies may lack a
// publish (missed).
type publisherConfirms struct {
	lastClient uint64 // the last publish sequence number, the proxy's own included
	// clientBase is lastClient when the client sent confirm.select on a
	// channel the proxy had put in confirm mode itself: the client numbers
	// its publishes from there, and confirms up to it are the proxy's own.
	clientBase uint64
	// waiting holds every unconfirmed client publish, in sequence order.
	waiting []pendingPublish
	// backendSeqs maps each backend's sequence numbers back to the client's.
	backendSeqs map[int]*backendSequence
}

type pendingPublish struct {
	seq    uint64
	copies uint8 // quorum backends that have not answered yet
	acks   uint8 // quorum backends that acked
	nacked bool
}

type backendSequence struct {
	last    uint64 // the backend's last publish sequence number
	pending []backendPublish
}

type backendPublish struct {
	backendSeq, clientSeq uint64
	counts                bool // the backend is in the publish's quorum
	// slaveOf is the queue whose synchronised slave this backend's copy
	// is, anyQueue for an exchange publish (whichever queues it reached),
	// nil when a lost copy would matter to no slave (the master's copy, an
	// unsynchronised slave's).
	slaveOf *mirror.QueueID
}

// anyQueue stands for every queue a publish to an exchange may have
// reached on a backend.
var anyQueue = new(mirror.QueueID)

// missedCopy is a slave copy that may lack a publish: its backend nacked
// it, or its link was lost before confirming it. queue is anyQueue when
// the publish went to an exchange.
type missedCopy struct {
	backend int
	queue   *mirror.QueueID
}

// clientConfirm is one basic.ack or basic.nack to send to the client.
type clientConfirm struct {
	seq      uint64
	multiple bool
	nack     bool
}

// publish records a client publish sent to the given backends, all of them
// in its quorum, and returns its client sequence number.
func (p *publisherConfirms) publish(backends ...int) uint64 {
	return p.publishTo(backends, nil, nil, -1)
}

// publishTo records a publish sent to the quorum backends and to the extra
// ones (numbered, not waited for) and returns its sequence number. queue is
// the mirrored queue it goes to, whose master is backend master; anyQueue
// (master -1) for an exchange publish; nil when it is not mirrored.
func (p *publisherConfirms) publishTo(quorum, extra []int, queue *mirror.QueueID, master int) uint64 {
	p.lastClient++
	p.waiting = append(p.waiting, pendingPublish{seq: p.lastClient, copies: uint8(len(quorum))})
	if p.backendSeqs == nil {
		p.backendSeqs = make(map[int]*backendSequence, 1)
	}
	for _, b := range quorum {
		slaveOf := queue
		if b == master {
			slaveOf = nil
		}
		p.number(b, true, slaveOf)
	}
	for _, b := range extra {
		p.number(b, false, nil)
	}
	return p.lastClient
}

func (p *publisherConfirms) number(b int, counts bool, slaveOf *mirror.QueueID) {
	bs := p.backendSeqs[b]
	if bs == nil {
		bs = &backendSequence{}
		p.backendSeqs[b] = bs
	}
	bs.last++
	bs.pending = append(bs.pending, backendPublish{backendSeq: bs.last, clientSeq: p.lastClient, counts: counts, slaveOf: slaveOf})
}

// clientSelected records the client's confirm.select on a channel the
// proxy already numbers publishes on: the client's first publish is 1.
func (p *publisherConfirms) clientSelected() { p.clientBase = p.lastClient }

// appendMissed appends to missed the slave copy of bp's publish on backend
// b, once per queue.
func appendMissed(missed []missedCopy, b int, bp backendPublish) []missedCopy {
	if bp.slaveOf == nil {
		return missed
	}
	for _, m := range missed {
		if m.backend == b && m.queue == bp.slaveOf {
			return missed
		}
	}
	return append(missed, missedCopy{backend: b, queue: bp.slaveOf})
}

// backendLost stops waiting for a backend whose link was lost: its pending
// publishes count as neither acked nor nacked, and a publish no quorum
// backend acked is nacked. A new link to the backend numbers from 1 again.
// The slave copies those publishes were meant for are appended to missed.
func (p *publisherConfirms) backendLost(backend int, out []clientConfirm, missed *[]missedCopy) []clientConfirm {
	bs := p.backendSeqs[backend]
	if bs == nil {
		return out
	}
	delete(p.backendSeqs, backend)
	answered := 0
	for _, bp := range bs.pending {
		if missed != nil {
			*missed = appendMissed(*missed, backend, bp)
		}
		if !bp.counts {
			continue
		}
		if i := p.indexOf(bp.clientSeq); i >= 0 {
			w := &p.waiting[i]
			w.copies--
			if w.copies == 0 {
				w.nacked = w.nacked || w.acks == 0
				answered++
			}
		}
	}
	if answered == 0 {
		return out
	}
	return p.collect(answered, out)
}

// confirm applies a backend's basic.ack or basic.nack and appends to out the
// confirms the client should now receive, coalesced into one multiple ack
// when they are the oldest outstanding publishes, as they are when a single
// backend confirms in order. A nack appends the slave copies it concerns to
// missed.
func (p *publisherConfirms) confirm(backend int, backendSeq uint64, multiple, nack bool, out []clientConfirm, missed *[]missedCopy) []clientConfirm {
	bs := p.backendSeqs[backend]
	if bs == nil {
		return out
	}
	n := 0 // how many of bs.pending this confirm covers
	if multiple {
		n = sort.Search(len(bs.pending), func(i int) bool { return bs.pending[i].backendSeq > backendSeq })
	}
	answered := 0
	apply := func(bp backendPublish) {
		if nack && missed != nil {
			*missed = appendMissed(*missed, backend, bp)
		}
		if !bp.counts {
			return
		}
		i := p.indexOf(bp.clientSeq)
		if i < 0 {
			return
		}
		w := &p.waiting[i]
		w.copies--
		w.nacked = w.nacked || nack
		if !nack {
			w.acks++
		}
		if w.copies == 0 {
			answered++
		}
	}
	if multiple {
		for _, bp := range bs.pending[:n] {
			apply(bp)
		}
		bs.pending = append(bs.pending[:0], bs.pending[n:]...)
	} else {
		i := sort.Search(len(bs.pending), func(i int) bool { return bs.pending[i].backendSeq >= backendSeq })
		if i == len(bs.pending) || bs.pending[i].backendSeq != backendSeq {
			return out
		}
		apply(bs.pending[i])
		bs.pending = append(bs.pending[:i], bs.pending[i+1:]...)
	}
	if answered == 0 {
		return out
	}
	return p.collect(answered, out)
}

// collect moves the answered publishes to out and drops them from waiting.
func (p *publisherConfirms) collect(answered int, out []clientConfirm) []clientConfirm {
	// The answered publishes at the front with no nack among them become
	// one multiple ack; everything else is answered one by one.
	prefix := 0
	for prefix < len(p.waiting) && p.waiting[prefix].copies == 0 && !p.waiting[prefix].nacked {
		prefix++
	}
	switch {
	case prefix == 0 || p.waiting[prefix-1].seq <= p.clientBase:
	case prefix == 1:
		out = append(out, clientConfirm{seq: p.waiting[0].seq - p.clientBase})
	default:
		// Publishes of the proxy's own (up to clientBase) in the range are
		// news to nobody; the client's sequence starts after them.
		out = append(out, clientConfirm{seq: p.waiting[prefix-1].seq - p.clientBase, multiple: true})
	}
	if prefix == answered {
		n := copy(p.waiting, p.waiting[prefix:])
		p.waiting = p.waiting[:n]
		return out
	}
	kept := p.waiting[:0]
	for i := range p.waiting {
		w := p.waiting[i]
		switch {
		case i < prefix:
		case w.copies == 0:
			if w.seq > p.clientBase {
				out = append(out, clientConfirm{seq: w.seq - p.clientBase, nack: w.nacked})
			}
		default:
			kept = append(kept, w)
		}
	}
	p.waiting = kept
	return out
}

// indexOf finds the waiting publish with the client sequence number seq.
func (p *publisherConfirms) indexOf(seq uint64) int {
	i := sort.Search(len(p.waiting), func(i int) bool { return p.waiting[i].seq >= seq })
	if i == len(p.waiting) || p.waiting[i].seq != seq {
		return -1
	}
	return i
}

// unconfirmed is the number of client publishes still waiting for backends.
func (p *publisherConfirms) unconfirmed() int { return len(p.waiting) }

// owed returns, per backend, how many confirms it still owes towards a
// client publish's quorum: for the log when a channel ends with publishes
// unconfirmed.
func (p *publisherConfirms) owed() map[int]int {
	out := make(map[int]int)
	for b, bs := range p.backendSeqs {
		for _, bp := range bs.pending {
			if bp.counts {
				out[b]++
			}
		}
	}
	return out
}
