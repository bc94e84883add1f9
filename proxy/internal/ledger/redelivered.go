package ledger

import (
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// The redelivered flag after a promotion. A promoted slave gives back what
// clients had not acked because its trimmer held those messages: closing the
// trimmer's channel requeues them, and the broker sets redelivered on each.
// A message the trimmer did not hold yet gets no flag, yet the old master may
// have delivered it already: the publish reached the master before the
// slave, a live old master (drained, handed over) delivered it between the
// trimmer's stop and this proxy's applying the promotion (from then on its
// deliveries are dropped, messageArrived), or a sync left the slave two
// copies of one message and it was promoted before its trimmer dropped one.
// The new master then delivers it as if for the first time, and a client
// that relies on redelivered to spot repeats (RabbitMQ sets it on
// everything the new master of a mirrored queue gives back) takes it for
// new.
//
// So the proxy remembers which messages of mirrored queues it delivered
// recently, by identity (mirror.IdentityHeader): an identity belongs to one
// publish, so a second delivery of it is a redelivery whatever the broker
// says, and the proxy sets the flag. What it remembers is bounded by time,
// not by what the queues hold: a message a slave held for longer than
// keepRecent should be in its trimmer's hands (trimmers take a slave's
// deliveries as they come), and come back flagged by the broker. Only when
// a queue's epoch rises (a promotion) are the deliveries of the keepRecent
// before it kept longer, for keepPromoted, since the new master may deliver
// them only after its backlog. keepRecent is a minute because a message
// can come back unflagged more than 10 s after its first delivery, across
// two promotions of a kill round (TestSidecarNodeKilledRepeatedly); at
// most maxRecent identities per queue (about 11 MB, reached above some
// 2 200 deliveries a second) bound the memory.
//
// A dead-lettered message (it carries x-death) is never flagged: one that
// comes back to its queue through dead-lettering (a retry queue whose
// messages expire back into it) keeps its identity, yet RabbitMQ delivers it
// as a new message.
//
// Each proxy knows only its own deliveries: a message delivered through one
// proxy and then, after a promotion, through another may still arrive there
// without the flag (docs/guarantees.md says so). Messages without an identity (on
// the broker before the proxy) are not tracked: their content is their only
// identity, and two equal bodies are not a redelivery.
const (
	keepRecent   = time.Minute
	keepPromoted = 10 * time.Minute
	// maxRecent bounds one queue's recent deliveries, whatever its rate.
	maxRecent = 1 << 17
	// maxPromotions bounds the sets kept from earlier epochs of one queue.
	maxPromotions = 4
	// SweepEvery is how often idle queues' records are pruned.
	SweepEvery = time.Second
)

// DeliveredIDs is the record of recent deliveries, per mirrored queue.
type DeliveredIDs struct {
	mu     sync.RWMutex
	queues map[mirror.QueueID]*queueDeliveries
}

// queueDeliveries is one queue's record.
type queueDeliveries struct {
	mu    sync.Mutex
	epoch uint64 // the queue's epoch when recent began
	// recent holds the identities delivered at epoch, order the same ones
	// oldest first from head on, with when they were delivered.
	recent map[mirror.MessageID]struct{}
	order  []recentDelivery
	head   int
	// promoted are the recent sets of earlier epochs, oldest first.
	promoted []promotedSet
	// dropped is set when sweep removed the record: a delivery that found
	// it just before looks it up again.
	dropped bool
}

type recentDelivery struct {
	id mirror.MessageID
	at time.Time
}

// promotedSet is what a queue delivered in the keepRecent before a
// promotion, kept until the new master had time to deliver it again.
type promotedSet struct {
	ids   map[mirror.MessageID]struct{}
	until time.Time
}

func NewDeliveredIDs() *DeliveredIDs {
	return &DeliveredIDs{queues: make(map[mirror.QueueID]*queueDeliveries)}
}

// Delivering records that the message id of queue q is being delivered while
// the queue is at epoch, and reports whether it was delivered before.
// mirrored says whether the queue has slaves: a queue without any starts no
// record (nothing can be promoted), but one it has is kept, since the queue
// may have lost its slaves in the promotion that matters.
func (d *DeliveredIDs) Delivering(q mirror.QueueID, epoch uint64, mirrored bool, id mirror.MessageID, now time.Time) bool {
	r := d.record(q, epoch, mirrored)
	if r == nil {
		return false
	}
	defer r.mu.Unlock()
	r.advance(epoch, now)
	if _, ok := r.recent[id]; ok {
		return true
	}
	before := false
	for i := range r.promoted {
		if _, ok := r.promoted[i].ids[id]; ok {
			delete(r.promoted[i].ids, id)
			before = true
			break
		}
	}
	r.recent[id] = struct{}{}
	r.order = append(r.order, recentDelivery{id: id, at: now})
	return before
}

// record returns q's record, locked; nil when there is none and mirrored
// is false.
func (d *DeliveredIDs) record(q mirror.QueueID, epoch uint64, mirrored bool) *queueDeliveries {
	for {
		d.mu.RLock()
		r := d.queues[q]
		d.mu.RUnlock()
		if r == nil {
			if !mirrored {
				return nil
			}
			d.mu.Lock()
			if r = d.queues[q]; r == nil {
				r = &queueDeliveries{epoch: epoch, recent: make(map[mirror.MessageID]struct{})}
				d.queues[q] = r
			}
			d.mu.Unlock()
		}
		r.mu.Lock()
		if !r.dropped {
			return r
		}
		r.mu.Unlock()
	}
}

// advance moves the record to epoch and forgets what no longer matters.
func (r *queueDeliveries) advance(epoch uint64, now time.Time) {
	if epoch != r.epoch {
		if len(r.recent) > 0 {
			r.promoted = append(r.promoted, promotedSet{ids: r.recent, until: now.Add(keepPromoted)})
			if len(r.promoted) > maxPromotions {
				r.promoted = r.promoted[1:]
			}
			r.recent = make(map[mirror.MessageID]struct{})
			r.order, r.head = nil, 0
		}
		r.epoch = epoch
	}
	for r.head < len(r.order) && (now.Sub(r.order[r.head].at) > keepRecent || len(r.order)-r.head > maxRecent) {
		delete(r.recent, r.order[r.head].id)
		r.order[r.head] = recentDelivery{}
		r.head++
	}
	if r.head > len(r.order)/2 {
		r.order = append(r.order[:0], r.order[r.head:]...)
		r.head = 0
	}
	for len(r.promoted) > 0 && (now.After(r.promoted[0].until) || len(r.promoted[0].ids) == 0) {
		r.promoted = r.promoted[1:]
	}
}

func (r *queueDeliveries) empty() bool { return len(r.recent) == 0 && len(r.promoted) == 0 }

// Sweep prunes every record as a delivery would, so that a promotion is
// noticed (and what was delivered before it kept) even while the queue
// delivers nothing, and drops the records of deleted queues and of queues
// that delivered nothing for keepRecent and had no promotion since.
func (d *DeliveredIDs) Sweep(lookup func(mirror.QueueID) (mirror.QueueMeta, bool), now time.Time) {
	d.mu.RLock()
	ids := make([]mirror.QueueID, 0, len(d.queues))
	for q := range d.queues {
		ids = append(ids, q)
	}
	d.mu.RUnlock()
	for _, q := range ids {
		meta, ok := lookup(q)
		d.mu.Lock()
		r := d.queues[q]
		if r == nil {
			d.mu.Unlock()
			continue
		}
		r.mu.Lock()
		if ok {
			r.advance(meta.Epoch, now)
		}
		if !ok || r.empty() {
			delete(d.queues, q)
			r.dropped = true
		}
		r.mu.Unlock()
		d.mu.Unlock()
	}
}

// DeadLettered reports whether a content header's headers table has
// x-death: the message was dead-lettered at least once.
func DeadLettered(header []byte) bool {
	start, end, present, err := frames.HeadersField(header)
	if err != nil || !present {
		return false
	}
	t, _, err := frames.DecodeTable(header[start:end])
	if err != nil {
		return false
	}
	_, found := t.Get("x-death")
	return found
}
