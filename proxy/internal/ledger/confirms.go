package ledger

import (
	"sort"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// PublisherConfirms tracks, on one channel in confirm mode, which of the
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
//
// A copy of a mirrored queue whose link is lost before it confirmed (or
// that a publish could not reach at all) is not simply dropped from the
// quorum: the publish waits until the metadata log no longer counts that
// backend as the master or a synchronised slave of the queue (its loss was
// recorded: a promotion, a slave dropped or made unsynchronised), and is
// nacked if that has not happened within the failover wait. A proxy that
// cannot reach a majority of the log can therefore never confirm a publish
// with fewer copies than the log counts, whatever it sees of the backends
// (see release).
type PublisherConfirms struct {
	lastClient uint64 // the last publish sequence number, the proxy's own included
	// clientBase is lastClient when the client sent confirm.select on a
	// channel the proxy had put in confirm mode itself: the client numbers
	// its publishes from there, and confirms up to it are the proxy's own.
	clientBase uint64
	// waiting holds every unconfirmed client publish, in sequence order.
	waiting []pendingPublish
	// backendSeqs maps each backend's sequence numbers back to the client's.
	backendSeqs map[int]*backendSequence
	// lost are the quorum copies of mirrored queues lost before they
	// confirmed, held until release lets them go.
	lost []lostCopy
	// refused are the publishes the master of their mirrored queue nacked
	// since the caller last took them (takeRefused): the slaves' copies
	// of those are to go.
	refused []RefusedPublish
	one     [1]int // publish's quorum
	// observe, when set (ObserveLatency), is given the seconds from a
	// timed publish's arrival (Arrived) to its ack; epoch is the first
	// timed arrival, from which pendingPublish.arrived counts.
	observe func(seconds float64)
	epoch   time.Time
}

// RefusedPublish is a publish to the default exchange that the master of
// its mirrored queue nacked (an overflow of reject-publish or
// reject-publish-dlx, or the queue failed): the master does not hold it,
// while the slaves' brokers, which count no ready message since their
// trimmers hold every copy, accepted theirs.
type RefusedPublish struct {
	Queue *mirror.QueueID
	ID    mirror.MessageID
}

// lostCopy is a quorum copy of a publish that its backend will never
// confirm: its link was lost, or the publish could not reach it.
type lostCopy struct {
	backend   int
	clientSeq uint64
	queue     *mirror.QueueID // the mirrored queue, or anyQueue
	since     time.Time
}

// CopySet is where one publish goes, as PublisherConfirms counts it.
type CopySet struct {
	Quorum, Extra []int // reached backends whose confirms count, and the others
	// Unreached are quorum backends the publish could not reach: lost at once.
	Unreached []int
	// Queue is the mirrored queue the publish goes to, anyQueue for an
	// exchange publish with several backends, nil otherwise; master is the
	// index of the queue's master, -1 for none.
	Queue  *mirror.QueueID
	Master int
}

type pendingPublish struct {
	seq    uint64
	copies uint8 // quorum backends that have not answered yet
	acks   uint8 // quorum backends that acked
	nacked bool
	// identified: id is the identity the proxy gave the message (set
	// when its content header went out, see identify).
	identified bool
	// timed: arrived is when the client's publish reached the proxy,
	// after PublisherConfirms.epoch (Arrived).
	timed   bool
	arrived time.Duration
	id      mirror.MessageID
}

type backendSequence struct {
	last    uint64 // the backend's last publish sequence number
	pending []backendPublish
}

type backendPublish struct {
	backendSeq, clientSeq uint64
	counts                bool // the backend is in the publish's quorum
	slave                 bool // its copy is a synchronised slave's (counts is set too)
	// queue is the mirrored queue the publish went to, anyQueue for an
	// exchange publish (whichever queues it reached), nil for one copy.
	queue *mirror.QueueID
}

// AnyQueue stands for every queue a publish to an exchange may have
// reached on a backend.
var AnyQueue = new(mirror.QueueID)

// MissedCopy is a slave copy that may lack a publish: its backend nacked
// it, or its link was lost before confirming it. queue is anyQueue when
// the publish went to an exchange.
type MissedCopy struct {
	Backend int
	Queue   *mirror.QueueID
}

// ClientConfirm is one basic.ack or basic.nack to send to the client.
type ClientConfirm struct {
	Seq      uint64
	Multiple bool
	Nack     bool
}

// Publish records a client publish sent to one backend, and returns its
// client sequence number. It does not allocate: it is every publish's path
// with one backend.
func (p *PublisherConfirms) Publish(backend int) uint64 {
	p.one[0] = backend
	return p.PublishTo(CopySet{Quorum: p.one[:], Master: -1}, time.Time{})
}

// PublishTo records a publish sent to the copies of cs and returns its
// sequence number; its unreached copies count as lost at now.
func (p *PublisherConfirms) PublishTo(cs CopySet, now time.Time) uint64 {
	p.lastClient++
	p.waiting = append(p.waiting, pendingPublish{seq: p.lastClient, copies: uint8(len(cs.Quorum) + len(cs.Unreached))})
	if p.backendSeqs == nil {
		p.backendSeqs = make(map[int]*backendSequence, 1)
	}
	for _, b := range cs.Quorum {
		p.number(b, backendPublish{counts: true, slave: cs.Queue != nil && b != cs.Master, queue: cs.Queue})
	}
	for _, b := range cs.Extra {
		p.number(b, backendPublish{})
	}
	for _, b := range cs.Unreached {
		p.lost = append(p.lost, lostCopy{backend: b, clientSeq: p.lastClient, queue: cs.Queue, since: now})
	}
	return p.lastClient
}

func (p *PublisherConfirms) number(b int, bp backendPublish) {
	bs := p.backendSeqs[b]
	if bs == nil {
		bs = &backendSequence{}
		p.backendSeqs[b] = bs
	}
	bs.last++
	bp.backendSeq, bp.clientSeq = bs.last, p.lastClient
	bs.pending = append(bs.pending, bp)
}

// ObserveLatency makes every publish timed by Arrived report, when the
// client's ack for it is collected, the seconds since it arrived.
func (p *PublisherConfirms) ObserveLatency(observe func(seconds float64)) { p.observe = observe }

// Arrived records when the publish just recorded (Publish, PublishTo)
// reached the proxy, so that its ack is timed; nothing without
// ObserveLatency. Call it before anything answers the publish.
func (p *PublisherConfirms) Arrived(at time.Time) {
	if p.observe == nil || len(p.waiting) == 0 {
		return
	}
	if p.epoch.IsZero() {
		p.epoch = at
	}
	w := &p.waiting[len(p.waiting)-1]
	w.timed, w.arrived = true, at.Sub(p.epoch)
}

// Identify records the identity of the message of publish seq, given
// when its content header went out; nothing when it was answered already.
func (p *PublisherConfirms) Identify(seq uint64, id mirror.MessageID) {
	if i := p.indexOf(seq); i >= 0 {
		p.waiting[i].identified, p.waiting[i].id = true, id
	}
}

// TakeRefused appends to out the publishes their queue's master nacked
// since the last call, and forgets them.
func (p *PublisherConfirms) TakeRefused(out []RefusedPublish) []RefusedPublish {
	out = append(out, p.refused...)
	p.refused = p.refused[:0]
	return out
}

// ClientSelected records the client's confirm.select on a channel the
// proxy already numbers publishes on: the client's first publish is 1.
func (p *PublisherConfirms) ClientSelected() { p.clientBase = p.lastClient }

// appendMissed appends to missed the slave copy of bp's publish on backend
// b, once per queue.
func appendMissed(missed []MissedCopy, b int, bp backendPublish) []MissedCopy {
	if !bp.slave {
		return missed
	}
	for _, m := range missed {
		if m.Backend == b && m.Queue == bp.queue {
			return missed
		}
	}
	return append(missed, MissedCopy{Backend: b, Queue: bp.queue})
}

// BackendLost stops waiting for a backend whose link was lost, at now: its
// pending publishes count as neither acked nor nacked, at once for a
// publish with one copy, and for a mirrored queue's copies once release
// lets them go; a publish no quorum backend acked is nacked. A new link to
// the backend numbers from 1 again. The slave copies those publishes were
// meant for are appended to missed.
func (p *PublisherConfirms) BackendLost(backend int, now time.Time, out []ClientConfirm, missed *[]MissedCopy) []ClientConfirm {
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
		if bp.queue != nil {
			p.lost = append(p.lost, lostCopy{backend: backend, clientSeq: bp.clientSeq, queue: bp.queue, since: now})
			continue
		}
		if p.dropCopy(bp.clientSeq, false) {
			answered++
		}
	}
	if answered == 0 {
		return out
	}
	return p.collect(answered, out)
}

// Confirm applies a backend's basic.ack or basic.nack and appends to out the
// confirms the client should now receive, coalesced into one multiple ack
// when they are the oldest outstanding publishes, as they are when a single
// backend confirms in order. A nack appends the slave copies it concerns to
// missed.
func (p *PublisherConfirms) Confirm(backend int, backendSeq uint64, multiple, nack bool, out []ClientConfirm, missed *[]MissedCopy) []ClientConfirm {
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
		if nack && !bp.slave && bp.queue != nil && bp.queue != AnyQueue && w.identified {
			p.refused = append(p.refused, RefusedPublish{Queue: bp.queue, ID: w.id})
		}
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

// Release lets go of the lost copies that held reports the metadata no
// longer counts (their loss was recorded), and of those lost before
// expired, which nack their publishes: the copy may lack a publish the
// metadata still counts it for. It appends the confirms the client should
// now receive to out.
func (p *PublisherConfirms) Release(held func(backend int, queue *mirror.QueueID) bool, expired time.Time, out []ClientConfirm) []ClientConfirm {
	if len(p.lost) == 0 {
		return out
	}
	answered := 0
	kept := p.lost[:0]
	for _, lc := range p.lost {
		stillHeld := held(lc.backend, lc.queue)
		if stillHeld && lc.since.After(expired) {
			kept = append(kept, lc)
			continue
		}
		if p.dropCopy(lc.clientSeq, stillHeld) {
			answered++
		}
	}
	clear(p.lost[len(kept):])
	p.lost = kept
	if answered == 0 {
		return out
	}
	return p.collect(answered, out)
}

// dropCopy stops waiting for one quorum copy of publish seq, which never
// confirms it (nack: the publish is nacked whatever the others say), and
// reports whether that answered the publish: nacked if no copy acked it.
func (p *PublisherConfirms) dropCopy(seq uint64, nack bool) bool {
	i := p.indexOf(seq)
	if i < 0 {
		return false
	}
	w := &p.waiting[i]
	w.copies--
	w.nacked = w.nacked || nack
	if w.copies > 0 {
		return false
	}
	w.nacked = w.nacked || w.acks == 0
	return true
}

// HoldsLost reports whether lost copies keep publishes waiting.
func (p *PublisherConfirms) HoldsLost() bool { return len(p.lost) > 0 }

// collect moves the answered publishes to out and drops them from waiting.
func (p *PublisherConfirms) collect(answered int, out []ClientConfirm) []ClientConfirm {
	// The answered publishes at the front with no nack among them become
	// one multiple ack; everything else is answered one by one.
	prefix := 0
	for prefix < len(p.waiting) && p.waiting[prefix].copies == 0 && !p.waiting[prefix].nacked {
		prefix++
	}
	var elapsed time.Duration // since epoch, read once for every ack timed here
	acked := func(w *pendingPublish) {
		if !w.timed || p.observe == nil {
			return
		}
		if elapsed == 0 {
			elapsed = time.Since(p.epoch)
		}
		p.observe((elapsed - w.arrived).Seconds())
	}
	if p.observe != nil {
		for i := range prefix {
			acked(&p.waiting[i])
		}
	}
	switch {
	case prefix == 0 || p.waiting[prefix-1].seq <= p.clientBase:
	case prefix == 1:
		out = append(out, ClientConfirm{Seq: p.waiting[0].seq - p.clientBase})
	default:
		// Publishes of the proxy's own (up to clientBase) in the range are
		// news to nobody; the client's sequence starts after them.
		out = append(out, ClientConfirm{Seq: p.waiting[prefix-1].seq - p.clientBase, Multiple: true})
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
				out = append(out, ClientConfirm{Seq: w.seq - p.clientBase, Nack: w.nacked})
				if !w.nacked {
					acked(&w)
				}
			}
		default:
			kept = append(kept, w)
		}
	}
	p.waiting = kept
	return out
}

// indexOf finds the waiting publish with the client sequence number seq.
func (p *PublisherConfirms) indexOf(seq uint64) int {
	i := sort.Search(len(p.waiting), func(i int) bool { return p.waiting[i].seq >= seq })
	if i == len(p.waiting) || p.waiting[i].seq != seq {
		return -1
	}
	return i
}

// AnsweredThrough reports whether every publish numbered up to seq has
// been answered.
func (p *PublisherConfirms) AnsweredThrough(seq uint64) bool {
	return len(p.waiting) == 0 || p.waiting[0].seq > seq
}

// LastSeq is the sequence number of the last publish, the proxy's own
// included.
func (p *PublisherConfirms) LastSeq() uint64 { return p.lastClient }

// ConfirmWithoutCopies answers the publish PublishTo just recorded with
// no copy to wait for (an empty quorum and nothing unreached): it is
// confirmed at once. It appends the confirms to out.
func (p *PublisherConfirms) ConfirmWithoutCopies(out []ClientConfirm) []ClientConfirm {
	return p.collect(1, out)
}

// Unconfirmed is the number of client publishes still waiting for backends.
func (p *PublisherConfirms) Unconfirmed() int { return len(p.waiting) }

// Owed returns, per backend, how many confirms it still owes towards a
// client publish's quorum: for the log when a channel ends with publishes
// unconfirmed.
func (p *PublisherConfirms) Owed() map[int]int {
	out := make(map[int]int)
	for b, bs := range p.backendSeqs {
		for _, bp := range bs.pending {
			if bp.counts {
				out[b]++
			}
		}
	}
	for _, lc := range p.lost {
		out[lc.backend]++
	}
	return out
}
