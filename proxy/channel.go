package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// channelState is the proxy's view of one client channel. The client read
// loop and the read loop of every link that serves the channel touch it; mu
// guards the fields below it, and the decode scratch structs are used by the
// client read loop only (each link has its own, see link).
type channelState struct {
	id uint16

	// confirming is set once the client sent confirm.select (the link read
	// loops read it for every confirm).
	confirming atomic.Bool
	// ownConfirms is set once the proxy put the channel's backend sides in
	// confirm mode itself, at its first publish to several copies, the
	// client having selected neither confirms nor transactions: the
	// backends' confirms then tell the proxy which slave copies may lack a
	// publish (Mirror.Missed) and never reach the client.
	ownConfirms atomic.Bool

	// Client read loop only.
	//
	// dropContent is set while the content frames that follow belong to a
	// method the proxy discarded; publisher is the channel's publishing
	// side (publish.go).
	dropContent bool
	publisher   publisher
	// timed is set when the client's publishes are timed to their acks
	// (selectConfirms with an observer).
	timed bool
	// qos is the client's last basic.qos, repeated on every link the
	// channel opens on later.
	qos *frames.BasicQos

	// outMu serialises what the link read loops write to the client on this
	// channel: a message's frames go out together, and delivery tags and
	// confirms in the order they were assigned. Taken before mu.
	outMu sync.Mutex

	// mu guards the channel's consumers, its delivery tags, its publisher
	// confirms and the close in progress, each a type of its own held by
	// value: the confirms take mu in their own methods (they hold a
	// pointer to it), the others' methods are called with mu held, by
	// channelState's methods only. It guards too the commit of a kept
	// transaction (tx) and the reply counts of the channel's requests
	// (rpcGroup, rpc.go). One lock, since several of them change together:
	// a lost link drops consumers and settles confirms in one step, and a
	// settlement in a transaction changes the tags and the transaction's
	// record.
	mu         sync.Mutex
	consumers  channelConsumers
	deliveries channelDeliveries
	confirms   channelConfirms
	handshake  closeHandshake
	// transactional is set once the client sent tx.select: the client loop
	// writes it under mu, and reads it (as does whoever holds the send
	// gate) without.
	transactional bool
	// tx is the transaction the proxy keeps itself, on a channel in its own
	// confirm mode (txemulated.go).
	tx emulatedTx

	// closing is the channel's close state (chanClosing…), set under mu and
	// read on every frame.
	closing atomic.Uint32

	// Scratch for the client read loop.
	clientAck     frames.BasicAck
	clientNack    frames.BasicNack
	clientReject  frames.BasicReject
	clientConsume frames.BasicConsume
	clientGet     frames.BasicGet
	clientQueue   queueMethod
	trims         []ledger.Trimmed
	reachable     []*link
}

func newChannelState(id uint16) *channelState {
	ch := &channelState{id: id}
	ch.consumers.byTag = make(map[string]consumer)
	ch.confirms.mu = &ch.mu
	ch.publisher.ch = ch
	return ch
}

// selectConfirms puts the channel in confirm mode for the client; on a
// channel the proxy already numbers publishes on, the client's first
// publish is 1. With observe set, each publish's wait for its ack is
// observed, in seconds.
func (ch *channelState) selectConfirms(observe func(seconds float64)) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !ch.confirming.Load() {
		ch.confirms.publishes.ClientSelected()
		if observe != nil {
			ch.confirms.publishes.ObserveLatency(observe)
			ch.timed = true
		}
	}
	ch.confirming.Store(true)
}

// arrival is when the client's publish arrived, for its ack's latency: now
// on a timed channel in confirm mode, zero (not timed) otherwise. The
// client read loop calls it once per publish, before numbering it.
func (ch *channelState) arrival() time.Time {
	if ch.timed && ch.confirming.Load() {
		return time.Now()
	}
	return time.Time{}
}

// selectTransactions records the client's tx.select: from now on the
// deliveries it settles are kept until the transaction ends.
func (ch *channelState) selectTransactions() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.transactional = true
}

// endTransaction applies tx.commit or tx.rollback to the deliveries the
// transaction settled: a rollback makes them outstanding again, a commit
// hands them to commit (which trims their slave copies) under the lock.
func (ch *channelState) endTransaction(rollback bool, commit func([]ledger.TagEntry, []trimKind)) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.deliveries.endTransaction(rollback, commit)
}

// forgetDeliveries voids every outstanding delivery tag, after
// basic.recover-async, and returns the mirrored messages among them, which
// the brokers take back.
func (ch *channelState) forgetDeliveries() []ledger.Trimmed {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	taken := ch.deliveries.tags.AppendMirrored(nil, -1)
	ch.deliveries.tags.DropAll()
	return taken
}

// outstandingMirrored returns the mirrored messages of the deliveries
// awaiting the client's settlement: when the channel ends, the brokers
// take them back.
func (ch *channelState) outstandingMirrored() []ledger.Trimmed {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.deliveries.tags.AppendMirrored(nil, -1)
}

// Consumers (channelConsumers). The client loop adds and cancels them, the
// link loops look them up for every delivery and drop those of a lost
// link, and the failover goroutine moves the orphaned ones: all through
// these methods.

// addConsumer records the consumer with tag.
func (ch *channelState) addConsumer(tag string, cons consumer) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.consumers.byTag[tag] = cons
}

// addReplyConsumer records the channel's consumer of
// amq.rabbitmq.reply-to, on link (replyto.go).
func (ch *channelState) addReplyConsumer(tag string, link int) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.consumers.addReply(tag, link)
}

// takeReplyConsumer reports whether tag is the channel's consumer of
// amq.rabbitmq.reply-to, and if so forgets that it has one.
func (ch *channelState) takeReplyConsumer(tag string) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.consumers.takeReply(tag)
}

// clientCancels returns the consumer the client cancels, if known; one that
// waits for a new master after its link was lost ends here.
func (ch *channelState) clientCancels(tag string) (consumer, bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.consumers.clientCancels(tag)
}

// removeConsumer forgets the consumer with tag.
func (ch *channelState) removeConsumer(tag string) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	delete(ch.consumers.byTag, tag)
}

// brokerCancels applies a broker's basic.cancel of tag on link, and reports
// whether the client is to see it: not when it comes from the old master
// of a consumer that moved.
func (ch *channelState) brokerCancels(tag string, link int) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.consumers.brokerCancels(tag, link)
}

// deliveryConsumer returns the consumer a delivery with tag from link is
// for (the one without a tag when tag is unknown), and whether the delivery
// is stale: from a link its consumer no longer consumes on.
func (ch *channelState) deliveryConsumer(tag string, link int) (cons consumer, stale bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.consumers.forDelivery(tag, link)
}

// orphanMoved makes the consumers of mirrored queues for which moved
// reports true orphans, appended to orphans: they are to consume on their
// queue's new master.
func (ch *channelState) orphanMoved(moved func(consumer) bool, orphans []orphan) []orphan {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.consumers.orphanMoved(ch, moved, orphans)
}

// adoptOrphan records the orphan with tag as consuming again (moved), and
// reports false when the client cancelled it meanwhile.
func (ch *channelState) adoptOrphan(tag string, moved consumer) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.consumers.adoptOrphan(tag, moved)
}

// dropOrphan forgets the consumer with tag for good, and reports whether it
// was still an orphan (false: the client cancelled it itself).
func (ch *channelState) dropOrphan(tag string) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.consumers.dropOrphan(tag)
}

// lostLink forgets what the channel had on link, lost at now, in one step:
// its consumers (with keepMirrored, those of mirrored queues become
// orphans, appended to orphans; the others are returned in cancelled) and
// its unconfirmed publishes (the confirms the loss settles, and the slave
// copies it leaves short). The slices returned are the channel's scratch,
// valid until the next call; the caller holds outMu.
func (ch *channelState) lostLink(link int, keepMirrored bool, now time.Time, orphans []orphan) (_ []orphan, cancelled []string, confirms []ledger.ClientConfirm, missed []ledger.MissedCopy) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	orphans, cancelled = ch.consumers.lostLink(ch, link, keepMirrored, orphans)
	confirms, missed = ch.confirms.lostLinkLocked(link, now)
	return orphans, cancelled, confirms, missed
}

// Delivery tags (channelDeliveries).

// deliver assigns the client's delivery tag for a delivery (see
// ledger.DeliveryTags.Deliver).
func (ch *channelState) deliver(d ledger.Delivered, needsAck bool) uint64 {
	ch.mu.Lock() // no defer: every delivery comes here
	tag := ch.deliveries.tags.Deliver(d, needsAck)
	ch.mu.Unlock()
	return tag
}

// dropDeliveriesFrom voids the outstanding deliveries from link, whose
// broker answered basic.recover, and returns the mirrored messages among
// them, which that broker took back.
func (ch *channelState) dropDeliveriesFrom(link int) []ledger.Trimmed {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	taken := ch.deliveries.tags.AppendMirrored(nil, link)
	ch.deliveries.tags.DropFrom(link)
	return taken
}

// countUnacked adds the channel's deliveries awaiting settlement to counts
// (see ledger.DeliveryTags.CountUnacked).
func (ch *channelState) countUnacked(vhost string, live func(backend int, gen uint64) bool, counts map[mirror.QueueID]int) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.deliveries.countUnacked(vhost, live, counts)
}

// settleDeliveries applies the client's ack, nack or reject of tag: it
// returns the acknowledgements to send to backends (the channel's scratch,
// valid until the next call), how many deliveries it settled, and false
// for an unknown tag. In a
// transaction the settled deliveries are kept, to restore on rollback and
// trim as kind says on commit, and trims comes back nil; otherwise the
// mirrored messages to trim are appended to *trims.
func (ch *channelState) settleDeliveries(tag uint64, multiple bool, kind trimKind, trims *[]ledger.Trimmed) ([]ledger.BackendAck, *[]ledger.Trimmed, int, bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.deliveries.settle(ch.transactional, tag, multiple, kind, trims)
}

// Replies (rpc.go).

// groupReplied counts one reply of g from link from, keeping the primary's
// when g must wait for others or run its after, and another link's as a
// spare (or as the reply once the primary's link was lost); it reports
// whether g is complete and whether this was the primary's reply.
func (ch *channelState) groupReplied(g *rpcGroup, from int, payload []byte) (done, primary bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	g.pending--
	done = g.pending == 0
	primary = from == g.primary
	switch {
	case primary && (!done || g.after != nil):
		g.reply = append([]byte(nil), payload...)
	case g.primary == anyReply && g.reply == nil:
		g.reply = append([]byte(nil), payload...)
	case !primary && g.spare == nil && g.primary != anyReply:
		g.spare = append([]byte(nil), payload...)
	}
	return done, primary
}

// lostAnswer is what a client gets when a link that owed a reply to one
// of its requests is lost (groupLinkLost).
type lostAnswer int

const (
	lostWait       lostAnswer = iota // other links still owe replies, or the client has its answer
	lostReply                        // g.reply, kept from the primary or another copy
	lostSetting                      // g.settingOk, from the proxy
	lostGet                          // get-empty: a basic.get its lost master will never answer
	lostUnanswered                   // no copy can answer: the channel closes with 541
)

// groupLinkLost counts the reply the lost link idx owed to g, and says
// what the client gets now. When idx was the primary, another target's
// reply becomes the client's: the spare kept, or the next to arrive.
func (ch *channelState) groupLinkLost(g *rpcGroup, idx int) lostAnswer {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	g.pending--
	if g.primary == idx {
		if g.get != nil && g.get.queue != nil {
			return lostGet
		}
		g.primary = anyReply
		g.reply, g.spare = g.spare, nil
	}
	switch {
	case g.pending > 0:
		return lostWait
	case g.reply != nil:
		return lostReply
	case g.primary != anyReply:
		// The primary's reply went out already: the client has its
		// answer.
		return lostWait
	case g.settingOk != nil:
		return lostSetting
	}
	return lostUnanswered
}

// groupAbandoned counts a reply of g that will never come, and reports
// whether g is complete.
func (ch *channelState) groupAbandoned(g *rpcGroup) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	g.pending--
	return g.pending == 0
}
