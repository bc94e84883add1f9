// Package controllink is the proxy's own links to the backends, on the
// account in each backend's URL (never a client's), carried out with
// amqp091-go: the I/O side of the engine in package mirror. Only the
// trimmers' deliveries bypass it, read by the connection's Tap (tap.go).
//
// A Watcher keeps one connection to each backend and says when a backend
// goes down and comes back. A Trimmer keeps one slave copy in step with its
// master: it consumes the slave's copy and holds every delivery
// unacknowledged, keyed by the message's identity (mirror.IdentityHeader),
// until the master's copy of that message is gone (acked, or rejected
// without requeue, by a client); then it acks the slave's copy, or rejects
// it without requeue for the slave's broker to dead-letter it as the
// master's did (see "Dead-lettering" in mirror/doc.go). A message
// without that header (it was on the broker before the proxy, or was
// published past it) is keyed by its content (mirror.ContentID), so that
// adopted queues are trimmed too. Holding is
// what lets a slave be promoted with every message the master still had:
// closing the trimmer's channel requeues them all on the slave. A held
// delivery whose TTL passes (the queue's x-message-ttl, or its own
// expiration) is given back with a requeue for the slave's broker to
// expire, and dead-letter, as the master's broker did (expiry.go).
package controllink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TrimmerOptions configure a Trimmer; zero values take the defaults.
type TrimmerOptions struct {
	// Recycle is how often the trimmer gives back what it holds and consumes
	// afresh. RabbitMQ closes a channel whose oldest unacknowledged delivery
	// is older than consumer_timeout (30 minutes by default since 3.8.15);
	// recycling well inside it means a queue whose messages wait for hours
	// never trips it. Default 10 minutes.
	Recycle time.Duration
	// Retry is the pause before reopening a channel the broker closed, or
	// retrying a consume that failed. Default 250ms.
	Retry time.Duration
	// ForgetAfter is how long a settlement waits for its slave copy. A copy
	// that has not arrived by then never will: the slave joined after the
	// message was published, and the sync that brought the older messages
	// did not bring this one because the master had settled it. Default 10
	// minutes, far beyond the time a slave takes to deliver its backlog.
	ForgetAfter time.Duration
	// ConsumerTag names the trimmer's consumer on the slave broker, so that
	// an operator listing consumers can tell it apart from clients.
	// Default "amqp-mirror-trimmer".
	ConsumerTag string
	// AckDelay is how long a decided ack may wait for others to share its
	// frame: the trimmer acks what is settled at most this long after the
	// first of it, as one multiple ack where the slave's order allows. One
	// basic.ack per message costs the slave's broker (and the proxy) as much
	// as the delivery did; batched, a slave under full load takes tens of
	// messages per ack. Default 10ms: a settled message stays on the slave
	// that much longer, far below what a failover takes to notice.
	AckDelay time.Duration
	// AckBatch is how many decided acks are flushed at once, without
	// waiting for AckDelay. Default 512.
	AckBatch int
	// MessageTTL is the queue's x-message-ttl (see QueueTTL); zero for
	// none. With it, and with each message's expiration property, the
	// trimmer gives back a held delivery once it has expired, for the
	// slave broker to expire (and dead-letter) it as the master did: a
	// broker never expires a message it has delivered unacknowledged.
	MessageTTL time.Duration
	// ChannelDeliveries is how many unacknowledged deliveries one channel
	// holds (its prefetch) before the trimmer consumes on a fresh one
	// (default 1024); the older channel keeps what it holds until that is
	// acked, then closes. RabbitMQ 3.x
	// pays for an ack in proportion to the unacknowledged deliveries ahead
	// of it on its channel (rabbit_channel's collect_acks and the queue's
	// subtract_acks walk them), so a channel holding a long-lived block of
	// messages in front of ones settled early (a new slave's copied backlog
	// ahead of the messages clients consume meanwhile) makes every such ack
	// a walk over the block: with 100 000 held, a slave's queue process
	// spent its time in those walks and confirmed publishes at a trickle.
	// Bounding each channel's deliveries bounds the walk.
	ChannelDeliveries int
	// Tap is the connection's delivery tap (Watcher.Tap): with it, the
	// trimmer's deliveries skip amqp091-go (tap.go). Nil reads them
	// through amqp091-go.
	Tap    *Tap
	Logger *slog.Logger
}

func (o TrimmerOptions) withDefaults() TrimmerOptions {
	if o.Recycle <= 0 {
		o.Recycle = 10 * time.Minute
	}
	if o.Retry <= 0 {
		o.Retry = 250 * time.Millisecond
	}
	if o.ForgetAfter <= 0 {
		o.ForgetAfter = 10 * time.Minute
	}
	if o.AckDelay <= 0 {
		o.AckDelay = 10 * time.Millisecond
	}
	if o.AckBatch <= 0 {
		o.AckBatch = 512
	}
	if o.ConsumerTag == "" {
		o.ConsumerTag = "amqp-mirror-trimmer"
	}
	if o.ChannelDeliveries <= 0 {
		o.ChannelDeliveries = 1024
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Trimmer removes from one slave copy the messages its master no longer
// holds. One goroutine owns the channel (consume, ack, recycle); Settle may
// be called from any goroutine and never blocks on the network.
type Trimmer struct {
	conn  *amqp.Connection
	queue string
	opts  TrimmerOptions
	log   *slog.Logger

	mu sync.Mutex
	// held maps the identity of each delivery on the current channel to its
	// delivery tag; settled holds identities settled at the master that the
	// slave has not delivered yet (its copy is still on the way, or behind
	// other messages).
	held    map[mirror.MessageID]uint64
	settled map[mirror.MessageID]settlement
	// byContent holds the deliveries keyed by their content (no identity
	// header), oldest first: two messages with the same body are two
	// messages, so it is a multiset, unlike held.
	byContent map[mirror.MessageID][]uint64
	// missed counts settlements of messages the trimmer had not received
	// (net of those that arrived later): on a slave that joined a queue
	// with a backlog, these are the backlog's messages settled at the
	// master (see mirror.Backlog).
	missed int
	// outstanding is every unacknowledged delivery of the current channel in
	// tag order; the front of it decides when one multiple ack settles many.
	outstanding []outstandingTag
	// toAck are deliveries to ack at the next flush; spareAcks is the
	// batch the last flush sent, emptied, for toAck to fill next.
	toAck     []pendingAck
	spareAcks []pendingAck
	// contentHeld counts the deliveries in byContent.
	contentHeld int
	// trimmed remembers, while a copy into this slave runs (ExpectCopies),
	// the identities already trimmed here, so that a late copy of one of
	// them is dropped instead of kept forever.
	trimmed map[mirror.MessageID]struct{}
	// expiries are the held deliveries that expire, earliest first (see
	// expiry.go); toNack are deliveries to give back at the next flush
	// because they expired.
	expiries expiryQueue
	toNack   []uint64
	// deadlines remembers when each identified message seen expires, across
	// channels: one that comes again (the broker had not expired it yet by
	// its clock, or the channel was replaced) keeps its first expiry
	// instead of starting a new TTL.
	deadlines map[mirror.MessageID]time.Time
	// out are the identities whose master copy a client holds delivered
	// and unsettled (Delivered), and since when: their copies here are not
	// given back at their TTL until the master's is settled or requeued,
	// or until Recycle has passed (the recycle gives them back anyway).
	out map[mirror.MessageID]time.Time

	// channelsLost counts channels the broker closed under the trimmer
	// (consumer_timeout, a channel error), recycles not included.
	channelsLost atomic.Int64
	// givenBack counts deliveries given back because they expired (one
	// message given back early and again later counts twice).
	givenBack atomic.Int64
	// queueMissing is set while consuming fails because the queue does
	// not exist (someone deleted the slave copy, or its broker lost it).
	queueMissing atomic.Bool

	// copies takes CopyTo's requests; job is the copy running, owned by
	// the run goroutine.
	copies chan *copyJob
	job    *copyJob
	// channels are the trimmer's channels on the slave's broker, owned by
	// the run goroutine.
	channels slaveChannels
	// purges takes Purge's requests; purge is the one being carried out.
	purges chan *purgeJob
	purge  *purgeJob

	wake chan struct{} // capacity one: a flush is wanted
	done chan struct{}
	wg   sync.WaitGroup
}

type outstandingTag struct {
	tag   uint64
	acked bool // an ack covering it was decided (sent, or sent at the next flush)
	// sent: it was acked on its own already, so no multiple ack names it:
	// AMQP calls an ack of an unknown tag a channel error. RabbitMQ 3.10
	// lets a multiple ack name one; other brokers need not.
	sent bool
}

// settlement is an identity settled at the master whose slave copy has
// not arrived: when (for ForgetAfter) and how many times (content
// identities can stand for several messages), rejects of them rejections.
type settlement struct {
	at      time.Time
	count   int
	rejects int
}

type pendingAck struct {
	tag uint64
	id  mirror.MessageID
	// duplicate: the ack removes a redundant copy (or a sync marker), not a
	// message settled at the master, so a lost channel must not turn it
	// into a settlement.
	duplicate bool
	// reject: the master's copy was rejected without requeue, so this one
	// is too, for the slave's broker to dead-letter it (see Reject).
	reject bool
}

// StartTrimmer starts trimming queue (on the broker conn is connected to).
// The first consume is attempted before it returns, so a missing queue or a
// refused account is reported at once; later failures are retried until
// Close.
func StartTrimmer(conn *amqp.Connection, queue string, opts TrimmerOptions) (*Trimmer, error) {
	opts = opts.withDefaults()
	t := &Trimmer{
		conn:      conn,
		queue:     queue,
		opts:      opts,
		log:       opts.Logger.With("queue", queue, "component", "trimmer"),
		held:      make(map[mirror.MessageID]uint64),
		settled:   make(map[mirror.MessageID]settlement),
		byContent: make(map[mirror.MessageID][]uint64),
		deadlines: make(map[mirror.MessageID]time.Time),
		out:       make(map[mirror.MessageID]time.Time),
		channels:  newSlaveChannels(conn, queue, opts),
		wake:      make(chan struct{}, 1),
		copies:    make(chan *copyJob),
		purges:    make(chan *purgeJob),
		done:      make(chan struct{}),
	}
	ch, in, err := t.channels.consume(true)
	if err != nil {
		return nil, err
	}
	t.wg.Add(1)
	go t.run(ch, in)
	return t, nil
}

// delivery is what the trimmer reads of one delivery of the slave copy:
// from the tap, or from amqp091-go (fromAMQP).
type delivery struct {
	tag        uint64 // on its channel
	id         mirror.MessageID
	identified bool // id is the identity header's
	marker     bool // a sync marker (SyncMarkerHeader)
	expiration string
	// body is kept for a message without an identity, which is keyed by
	// its content.
	body []byte
	// whole is amqp091-go's delivery, on a channel consumed without the
	// tap; a copy sends it on whole.
	whole *amqp.Delivery
}

func fromAMQP(d amqp.Delivery) delivery {
	value, _ := d.Headers[mirror.IdentityHeader].(string)
	id, identified := mirror.ParseMessageID(value)
	_, marker := d.Headers[SyncMarkerHeader]
	return delivery{
		tag: d.DeliveryTag, id: id, identified: identified, marker: marker,
		expiration: d.Expiration, body: d.Body, whole: &d,
	}
}

// Settle records that the master's copies of ids are gone: the slave's
// copies are acked as soon as the trimmer holds them, batched (AckDelay).
func (t *Trimmer) Settle(ids ...mirror.MessageID) { t.settle(ids, false) }

// Reject records that a client rejected the master's copies of ids
// without requeue: the slave's copies are rejected the same way, as soon
// as the trimmer holds them, so that the slave's broker dead-letters each
// into its own copies of the target queues, as the master's broker did
// (with the queue's x-dead-letter-exchange; without one, a rejection
// drops the message as an ack would).
func (t *Trimmer) Reject(ids ...mirror.MessageID) { t.settle(ids, true) }

// Delivered records that the master delivered its copies of ids to a
// client that has not settled them yet. A broker never expires a message
// it delivered unacknowledged, and the master's broker dead-letters it only
// if it is requeued after its TTL: so the copies held here are not given
// back at their TTL until the master's copies are settled (Settle, Reject)
// or requeued (Requeued), or Recycle has passed. Without it, the slaves'
// brokers would expire, and dead-letter, a message its client acked late.
func (t *Trimmer) Delivered(ids ...mirror.MessageID) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		t.out[id] = now
	}
}

// Requeued records that the master's copies of ids are back in its queue,
// where their TTL applies again: a copy held here whose TTL has passed is
// given back now, for the slave's broker to expire it as the master's
// does.
func (t *Trimmer) Requeued(ids ...mirror.MessageID) {
	now := time.Now()
	due := false
	t.mu.Lock()
	for _, id := range ids {
		if _, out := t.out[id]; !out {
			continue
		}
		delete(t.out, id)
		tag, held := t.held[id]
		if at, expires := t.deadlines[id]; held && expires && !at.After(now) {
			t.expiries.add(expiring{at: now, tag: tag, id: id})
			due = true
		}
	}
	t.mu.Unlock()
	if due {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

func (t *Trimmer) settle(ids []mirror.MessageID, reject bool) {
	t.mu.Lock()
	before := len(t.toAck)
	for _, id := range ids {
		delete(t.deadlines, id)
		delete(t.out, id)
		if tag, ok := t.held[id]; ok {
			delete(t.held, id)
			t.toAck = append(t.toAck, pendingAck{tag: tag, id: id, reject: reject})
			t.rememberTrimmed(id)
			continue
		}
		if t.contentHeld > 0 {
			if tags := t.byContent[id]; len(tags) > 0 {
				t.toAck = append(t.toAck, pendingAck{tag: tags[0], id: id, reject: reject})
				t.dropContent(id)
				continue
			}
		}
		t.missed++
		t.addSettled(id, time.Now(), reject)
	}
	after := len(t.toAck)
	t.mu.Unlock()
	// The run goroutine needs to hear of the first decided ack (it starts
	// the AckDelay timer) and of a full batch, not of each one between:
	// waking it per settlement costs a goroutine switch per message.
	if after > before && (before == 0 || before < t.opts.AckBatch && after >= t.opts.AckBatch) {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// Stats says what the trimmer holds: deliveries kept unacknowledged (the
// slave's copies of messages the master still has) and identities settled
// at the master whose slave copy has not arrived.
func (t *Trimmer) Stats() (held, waiting int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	waiting = 0
	for _, s := range t.settled {
		waiting += s.count
	}
	return len(t.held) + t.contentHeld, waiting
}

// Holds reports whether the trimmer holds the slave's copy of the message
// with identity id (one published with the identity header).
func (t *Trimmer) Holds(id mirror.MessageID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.held[id]
	return ok
}

// Missed is how many settlements named a message the trimmer never
// received, less those whose copy arrived later. For a slave that joined
// a queue with a backlog, it counts the backlog's messages the master
// settled since the trimmer started (messages in flight to the slave when
// they were settled make it briefly too high).
func (t *Trimmer) Missed() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.missed
}

// QueueMissing reports whether the trimmer's last attempt to consume found
// no queue: the slave copy is gone, and the trimmer can do nothing until
// it is declared again.
func (t *Trimmer) QueueMissing() bool { return t.queueMissing.Load() }

// ChannelsLost is how many of its channels the broker closed under the
// trimmer (each one was replaced).
func (t *Trimmer) ChannelsLost() int64 { return t.channelsLost.Load() }

// GivenBack is how many held deliveries the trimmer gave back to the slave's
// broker because they had expired; one the broker delivered again because
// by its clock it had not expired yet counts each time.
func (t *Trimmer) GivenBack() int64 { return t.givenBack.Load() }

// Close stops the trimmer. Its channel closes, so the broker requeues every
// delivery it held: the slave copy keeps all the messages not trimmed yet.
func (t *Trimmer) Close() {
	select {
	case <-t.done:
	default:
		close(t.done)
	}
	t.wg.Wait()
}

// rotate moves consuming to a fresh channel once the current one holds
// ChannelDeliveries deliveries unacknowledged: the consumer is cancelled (what the broker
// sent before its cancel-ok is taken first, in order), and the old channel
// stays open holding its deliveries until they are all acked (closeEmpty).
func (t *Trimmer) rotate(ch *amqp.Channel, in inbox) (*amqp.Channel, inbox, error) {
	tag := t.opts.ConsumerTag
	if in.sink != nil {
		tag = in.sink.tag
	}
	if err := ch.Cancel(tag, false); err != nil {
		return ch, in, fmt.Errorf("cancelling the consumer of a full channel: %w", err)
	}
	for d := range in.deliveries {
		t.take(fromAMQP(d))
	}
	// The cancel-ok came after every delivery of the consumer, so the
	// tap has taken them all by now.
	for _, d := range in.sink.take(nil) {
		t.take(d)
	}
	t.channels.stopTaking(t.channels.current)
	return t.channels.consume(t.job == nil)
}

// unackedOnCurrent is how many deliveries of the consuming channel are not
// known to be acked: once they fill its prefetch it takes nothing more, and
// the trimmer moves on (rotate). A trimmer that acks as fast as it receives
// never fills it, and keeps its channel.
func (t *Trimmer) unackedOnCurrent() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.outstanding) - firstOn(t.outstanding, t.channels.current)
}

// run owns the channel: it records deliveries, flushes acks, and replaces
// the channel when the broker closes it or when it is time to recycle.
func (t *Trimmer) run(ch *amqp.Channel, in inbox) {
	defer t.wg.Done()
	for {
		reason := t.serve(ch, in)
		t.channels.closeAll() // requeues what is held
		t.forgetChannel()
		switch reason {
		case stopClosed:
			t.endCopy(errTrimmerClosed)
			return
		case stopChannelLost:
			t.channelsLost.Add(1)
		case stopForPurge:
			t.endCopy(errors.New("the queue was purged"))
			t.runPurge()
		case stopForCopy:
			// The channel is closed, so everything it held is back in the
			// queue, ahead of the marker the copy publishes now.
			if err := t.job.begin(t.conn, t.queue); err != nil {
				t.endCopy(err)
			}
		}
		var err error
		for {
			if ch, in, err = t.channels.consume(t.job == nil); err == nil {
				t.queueMissing.Store(false)
				break
			}
			// A copy in progress reads through this channel: it cannot go
			// on without one, and its sync tries again later.
			t.endCopy(fmt.Errorf("the slave copy cannot be consumed: %w", err))
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				if !t.queueMissing.Swap(true) {
					t.log.Warn("the slave copy is gone; retrying until the trimmer is closed", "err", err, "retry", t.opts.Retry)
				}
			} else {
				t.log.Warn("trimmer cannot consume; retrying", "err", err, "retry", t.opts.Retry)
			}
			select {
			case <-t.done:
				t.endCopy(errTrimmerClosed)
				return
			case <-time.After(t.opts.Retry):
			}
		}
	}
}

type stopReason int

const (
	stopClosed stopReason = iota
	stopRecycle
	stopChannelLost
	stopForCopy  // a copy begins on a fresh channel
	stopForPurge // the queue is purged with nothing held
)

// serve is the trimmer's one goroutine on ch until it must stop, and says
// why it stopped. It is longer than a function should be, on purpose:
// its timers and the select over every event source share local state
// (what the expiry and ack timers are armed for), and in one place the
// reader sees which event is handled when.
func (t *Trimmer) serve(ch *amqp.Channel, in inbox) stopReason {
	recycle := time.NewTimer(t.opts.Recycle)
	defer recycle.Stop()
	sweep := time.NewTicker(t.opts.ForgetAfter / 4)
	defer sweep.Stop()
	// One timer, set to the earliest expiry among the held deliveries.
	expire := time.NewTimer(time.Hour)
	expire.Stop()
	defer expire.Stop()
	var armed time.Time // what expire is set to; zero when stopped
	// Acks wait up to AckDelay for company (see TrimmerOptions.AckDelay).
	ackTimer := time.NewTimer(time.Hour)
	ackTimer.Stop()
	defer ackTimer.Stop()
	ackArmed := false
	// batch is the last batch of deliveries the tap took, handed back to
	// the sink to fill with the next (deliverySink.take).
	var batch []delivery
	// settle flushes once AckBatch acks are decided, and otherwise makes
	// sure the ack timer runs while any wait.
	settle := func() error {
		switch n := t.decided(); {
		case n >= t.opts.AckBatch:
			ackTimer.Stop()
			ackArmed = false
			return t.flush(ch)
		case n > 0 && !ackArmed:
			ackTimer.Reset(t.opts.AckDelay)
			ackArmed = true
		}
		return nil
	}
	// tookBurst flushes what a burst of deliveries decided, and moves
	// consuming to a fresh channel once the current one is full; stop
	// says the channel is lost.
	tookBurst := func() (stopReason, bool) {
		if err := settle(); err != nil {
			t.log.Warn("trimmer lost its channel", "err", err)
			return stopChannelLost, true
		}
		if t.unackedOnCurrent() >= t.opts.ChannelDeliveries && !t.channels.full() {
			var err error
			if ch, in, err = t.rotate(ch, in); err != nil {
				t.log.Warn("trimmer lost its channel", "err", err)
				return stopChannelLost, true
			}
		}
		return 0, false
	}
	for {
		switch next, ok := t.nextExpiry(); {
		case !ok && !armed.IsZero():
			expire.Stop()
			armed = time.Time{}
		case ok && !next.Equal(armed):
			expire.Reset(time.Until(next))
			armed = next
		}
		var copyCancelled <-chan struct{}
		if t.job != nil {
			copyCancelled = t.job.ctx.Done()
		}
		select {
		case <-t.done:
			t.flush(ch)
			return stopClosed
		case <-recycle.C:
			t.flush(ch)
			return stopRecycle
		case job := <-t.purges:
			t.purge = job
			t.flush(ch)
			return stopForPurge
		case job := <-t.copies:
			if t.job != nil {
				job.result <- copyResult{err: errors.New("a copy of this queue is already running")}
				continue
			}
			t.job = job
			t.flush(ch)
			return stopForCopy
		case now := <-sweep.C:
			t.forgetStale(now)
		case <-expire.C:
			armed = time.Time{}
			if n := t.expireDue(time.Now()); n > 0 {
				t.log.Debug("giving back expired messages for the broker to expire", "count", n)
			}
			if err := t.flush(ch); err != nil {
				t.log.Warn("trimmer lost its channel", "err", err)
				return stopChannelLost
			}
		case <-copyCancelled:
			t.endCopy(t.job.ctx.Err())
		case <-ackTimer.C:
			ackArmed = false
			if err := t.flush(ch); err != nil {
				t.log.Warn("trimmer lost its channel", "err", err)
				return stopChannelLost
			}
		case <-t.wake:
			if err := settle(); err != nil {
				t.log.Warn("trimmer lost its channel", "err", err)
				return stopChannelLost
			}
		case <-in.sink.ready():
			if t.channels.olderLost() {
				t.log.Warn("the broker closed one of the trimmer's older channels; consuming again")
				return stopChannelLost
			}
			batch = in.sink.take(batch)
			for _, d := range batch {
				t.take(d)
			}
			if reason, stop := tookBurst(); stop {
				return reason
			}
		case d, ok := <-in.deliveries:
			if !ok {
				// The broker gave back what the channel held, also what
				// the tap took and the trimmer has not read.
				in.sink.take(nil)
				t.log.Warn("trimmer's channel was closed by the broker; consuming again", "err", t.channels.closeReason())
				return stopChannelLost
			}
			if t.channels.olderLost() {
				t.log.Warn("the broker closed one of the trimmer's older channels; consuming again")
				return stopChannelLost
			}
			t.take(fromAMQP(d))
			// Take the rest of the burst before deciding on a flush.
			for more := true; more; {
				select {
				case d, ok := <-in.deliveries:
					if !ok {
						return stopChannelLost
					}
					t.take(fromAMQP(d))
				default:
					more = false
				}
			}
			if reason, stop := tookBurst(); stop {
				return reason
			}
		}
	}
}

// take handles one delivery of the slave copy: held until the master's copy
// is gone, acked at once when it already is, and during a copy also sent to
// the copy's destination.
func (t *Trimmer) take(d delivery) {
	tag := refOf(t.channels.current, d.tag)
	id, identified := d.id, d.identified
	if d.marker {
		// A marker is never a message: remove it, also one left behind
		// by a copy that ended before it arrived.
		t.settleDelivery(tag, id)
		if t.job != nil && identified && id == t.job.marker {
			// Everything that was in the queue when the copy began has
			// been seen: the marker went in behind it.
			t.endCopy(t.job.finish())
		}
		return
	}
	byContent := !identified
	if byContent {
		id = mirror.ContentID(d.body)
	}
	kept := t.hold(tag, id, byContent)
	if in, expires := expiresIn(t.opts.MessageTTL, d.expiration); kept && expires {
		t.scheduleExpiry(tag, id, byContent, in, time.Now())
	}
	if t.job != nil && kept {
		err := errors.New("a copy read a delivery the tap took") // the copy's channel has no sink (run)
		if d.whole != nil {
			err = t.job.send(*d.whole)
		}
		if err != nil {
			t.endCopy(err)
		}
	}
}

// endCopy answers the running copy, if any.
func (t *Trimmer) endCopy(err error) {
	if t.job == nil {
		return
	}
	t.job.end(err)
	t.job = nil
}

// hold records one delivery and reports whether it is now held. One
// already settled at the master is acked at the next flush; a second copy
// of a message already held (a sync copied what fan-out also delivered) is
// acked at once, so that the slave keeps exactly one. Deliveries keyed by
// content (byContent) are never duplicates of each other: equal bodies
// are as many messages as they are copies.
func (t *Trimmer) hold(tag uint64, id mirror.MessageID, byContent bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.outstanding = append(t.outstanding, outstandingTag{tag: tag})
	if s, gone := t.settled[id]; gone {
		reject := s.rejects > 0
		if s.count <= 1 {
			delete(t.settled, id)
		} else {
			s.count--
			if reject {
				s.rejects--
			}
			t.settled[id] = s
		}
		t.missed-- // it was not missing after all, only late
		t.toAck = append(t.toAck, pendingAck{tag: tag, id: id, reject: reject})
		if !byContent {
			t.rememberTrimmed(id)
		}
		return false
	}
	if byContent {
		t.byContent[id] = append(t.byContent[id], tag)
		t.contentHeld++
		return true
	}
	_, duplicate := t.held[id]
	_, trimmed := t.trimmed[id]
	switch {
	case duplicate || trimmed:
		t.toAck = append(t.toAck, pendingAck{tag: tag, id: id, duplicate: true})
		return false
	}
	t.held[id] = tag
	return true
}

// forgetStale drops settlements whose slave copy never came (ForgetAfter).
func (t *Trimmer) forgetStale(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, s := range t.settled {
		if now.Sub(s.at) >= t.opts.ForgetAfter {
			delete(t.settled, id)
		}
	}
	// A message that expired long ago and did not come again was expired
	// by its broker.
	for id, at := range t.deadlines {
		if now.Sub(at) >= t.opts.ForgetAfter {
			delete(t.deadlines, id)
		}
	}
	// A delivery the master's broker still holds for a client by now
	// went back with the recycles since.
	for id, since := range t.out {
		if now.Sub(since) >= t.opts.Recycle {
			delete(t.out, id)
		}
	}
}

// scheduleExpiry records when a delivery just held expires, in after its
// receipt (expiresIn), which is later than the broker's enqueue, so that
// by then the broker agrees that it expired. One seen before keeps its
// first expiry; if that has passed already (the broker had not expired it
// yet when it was given back), it is given back again after Retry.
func (t *Trimmer) scheduleExpiry(tag uint64, id mirror.MessageID, byContent bool, in time.Duration, now time.Time) {
	at := now.Add(in + expirySlack)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !byContent {
		if first, seen := t.deadlines[id]; seen {
			at = first
			if !first.After(now) {
				at = now.Add(t.opts.Retry)
			}
		} else {
			t.deadlines[id] = at
		}
	}
	t.expiries.add(expiring{at: at, tag: tag, id: id, byContent: byContent})
}

// nextExpiry returns the earliest expiry of a held delivery.
func (t *Trimmer) nextExpiry() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.expiries.next()
}

// expireDue stops holding the deliveries that expired by now and queues
// them to be given back (nacked with requeue) at the next flush. The
// trimmer forgets them: their broker expires them, or, if by its clock
// they have not expired yet, delivers them again to be held anew. It
// returns how many it gave back.
func (t *Trimmer) expireDue(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, e := range t.expiries.due(now) {
		if e.byContent {
			tags := t.byContent[e.id]
			i := slices.Index(tags, e.tag)
			if i < 0 {
				continue // trimmed meanwhile
			}
			if len(tags) == 1 {
				delete(t.byContent, e.id)
			} else {
				t.byContent[e.id] = slices.Delete(tags, i, i+1)
			}
			t.contentHeld--
		} else {
			if tag, ok := t.held[e.id]; !ok || tag != e.tag {
				continue // trimmed meanwhile
			}
			if since, out := t.out[e.id]; out && now.Sub(since) < t.opts.Recycle {
				// Its master copy is with a client: held until that is
				// settled or requeued (Requeued schedules it again).
				t.expiries.add(expiring{at: since.Add(t.opts.Recycle), tag: e.tag, id: e.id})
				continue
			}
			delete(t.out, e.id)
			delete(t.held, e.id)
		}
		t.toNack = append(t.toNack, e.tag)
		n++
	}
	t.givenBack.Add(int64(n))
	return n
}

// ExpectCopies tells the trimmer that a copy into its slave is running (on),
// or is over (off): meanwhile it remembers what it trimmed, since a copy can
// bring a message again after the master settled it.
func (t *Trimmer) ExpectCopies(on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if on {
		t.trimmed = make(map[mirror.MessageID]struct{})
		return
	}
	t.trimmed = nil
}

// addSettled records one settlement whose slave copy has not arrived.
func (t *Trimmer) addSettled(id mirror.MessageID, at time.Time, reject bool) {
	s := t.settled[id]
	s.at = at
	s.count++
	if reject {
		s.rejects++
	}
	t.settled[id] = s
}

// dropContent removes the oldest delivery held under a content identity.
func (t *Trimmer) dropContent(id mirror.MessageID) {
	tags := t.byContent[id]
	if len(tags) <= 1 {
		delete(t.byContent, id)
	} else {
		t.byContent[id] = tags[1:]
	}
	t.contentHeld--
}

func (t *Trimmer) rememberTrimmed(id mirror.MessageID) {
	if t.trimmed != nil {
		t.trimmed[id] = struct{}{}
	}
}

// decided is how many acks and nacks wait for the next flush.
func (t *Trimmer) decided() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.toAck) + len(t.toNack)
}

// settleDelivery acks a delivery that is not to be held at all.
func (t *Trimmer) settleDelivery(tag uint64, id mirror.MessageID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.outstanding = append(t.outstanding, outstandingTag{tag: tag})
	t.toAck = append(t.toAck, pendingAck{tag: tag, id: id, duplicate: true})
}

// flush sends the acks decided since the last flush: one multiple ack for
// the run of settled deliveries at the front of the channel's unacked
// deliveries, single acks for the rest. It is long on purpose: what it
// sends is decided in one section under t.mu and then sent in an order
// that matters (nacks and rejections, multiple acks, single acks), and
// the two halves read as one protocol.
func (t *Trimmer) flush(ch *amqp.Channel) error {
	t.mu.Lock()
	if len(t.toAck) == 0 && len(t.toNack) == 0 {
		t.mu.Unlock()
		return nil
	}
	acks := t.toAck
	t.toAck, t.spareAcks = t.spareAcks[:0], nil
	nacks := t.toNack
	t.toNack = nil
	// A delivery given back or rejected is gone from the channel's
	// unacknowledged ones like one acked on its own: a multiple ack may
	// cover its tag but must not name it.
	for _, tag := range nacks {
		t.markSent(tag)
	}
	for _, a := range acks {
		if a.reject {
			t.markSent(a.tag)
			continue
		}
		i, found := slices.BinarySearchFunc(t.outstanding, a.tag, func(o outstandingTag, tag uint64) int {
			return compareTags(o.tag, tag)
		})
		if found {
			t.outstanding[i].acked = true
		}
	}
	// Per channel, the multiple ack names the last delivery of the acked
	// front that was not acked on its own before: it covers the rest of the
	// front, and those acked before are simply gone at the broker. The
	// outstanding deliveries are sorted by reference, so each channel's
	// are one run of them, oldest first.
	var multiples []uint64 // one reference per channel at most
	kept := 0
	for i := 0; i < len(t.outstanding); {
		seq := channelOf(t.outstanding[i].tag)
		end, _ := slices.BinarySearchFunc(t.outstanding[i:], refOf(seq+1, 0), func(o outstandingTag, ref uint64) int {
			return compareTags(o.tag, ref)
		})
		end += i
		front := i
		var upTo uint64
		for front < end && t.outstanding[front].acked {
			if !t.outstanding[front].sent {
				upTo = t.outstanding[front].tag
			}
			front++
		}
		if upTo != 0 {
			multiples = append(multiples, upTo)
		}
		if kept != front {
			copy(t.outstanding[kept:], t.outstanding[front:end])
		}
		kept += end - front
		i = end
	}
	t.outstanding = t.outstanding[:kept]
	covered := func(ref uint64) bool {
		for _, upTo := range multiples {
			if channelOf(upTo) == channelOf(ref) {
				return ref <= upTo
			}
		}
		return false
	}
	// The others are acked on their own; they stay outstanding (behind a
	// delivery not acked yet) and must not be named by a later multiple ack.
	for _, a := range acks {
		if a.reject || covered(a.tag) {
			continue
		}
		i, found := slices.BinarySearchFunc(t.outstanding, a.tag, func(o outstandingTag, tag uint64) int {
			return compareTags(o.tag, tag)
		})
		if found {
			t.outstanding[i].sent = true
		}
	}
	t.mu.Unlock()

	// The nacks and rejections go first: the multiple ack may cover their
	// tags, and would ack them if they were still unacknowledged.
	for _, ref := range nacks {
		if err := t.channels.of(ch, ref).Nack(tagOf(ref), false, true); err != nil {
			// The channel is gone, and with it every delivery it held
			// went back to the queue: just what the nack was for.
			return t.requeueAcks(acks, fmt.Errorf("nack %d: %w", tagOf(ref), err))
		}
	}
	for _, a := range acks {
		if !a.reject {
			continue
		}
		if err := t.channels.of(ch, a.tag).Nack(tagOf(a.tag), false, false); err != nil {
			return t.requeueAcks(acks, fmt.Errorf("reject %d: %w", tagOf(a.tag), err))
		}
	}
	for _, upTo := range multiples {
		if err := t.channels.of(ch, upTo).Ack(tagOf(upTo), true); err != nil {
			return t.requeueAcks(acks, fmt.Errorf("ack up to %d: %w", tagOf(upTo), err))
		}
	}
	for _, a := range acks {
		if a.reject || covered(a.tag) {
			continue
		}
		if err := t.channels.of(ch, a.tag).Ack(tagOf(a.tag), false); err != nil {
			return t.requeueAcks(acks, fmt.Errorf("ack %d: %w", tagOf(a.tag), err))
		}
	}
	t.channels.closeEmpty(func(seq uint64) bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		i := firstOn(t.outstanding, seq)
		return i < len(t.outstanding) && channelOf(t.outstanding[i].tag) == seq
	})
	t.mu.Lock()
	t.spareAcks = acks[:0]
	t.mu.Unlock()
	return nil
}

// markSent marks an outstanding delivery settled on its own (given back
// or rejected), so that no multiple ack names it.
func (t *Trimmer) markSent(ref uint64) {
	i, found := slices.BinarySearchFunc(t.outstanding, ref, func(o outstandingTag, tag uint64) int {
		return compareTags(o.tag, tag)
	})
	if found {
		t.outstanding[i].acked = true
		t.outstanding[i].sent = true
	}
}

// requeueAcks puts the identities of acks that may not have reached the
// broker back into the settled set: when the channel is gone its deliveries
// come again, and must be acked again.
func (t *Trimmer) requeueAcks(acks []pendingAck, err error) error {
	t.mu.Lock()
	now := time.Now()
	for _, a := range acks {
		if !a.duplicate {
			t.addSettled(a.id, now, a.reject)
			t.missed++ // its delivery comes again and takes this back
		}
	}
	t.mu.Unlock()
	return err
}

// forgetChannel drops what belonged to a closed channel: its delivery tags
// are void, and every delivery it held comes again on the next one. Acks
// that were decided but not sent are kept as settled identities.
func (t *Trimmer) forgetChannel() {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	for _, a := range t.toAck {
		if !a.duplicate {
			t.addSettled(a.id, now, a.reject)
			t.missed++ // its delivery comes again and takes this back
		}
	}
	t.toAck = nil
	t.toNack = nil
	t.expiries = t.expiries[:0]
	clear(t.held)
	clear(t.byContent)
	t.outstanding = t.outstanding[:0]
	t.contentHeld = 0
}

func compareTags(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// purgeJob is one Purge request.
type purgeJob struct {
	result chan purgeResult
}

type purgeResult struct {
	purged int
	err    error
}

// Purge empties the slave copy, for a master that a client purged. A plain
// queue.purge would leave every message the trimmer holds unacknowledged
// (purge removes ready messages only), so the trimmer first gives them
// back by closing its channel, then purges on a fresh channel, forgets the
// settlements waiting for copies that are gone now, and consumes again.
// Messages published to the queue after the master's purge and before this
// one are purged too, as a purge racing a publish on one broker may also
// do. It returns the number of messages purged.
func (t *Trimmer) Purge(ctx context.Context) (int, error) {
	job := &purgeJob{result: make(chan purgeResult, 1)}
	select {
	case t.purges <- job:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-t.done:
		return 0, errTrimmerClosed
	}
	res := <-job.result // the run goroutine answers every accepted job
	if res.err != nil {
		return res.purged, fmt.Errorf("purging queue %q: %w", t.queue, res.err)
	}
	return res.purged, nil
}

// runPurge carries out the accepted purge; the channel that held the
// messages is closed already.
func (t *Trimmer) runPurge() {
	job := t.purge
	t.purge = nil
	t.mu.Lock()
	clear(t.settled)
	clear(t.deadlines)
	clear(t.out)
	t.missed = 0
	t.mu.Unlock()
	ch, err := t.conn.Channel()
	if err != nil {
		job.result <- purgeResult{err: fmt.Errorf("opening a channel: %w", err)}
		return
	}
	defer ch.Close()
	n, err := ch.QueuePurge(t.queue, false)
	job.result <- purgeResult{purged: n, err: err}
}
