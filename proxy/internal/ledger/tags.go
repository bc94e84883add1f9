package ledger

import (
	"sort"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// DeliveryTags maps the delivery tags a client sees on one channel to the
// backend and backend tag of each delivery. The client's tags are the proxy's
// own: once mirroring merges deliveries from several backends onto one client
// channel, or moves a consumer to another backend on failover, backend tags no
// longer form one sequence, and a stale tag must never settle a new message.
//
// Deliveries arrive in increasing proxy tag order, so pending is sorted by
// proxy tag and searched by bisection; settled entries are marked, and
// swept out when they make up most of the slice. Memory is bounded by the
// client's unacknowledged window (its prefetch).
type DeliveryTags struct {
	next    uint64 // last proxy tag handed out
	pending []TagEntry
	live    int // entries in pending that are not settled
}

type TagEntry struct {
	proxyTag   uint64
	backendTag uint64
	backend    int    // index of the backend link the delivery came from
	gen        uint64 // the link's generation
	settled    bool
	// Queue and ID say which message of which mirrored queue it was, so
	// that settling it trims the slaves; Queue is nil otherwise.
	Queue *QueueRef
	ID    mirror.MessageID
	// from is the recorded queue the consumer or get read, nil when the
	// proxy does not know it: list_queues counts unacknowledged messages
	// by it.
	from *QueueRef
}

// QueueRef names the queue of a consumer or get, shared by its deliveries.
type QueueRef struct{ ID mirror.QueueID }

// Trimmed is a message whose master copy the client settled: its slave
// copies are to go.
type Trimmed struct {
	Queue *QueueRef
	ID    mirror.MessageID
}

// BackendAck is one acknowledgement to send to a backend: settle
// backendTag, and with multiple every earlier unsettled tag on that backend.
// It is void when the link's generation is no longer gen.
type BackendAck struct {
	Backend    int
	Gen        uint64
	BackendTag uint64
	Multiple   bool
}

// Delivered describes one delivery for deliveryTags.deliver.
type Delivered struct {
	Backend    int
	Gen        uint64
	BackendTag uint64
	Queue      *QueueRef // nil unless the message's slaves are to be trimmed
	ID         mirror.MessageID
	From       *QueueRef // the recorded queue the message came from, if known
}

// Deliver assigns the proxy tag for a delivery. Deliveries that need no
// acknowledgement (no-ack consumers and gets) get a tag but no entry.
func (d *DeliveryTags) Deliver(m Delivered, needsAck bool) uint64 {
	d.next++
	if needsAck {
		d.pending = append(d.pending, TagEntry{proxyTag: d.next, backendTag: m.BackendTag, backend: m.Backend, gen: m.Gen, Queue: m.Queue, ID: m.ID, from: m.From})
		d.live++
	}
	return d.next
}

// Settle resolves a client's ack, nack or reject of proxyTag (with multiple:
// of every unsettled tag up to it; tag 0 with multiple means all). It returns
// the backend acknowledgements to send, appended to out; with keep set, the
// entries it settled appended to settled (a transaction that rolls back
// restores them); and false when the tag is not an outstanding delivery:
// RabbitMQ answers that with PRECONDITION_FAILED - unknown delivery tag.
// With trims non-nil, the settled messages of mirrored queues are appended
// to *trims, for the slaves' trimmers to hear what became of them.
func (d *DeliveryTags) Settle(proxyTag uint64, multiple bool, out []BackendAck, keep bool, settled []TagEntry, trims *[]Trimmed) ([]BackendAck, []TagEntry, bool) {
	if multiple && proxyTag == 0 {
		proxyTag = d.next
		if d.live == 0 {
			return out, settled, true
		}
	} else {
		i := d.find(proxyTag)
		if i < 0 {
			return out, settled, false
		}
		if !multiple {
			e := &d.pending[i]
			e.settled = true
			d.live--
			if keep {
				settled = append(settled, *e)
			}
			ack := BackendAck{Backend: e.backend, Gen: e.gen, BackendTag: e.backendTag}
			if trims != nil && e.Queue != nil {
				*trims = append(*trims, Trimmed{Queue: e.Queue, ID: e.ID})
			}
			d.compact() // moves entries: e points at another one afterwards
			return append(out, ack), settled, true
		}
	}
	// Multiple: per backend, the highest backend tag among the settled
	// entries. Within one backend, proxy tags and backend tags rise together,
	// so "every unsettled proxy tag <= N from backend b" is exactly "every
	// unsettled backend tag <= M on b", which one multiple ack expresses.
	first := len(out)
	for i := range d.pending {
		e := &d.pending[i]
		if e.proxyTag > proxyTag {
			break
		}
		if e.settled {
			continue
		}
		e.settled = true
		d.live--
		if keep {
			settled = append(settled, *e)
		}
		if trims != nil && e.Queue != nil {
			*trims = append(*trims, Trimmed{Queue: e.Queue, ID: e.ID})
		}
		found := false
		for j := first; j < len(out); j++ {
			if out[j].Backend == e.backend && out[j].Gen == e.gen {
				out[j].BackendTag = e.backendTag
				found = true
				break
			}
		}
		if !found {
			out = append(out, BackendAck{Backend: e.backend, Gen: e.gen, BackendTag: e.backendTag, Multiple: true})
		}
	}
	d.compact()
	return out, settled, true
}

// Restore makes settled entries outstanding again: a rolled-back transaction
// leaves its acks unapplied at the broker.
func (d *DeliveryTags) Restore(entries []TagEntry) {
	if len(entries) == 0 {
		return
	}
	// Only pending[:sorted] is in order while entries are appended after it,
	// so that is all the bisection may search.
	sorted := len(d.pending)
	for _, e := range entries {
		i := sort.Search(sorted, func(i int) bool { return d.pending[i].proxyTag >= e.proxyTag })
		if i < sorted && d.pending[i].proxyTag == e.proxyTag {
			if d.pending[i].settled {
				d.pending[i].settled = false
				d.live++
			}
			continue
		}
		e.settled = false
		d.pending = append(d.pending, e)
		d.live++
	}
	sort.Slice(d.pending, func(i, j int) bool { return d.pending[i].proxyTag < d.pending[j].proxyTag })
}

// DropAll forgets every outstanding delivery: after basic.recover-async
// the brokers redeliver them with new tags, and the old tags are void.
func (d *DeliveryTags) DropAll() {
	d.pending = d.pending[:0]
	d.live = 0
}

// DropFrom forgets the outstanding deliveries that came from backend, when
// its broker answers basic.recover: it requeued them all, and what it
// delivers after its recover-ok carries new tags. Deliveries from other
// backends stay, whenever their recover-ok comes: a channel open on several
// links gets one recover-ok from each, and the master's redeliveries may
// reach the proxy before a slave's recover-ok does.
func (d *DeliveryTags) DropFrom(backend int) {
	kept := d.pending[:0]
	for _, e := range d.pending {
		switch {
		case e.settled:
		case e.backend == backend:
			d.live--
		default:
			kept = append(kept, e)
		}
	}
	d.pending = kept
}

// AppendMirrored appends to out the queue and identity of every
// outstanding delivery of a mirrored queue that came from backend, or from
// any backend when backend is negative.
func (d *DeliveryTags) AppendMirrored(out []Trimmed, backend int) []Trimmed {
	for i := range d.pending {
		e := &d.pending[i]
		if e.settled || e.Queue == nil || backend >= 0 && e.backend != backend {
			continue
		}
		out = append(out, Trimmed{Queue: e.Queue, ID: e.ID})
	}
	return out
}

// Outstanding is the number of deliveries awaiting the client's ack.
func (d *DeliveryTags) Outstanding() int { return d.live }

// CountUnacked adds to counts, per queue of vhost ("" for every vhost), the
// deliveries waiting for the client's settlement that came from a link
// still open (live): a lost link's broker has taken its deliveries back.
func (d *DeliveryTags) CountUnacked(vhost string, live func(backend int, gen uint64) bool, counts map[mirror.QueueID]int) {
	for i := range d.pending {
		e := &d.pending[i]
		if e.settled || e.from == nil || vhost != "" && e.from.ID.VHost != vhost || !live(e.backend, e.gen) {
			continue
		}
		counts[e.from.ID]++
	}
}

// find returns the index of the unsettled entry for proxyTag, or -1.
func (d *DeliveryTags) find(proxyTag uint64) int {
	i := d.index(proxyTag)
	if i < 0 || d.pending[i].settled {
		return -1
	}
	return i
}

// index returns the index of the entry for proxyTag, settled or not, or -1.
func (d *DeliveryTags) index(proxyTag uint64) int {
	i := sort.Search(len(d.pending), func(i int) bool { return d.pending[i].proxyTag >= proxyTag })
	if i == len(d.pending) || d.pending[i].proxyTag != proxyTag {
		return -1
	}
	return i
}

// compact removes settled entries once they are the bulk of the slice,
// moving the live ones down in place so that the backing array is reused
// and the steady state allocates nothing.
func (d *DeliveryTags) compact() {
	if d.live == 0 {
		d.pending = d.pending[:0]
		return
	}
	if len(d.pending) < 32 || d.live > len(d.pending)/2 {
		return
	}
	kept := d.pending[:0]
	for _, e := range d.pending {
		if !e.settled {
			kept = append(kept, e)
		}
	}
	d.pending = kept
}
