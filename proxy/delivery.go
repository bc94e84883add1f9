package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// message is a delivery, get-ok or return being received from one link. Its
// frames reach the client together, once the last one arrived: several links
// may deliver on one client channel, and the frames of two messages must
// never interleave there (see channelState.outMu).
type message struct {
	active    bool
	key       uint32 // the method: basic.deliver, basic.get-ok or basic.return
	method    []byte // the method frame's payload
	header    []byte // the content header's payload, once it came
	body      []byte // the body frames' payloads, one after the other
	sizes     []int  // the size of each body frame
	remaining uint64 // body bytes still to come
	get       *pendingGet
}

func (m *message) begin(key uint32, payload []byte, get *pendingGet) {
	m.active = true
	m.key = key
	m.method = append(m.method[:0], payload...)
	m.header = m.header[:0]
	m.body = m.body[:0]
	m.sizes = m.sizes[:0]
	m.remaining = 0
	m.get = get
}

// content adds a content frame and reports whether the message is complete.
func (m *message) content(f frames.Frame) (complete bool, err error) {
	if f.Type == frames.FrameHeader {
		size, err := frames.HeaderBodySize(f.Payload)
		if err != nil {
			return false, err
		}
		m.header = append(m.header[:0], f.Payload...)
		m.remaining = size
		return size == 0, nil
	}
	m.body = append(m.body, f.Payload...)
	m.sizes = append(m.sizes, len(f.Payload))
	if uint64(len(f.Payload)) >= m.remaining {
		m.remaining = 0
		return true, nil
	}
	m.remaining -= uint64(len(f.Payload))
	return false, nil
}

// deliverer passes the messages the links send to the client: each
// delivery, get-ok and return, once assembled whole (message), gets its
// delivery tag and goes out on its channel. With mirroring it drops what a
// deposed master still delivers, flags what the proxy delivered before
// (the server's record of deliveries, ledger.DeliveredIDs), holds a
// delivery while the metadata log catches up after this proxy stood
// still, and tells the engine which messages left a master and how (lent
// to a client, or acked at once without the client's ack). clientConn
// holds it by value.
//
// Who uses it: the link read loops, each for the messages of its own
// link (messageArrived, from clientConn.fromLink). It keeps no state of
// its own: its fields are set once by clientConn.open under clientConn.mu,
// before the connection counts as open (the server's watcher, which asks
// isOpen first, may start a link's read loop as it loses the home link),
// and only read after. What it delivers is numbered on the channel
// (channelState.mu, in its methods) and written under the channel's
// outMu, which it holds from the tag to the last frame; the scratch it
// decodes in is the link's.
type deliverer struct {
	// ctx ends with the connection; a held delivery waits under it.
	ctx    context.Context
	mirror Mirror // nil without mirroring
	// stats are the server's counters; delivered is the server's record
	// of deliveries of mirrored queues.
	stats     *Stats
	delivered *ledger.DeliveredIDs
	// out is the connection's clientOut, a copy: it keeps no state.
	out clientOut
	// linkFailed ends a link that sent what the proxy cannot deliver, or
	// whose delivery waited too long: linkKeeper.writeFailed, which is
	// linkKeeper.linkFailed without its answer, the func value the
	// connection's other types hold too, made once per connection.
	linkFailed func(l *link, err error)
}

// messageArrived passes a whole delivery, get-ok or return to the client.
// The proxy's delivery tag is assigned and the frames written in one
// critical section, so tags reach the client in order and frames of two
// messages never interleave on the channel.
func (d *deliverer) messageArrived(ch *channelState, l *link, m *message) {
	header, id, hasID, err := stripIdentity(l.headerScratch[:0], m.header)
	if err != nil {
		d.linkFailed(l, err)
		return
	}
	if hasID {
		l.headerScratch = header
	}
	_, _, methodArgs, _ := frames.ParseMethodID(m.method)
	switch m.key {
	case frames.BasicReturnKey:
		d.passReturn(ch, m, header, id, hasID)
	case frames.BasicDeliverKey:
		d.deliver(ch, l, m, methodArgs, header, id, hasID)
	case frames.BasicGetOkKey:
		d.answerGet(ch, l, m, methodArgs, header, id, hasID)
	}
}

// passReturn passes a basic.return on, once per publish however many
// copies the brokers returned it from.
func (d *deliverer) passReturn(ch *channelState, m *message, header []byte, id mirror.MessageID, hasID bool) {
	if hasID && !ch.confirms.returnArrived(id) {
		return
	}
	d.stats.Returns.Add(1)
	ch.outMu.Lock()
	d.out.frame(frames.Frame{Type: frames.FrameMethod, Channel: ch.id, Payload: m.method})
	d.out.content(ch.id, m, header)
	ch.outMu.Unlock()
}

// deliver passes a basic.deliver on to its consumer, unless its queue's
// master moved away from the link's backend.
func (d *deliverer) deliver(ch *channelState, l *link, m *message, methodArgs, header []byte, id mirror.MessageID, hasID bool) {
	deliver := &l.deliver
	if err := deliver.Decode(methodArgs); err != nil {
		d.linkFailed(l, err)
		return
	}
	cons, stale := ch.deliveryConsumer(deliver.ConsumerTag, l.idx)
	meta, inLog := d.queueMeta(cons.queue)
	if inLog && !d.mirror.Current() {
		if err := d.awaitCurrent(); err != nil {
			// Dropped with its link, its broker requeues it.
			if d.ctx.Err() == nil {
				d.linkFailed(l, fmt.Errorf("holding a delivery: the metadata log did not catch up within %v after this proxy stood still: %w", staleHold, err))
			}
			return
		}
		cons, stale = ch.deliveryConsumer(deliver.ConsumerTag, l.idx)
		meta, inLog = d.queueMeta(cons.queue)
	}
	if stale || inLog && meta.Master != l.name {
		// The consumer moved to a new master (or waits for one): what
		// the old master still sends is not delivered, and, never
		// acked, stays on that copy, which rejoins purged. The log may
		// have moved the master before checkMasters moved the consumer
		// (up to masterCheckInterval later): a live old master, drained
		// or handed over, would go on delivering what the new master
		// delivers again, which its trimmer no longer takes.
		return
	}
	d.stats.Deliveries.Add(1)
	queue := d.trimmable(cons.queue, m, hasID, &id)
	// Recorded even when the broker flags it: a later copy the broker
	// delivers as new must find it.
	if hasID && inLog && d.deliveredBefore(cons.queue.ID, meta, id, header) {
		deliver.Redelivered = true
	}
	if !cons.noAck {
		d.lent(queue, meta, id, hasID, header)
	}
	d.write(ch, m, header, ledger.Delivered{Backend: l.idx, Gen: l.gen, BackendTag: deliver.DeliveryTag, Queue: queue, ID: id, From: cons.queue},
		!cons.noAck, deliver, &deliver.DeliveryTag, hasID)
	if cons.noAck && queue != nil {
		d.mirror.Settle(queue.ID, []mirror.MessageID{id}, mirror.Acked)
	}
}

// answerGet answers the client's basic.get with the message its master
// sent.
func (d *deliverer) answerGet(ch *channelState, l *link, m *message, methodArgs, header []byte, id mirror.MessageID, hasID bool) {
	getOk := &l.getOk
	if err := getOk.Decode(methodArgs); err != nil {
		d.linkFailed(l, err)
		return
	}
	meta, inLog := d.queueMeta(m.get.queue)
	// A get-ok answers the client's basic.get: held while the metadata
	// catches up, it is answered whatever comes of that.
	uncertain := false
	if inLog && !d.mirror.Current() {
		uncertain = d.awaitCurrent() != nil
		meta, inLog = d.queueMeta(m.get.queue)
	}
	d.stats.Deliveries.Add(1)
	queue := d.trimmable(m.get.queue, m, hasID, &id)
	// Recorded even when the broker flags it, as a delivery is. A
	// master deposed since it answered (or that may have been) may
	// have handed the message to another consumer meanwhile.
	before := hasID && inLog && d.deliveredBefore(m.get.queue.ID, meta, id, header)
	before = before || inLog && (uncertain || meta.Master != l.name)
	flagged := before && !getOk.Redelivered
	if flagged {
		getOk.Redelivered = true
	}
	if !m.get.noAck {
		d.lent(queue, meta, id, hasID, header)
	}
	d.write(ch, m, header, ledger.Delivered{Backend: l.idx, Gen: l.gen, BackendTag: getOk.DeliveryTag, Queue: queue, ID: id, From: m.get.queue},
		!m.get.noAck, getOk, &getOk.DeliveryTag, flagged)
	if m.get.noAck && queue != nil {
		d.mirror.Settle(queue.ID, []mirror.MessageID{id}, mirror.Acked)
	}
}

// write numbers a delivery or get-ok on its channel and writes it to the
// client, in one critical section under the channel's outMu, so that tags
// reach the client in order and two messages' frames never interleave.
// The backend's method frame goes out as it came when the proxy's tag is
// the backend's (*tag) and nothing in it changed; otherwise method, the
// decoded frame, goes out with the proxy's tag. A message that carried the
// proxy's identity header changed: header is without it.
func (d *deliverer) write(ch *channelState, m *message, header []byte, entry ledger.Delivered, needsAck bool, method frames.Method, tag *uint64, changed bool) {
	ch.outMu.Lock()
	proxyTag := ch.deliver(entry, needsAck)
	if proxyTag == *tag && !changed {
		d.out.frame(frames.Frame{Type: frames.FrameMethod, Channel: ch.id, Payload: m.method})
	} else {
		*tag = proxyTag
		d.out.method(ch.id, method)
	}
	d.out.content(ch.id, m, header)
	ch.outMu.Unlock()
}

// lent tells the engine that the master delivered an expiring message of a
// mirrored queue to a client that will settle it: the slaves' copies are
// not given back to their brokers at the message's TTL meanwhile (the
// master's broker never expires a delivery waiting for its ack). It is
// told before the client sees the message, so that the client's ack
// reaches the trimmers after it.
func (d *deliverer) lent(queue *ledger.QueueRef, meta mirror.QueueMeta, id mirror.MessageID, hasID bool, header []byte) {
	if queue == nil || !hasID || !mirror.SetsMessageTTL(meta.Arguments) && !frames.HasExpiration(header) {
		return
	}
	d.mirror.Settle(queue.ID, []mirror.MessageID{id}, mirror.Delivered)
}

// staleHold bounds how long a link's read loop holds a delivery of a
// mirrored queue while the metadata catches up after this proxy stood
// still (Mirror.AwaitCurrent); past it the link is dropped, and its broker
// requeues what it sent.
const staleHold = 15 * time.Second

// awaitCurrent holds a delivery while the metadata is not known current,
// until it is (its queue may have a new master by then), for staleHold at
// most or until the connection ends.
func (d *deliverer) awaitCurrent() error {
	ctx, cancel := context.WithTimeout(d.ctx, staleHold)
	defer cancel()
	return d.mirror.AwaitCurrent(ctx)
}

// queueMeta returns what the metadata log says about the queue a delivery
// came from; false without mirroring, for no queue or one the log lacks.
// The delivery path asks once per message, for the moved-master check and
// the redelivered flag both.
func (d *deliverer) queueMeta(q *ledger.QueueRef) (mirror.QueueMeta, bool) {
	if q == nil || d.mirror == nil {
		return mirror.QueueMeta{}, false
	}
	return d.mirror.Lookup(q.ID)
}

// deliveredBefore reports whether this proxy delivered the message of queue
// q (meta is its record) before, and records that it delivers it now (see
// internal/ledger/redelivered.go). header is the message's content header
// as the client gets it.
func (d *deliverer) deliveredBefore(q mirror.QueueID, meta mirror.QueueMeta, id mirror.MessageID, header []byte) bool {
	return d.delivered.Delivering(q, meta.Epoch, len(meta.Slaves) > 0, id, time.Now()) && !ledger.DeadLettered(header)
}

// trimmable returns the queue whose slaves drop this message when the
// client settles it, or nil when there is nothing to trim: no mirroring, or
// a queue without slaves. A message without the identity header (it was on
// the broker before the proxy) is identified by its body.
func (d *deliverer) trimmable(q *ledger.QueueRef, m *message, hasID bool, id *mirror.MessageID) *ledger.QueueRef {
	if q == nil || d.mirror == nil {
		return nil
	}
	if hasID {
		return q
	}
	meta, ok := d.mirror.Lookup(q.ID)
	if !ok || len(meta.Slaves) == 0 {
		return nil
	}
	*id = mirror.ContentID(m.body)
	return q
}
