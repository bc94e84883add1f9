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
// most maxRecent identities per queue bound the memory, reached above some
// 2 200 deliveries a second: 11 MB for messages of long-lived publishing
// connections, 23 MB when each message came on a connection of its own
// (idSet keeps a bitmap per connection).
//
// A dead-lettered message (it carries x-death) is never flagged: one that
// comes back to its queue through dead-lettering (a retry queue whose
// messages expire back into it) keeps its identity, yet RabbitMQ delivers it
// as a new message.
//
// Each proxy of a sidecar cluster knows only its own deliveries, and after a
// promotion the new master may deliver through any proxy what the old one
// delivered through another. So a proxy whose record of a queue starts at,
// or rises to, an epoch above zero asks the other proxies which messages
// they delivered before it (AskPeers hands the questions to the server,
// which asks them through the Mirror, and Answered takes the answers in).
// Until the answers are in, at most askBound, every delivery of the queue
// at that epoch is flagged: the flag says a message may have been
// delivered before, and a flag too many costs a consumer a check, a flag
// too few a repeat it takes for new. A record starts again only after
// keepRecent of the queue's silence, so the question follows a promotion,
// or a queue this proxy had not delivered from lately.
//
// Messages without an identity (on the broker before the proxy) are not
// tracked: their content is their only identity, and two equal bodies are
// not a redelivery.
const (
	keepRecent   = time.Minute
	keepPromoted = 10 * time.Minute
	// maxRecent bounds one queue's recent deliveries, whatever its rate.
	maxRecent = 1 << 17
	// maxPromotions bounds the sets kept from earlier epochs of one queue.
	maxPromotions = 4
	// SweepEvery is how often idle queues' records are pruned.
	SweepEvery = time.Second
	// AskWait bounds a question to the other proxies once asked.
	AskWait = 2 * time.Second
	// askBound bounds how long a queue's deliveries are all flagged while
	// its question waits to be asked or answered.
	askBound = 5 * time.Second
	// maxAnswer bounds the identities one answer to another proxy carries
	// (2 MiB).
	maxAnswer = maxRecent
)

// PeerAsk is a question for the other proxies of a sidecar cluster: which
// messages of Queue did they deliver while its epoch was below Epoch?
type PeerAsk struct {
	Queue mirror.QueueID
	Epoch uint64
}

// DeliveredIDs is the record of recent deliveries, per mirrored queue.
type DeliveredIDs struct {
	mu     sync.RWMutex
	queues map[mirror.QueueID]*queueDeliveries
	// asks carries the questions for the other proxies; nil for a proxy
	// alone. Set by AskPeers before the first delivery.
	asks chan PeerAsk
}

// queueDeliveries is one queue's record.
type queueDeliveries struct {
	mu    sync.Mutex
	epoch uint64 // the queue's epoch when recent began
	// recent holds the identities delivered at epoch, order the same ones
	// oldest first from head on, with when they were delivered.
	recent *idSet
	order  []recentDelivery
	head   int
	// promoted are the recent sets of earlier epochs, oldest first.
	promoted []promotedSet
	// dropped is set when sweep removed the record: a delivery that found
	// it just before looks it up again.
	dropped bool
	// asking is the epoch whose earlier deliveries the other proxies are
	// asked for (0: none), until askingUntil at the latest.
	asking      uint64
	askingUntil time.Time
}

type recentDelivery struct {
	id mirror.MessageID
	at time.Time
}

// promotedSet is what a queue delivered in the keepRecent before a
// promotion, kept until the new master had time to deliver it again.
type promotedSet struct {
	ids   *idSet
	until time.Time
}

func NewDeliveredIDs() *DeliveredIDs {
	return &DeliveredIDs{queues: make(map[mirror.QueueID]*queueDeliveries)}
}

// AskPeers makes the record ask the other proxies of a sidecar cluster
// what they delivered before a queue's epoch: the returned channel carries
// the questions, for whoever asks them to call Answered with what comes
// back. A question that finds the channel full is not asked; the queue's
// deliveries are flagged for askBound then. Call it before the first
// delivery.
func (d *DeliveredIDs) AskPeers(backlog int) <-chan PeerAsk {
	d.asks = make(chan PeerAsk, backlog)
	return d.asks
}

// Delivering records that the message id of queue q is being delivered while
// the queue is at epoch, and reports whether it was delivered before (or
// may have been: the other proxies are being asked).
// mirrored says whether the queue has slaves: a queue without any starts no
// record (nothing can be promoted), but one it has is kept, since the queue
// may have lost its slaves in the promotion that matters.
func (d *DeliveredIDs) Delivering(q mirror.QueueID, epoch uint64, mirrored bool, id mirror.MessageID, now time.Time) bool {
	r, created := d.record(q, epoch, mirrored)
	if r == nil {
		return false
	}
	defer r.mu.Unlock()
	if r.advance(epoch, now) || created {
		d.ask(q, r, epoch, now)
	}
	before := r.asking == epoch && now.Before(r.askingUntil)
	if !r.recent.Add(id) {
		return true
	}
	r.order = append(r.order, recentDelivery{id: id, at: now})
	for i := range r.promoted {
		if r.promoted[i].ids.Delete(id) {
			return true
		}
	}
	return before
}

// ask puts the question of what the other proxies delivered of q before
// epoch, when there are other proxies and a promotion (epoch 0 has none
// before it). Call with r.mu held.
func (d *DeliveredIDs) ask(q mirror.QueueID, r *queueDeliveries, epoch uint64, now time.Time) {
	if d.asks == nil || epoch == 0 {
		return
	}
	// Answered ends the wait: an asker calls it within AskWait of taking
	// the question, which may wait for an asker while they are busy (a
	// whole node's queues promoted at once). The bound is for a question
	// never asked.
	r.asking, r.askingUntil = epoch, now.Add(askBound)
	select {
	case d.asks <- PeerAsk{Queue: q, Epoch: epoch}:
	default:
	}
}

// Answered takes in what the other proxies delivered of queue q before
// epoch, the answer to a PeerAsk: a later delivery of one of ids is
// flagged as this proxy's own would be. Call it whether the question was
// answered or not, so that the queue's deliveries are no longer all
// flagged.
func (d *DeliveredIDs) Answered(q mirror.QueueID, epoch uint64, ids []mirror.MessageID, now time.Time) {
	r, _ := d.record(q, epoch, true)
	defer r.mu.Unlock()
	if r.asking == epoch {
		r.asking = 0
	}
	if len(ids) == 0 {
		return
	}
	set := newIDSet()
	for _, id := range ids {
		set.Add(id)
	}
	r.promoted = append(r.promoted, promotedSet{ids: set, until: now.Add(keepPromoted)})
	if len(r.promoted) > maxPromotions {
		r.promoted = r.promoted[1:]
	}
}

// DeliveredBefore returns the messages of queue q this proxy delivered
// while the queue's epoch was below epoch, as far as it remembers them (at
// most maxAnswer), for another proxy's PeerAsk. What the record holds from
// earlier promotions, other proxies' answers included, comes too: a flag
// too many is harmless.
func (d *DeliveredIDs) DeliveredBefore(q mirror.QueueID, epoch uint64) []mirror.MessageID {
	d.mu.RLock()
	r := d.queues[q]
	d.mu.RUnlock()
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []mirror.MessageID
	add := func(set *idSet) {
		set.All(func(id mirror.MessageID) bool {
			if len(out) == maxAnswer {
				return false
			}
			out = append(out, id)
			return true
		})
	}
	if r.epoch < epoch {
		add(r.recent)
	}
	for i := len(r.promoted) - 1; i >= 0; i-- {
		add(r.promoted[i].ids)
	}
	return out
}

// record returns q's record, locked, and whether this call created it; nil
// when there is none and mirrored is false.
func (d *DeliveredIDs) record(q mirror.QueueID, epoch uint64, mirrored bool) (r *queueDeliveries, created bool) {
	for {
		d.mu.RLock()
		r = d.queues[q]
		d.mu.RUnlock()
		created = false
		if r == nil {
			if !mirrored {
				return nil, false
			}
			d.mu.Lock()
			if r = d.queues[q]; r == nil {
				r = &queueDeliveries{epoch: epoch, recent: newIDSet()}
				d.queues[q] = r
				created = true
			}
			d.mu.Unlock()
		}
		r.mu.Lock()
		if !r.dropped {
			return r, created
		}
		r.mu.Unlock()
	}
}

// advance moves the record to epoch and forgets what no longer matters. It
// reports whether the epoch rose (changed, for a queue deleted and declared
// again).
func (r *queueDeliveries) advance(epoch uint64, now time.Time) (rose bool) {
	if epoch != r.epoch {
		rose = true
		if r.recent.Len() > 0 {
			r.promoted = append(r.promoted, promotedSet{ids: r.recent, until: now.Add(keepPromoted)})
			if len(r.promoted) > maxPromotions {
				r.promoted = r.promoted[1:]
			}
			r.recent = newIDSet()
			r.order, r.head = nil, 0
		}
		r.epoch = epoch
	}
	for r.head < len(r.order) && (now.Sub(r.order[r.head].at) > keepRecent || len(r.order)-r.head > maxRecent) {
		r.recent.Delete(r.order[r.head].id)
		r.order[r.head] = recentDelivery{}
		r.head++
	}
	if r.head > len(r.order)/2 {
		r.order = append(r.order[:0], r.order[r.head:]...)
		r.head = 0
	}
	for len(r.promoted) > 0 && (now.After(r.promoted[0].until) || r.promoted[0].ids.Len() == 0) {
		r.promoted = r.promoted[1:]
	}
	if r.asking != 0 && !now.Before(r.askingUntil) {
		r.asking = 0 // a question never asked, or whose answer is lost
	}
	return rose
}

func (r *queueDeliveries) empty() bool {
	return r.recent.Len() == 0 && len(r.promoted) == 0 && r.asking == 0
}

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
		if ok && r.advance(meta.Epoch, now) {
			d.ask(q, r, meta.Epoch, now)
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
