package proxy

import (
	"log/slog"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// When a link is lost, the consumers of mirrored queues that consumed on it
// move to the queue's new master once the engine promoted one: same
// consumer tag, same client channel, nothing for the client to do, as
// RabbitMQ's classic mirroring does. Consumers declared with x-cancel-on-ha-failover get
// basic.cancel instead; so do consumers whose queue has no master again
// within FailoverWait and no live synchronised slave left to promote
// (RabbitMQ cancels the consumers of a queue whose node is down). The
// deliveries of the lost link are void: their tags carry the old link's
// generation, so a late ack of one settles nothing; the new master
// redelivers what clients had not acked, with redelivered set.

// masterCheckInterval is how often a connection with consumers of mirrored
// queues compares their links with their queues' masters.
const masterCheckInterval = 100 * time.Millisecond

// consumerMover moves a connection's consumers of mirrored queues to
// their queue's new master: the consumers of a lost link (orphans, which
// linkLost collects and hands it) and those whose queue's master moved
// while their link stayed up (checkMasters). It cancels, as the client
// sees it, the consumers it cannot move. clientConn holds it by value.
//
// Who uses it: the server's watcher (checkMasters), whoever loses a link
// (move), and the goroutines that move consumers, one per batch of
// orphans, counted in the linkKeeper's loops so that the connection's end
// waits for them. It keeps no state of its own: its fields are set once by
// clientConn.open under clientConn.mu, before the connection counts as
// open (isOpen, which the watcher asks first), and only read after. The
// consumers it moves are the channel's (channelState.mu, in its methods);
// it writes to links holding the connection's send gate, so that no write
// splits a publish, and cancels to the client on the channel's output
// (clientOut.sendOnChannel).
type consumerMover struct {
	srv      *Server // the backends' names, FailoverWait
	mirror   Mirror
	links    *linkSet
	channels *channelTable
	// router reaches the new master, opening its link and the channel on
	// it; locator, the router's, says whether a promotion is still to come.
	router  *router
	locator *queueLocator
	send    *sendGate
	// out is the connection's clientOut, a copy: it keeps no state.
	out clientOut
	log *slog.Logger
	// cancelNotify: the client announced consumer_cancel_notify, so it is
	// told of the consumers cancelled for it.
	cancelNotify bool
	// done is closed when the connection ends; running counts the
	// goroutines that move consumers (linkKeeper.loops).
	done    <-chan struct{}
	running *sync.WaitGroup
	// writeFailed handles a failed write to a link (linkKeeper.writeFailed).
	writeFailed func(l *link, err error)
}

// masterMoved reports whether the queue of cons, a consumer of a mirrored
// queue, has a master other than the backend it consumes on.
func (m *consumerMover) masterMoved(cons consumer) bool {
	meta, ok := m.mirror.Lookup(cons.queue.ID)
	return ok && meta.Master != m.srv.backends[cons.link].Name
}

// checkMasters moves consumers whose queue got a new master while their
// link stayed up (a promotion the engine decided on its own view, or an
// ha-mode nodes hand-over): they are cancelled on the old master's link,
// whose further deliveries are dropped, and consume on the new one.
func (m *consumerMover) checkMasters() {
	var stale []orphan
	m.channels.each(func(ch *channelState) {
		if ch.closing.Load() != chanOpen {
			return
		}
		stale = ch.orphanMoved(m.masterMoved, stale)
	})
	if len(stale) == 0 {
		return
	}
	byOld := make(map[int][]orphan)
	// The client loop may be blocked writing to a slow link while it holds
	// the send gate; the cancels then wait for the move, which takes the
	// gate (the old master's deliveries are dropped meanwhile).
	locked := m.send.tryLock()
	for i := range stale {
		o := &stale[i]
		old := m.links.at(o.cons.link)
		switch {
		case old == nil || !old.channelOpen(o.ch.id):
		case !locked || o.ch.publisher.inContent():
			// Between a publish's frames the channel takes nothing else.
			o.uncancelled = old
		default:
			m.cancelOnOldMaster(old, *o)
		}
		byOld[o.cons.link] = append(byOld[o.cons.link], *o)
	}
	if locked {
		m.send.unlock()
	}
	for idx, orphans := range byOld {
		m.log.Warn("queue master changed under live consumers; moving them", "old", m.srv.backends[idx].Name, "consumers", len(orphans))
		m.move(m.srv.backends[idx].Name, orphans)
	}
}

// orphan is a consumer whose link was lost, or whose queue's master moved.
type orphan struct {
	ch   *channelState
	tag  string
	cons consumer
	// uncancelled is the live link to the queue's old master where the
	// consumer is not cancelled yet; nil when there is none. A consumer
	// left there keeps the messages it was sent unacknowledged, and its
	// tag taken on that channel: moved back to that broker later, its
	// consume would be refused (530, reuse of a consumer tag) and the
	// client's connection closed.
	uncancelled *link
}

// cancelLeftOver cancels o's consumer where checkMasters could not
// (orphan.uncancelled), if that link is still up. Call with the send gate
// held and o's channel not between a publish's frames.
func (m *consumerMover) cancelLeftOver(o orphan) {
	if old := o.uncancelled; old != nil && m.links.at(o.cons.link) == old && old.channelOpen(o.ch.id) {
		m.cancelOnOldMaster(old, o)
	}
}

// cancelOnOldMaster cancels orphan o's consumer on old, the link to its
// queue's old master, swallowing the cancel-ok. Call with the send gate
// held and o's channel not between a publish's frames.
func (m *consumerMover) cancelOnOldMaster(old *link, o orphan) {
	old.expect(o.ch.id, nil) // cancel-ok
	if err := old.sock.WriteMethod(o.ch.id, &frames.BasicCancel{ConsumerTag: o.tag}); err != nil {
		m.writeFailed(old, err)
		return
	}
	old.sock.Flush()
}

type moveOutcome int

const (
	moveWait moveOutcome = iota // no new master yet, or the client is mid-publish
	moveDone                    // moved, cancelled, or nothing left to move
)

// move moves orphans, consumers that consumed on backend lost, to their
// queues' new masters, on a goroutine of its own (moveConsumers).
func (m *consumerMover) move(lost string, orphans []orphan) {
	m.running.Add(1)
	go m.moveConsumers(lost, orphans)
}

// moveConsumers moves orphans to their queues' new masters, waiting for the
// promotions up to FailoverWait. It runs on a goroutine of its own, counted
// in running so that the connection's end waits for it.
func (m *consumerMover) moveConsumers(lost string, orphans []orphan) {
	defer m.running.Done()
	deadline := time.Now().Add(m.srv.opts.FailoverWait)
	for {
		waiting := orphans[:0]
		for _, o := range orphans {
			if m.moveConsumer(lost, o) == moveWait {
				waiting = append(waiting, o)
			}
		}
		orphans = waiting
		if len(orphans) == 0 {
			return
		}
		if time.Now().After(deadline) {
			orphans = m.cancelUnpromoted(lost, orphans)
			if len(orphans) == 0 {
				return
			}
		}
		select {
		case <-m.done:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// cancelUnpromoted cancels the orphans whose queue has no promotion to come
// and returns the others: those whose lost master a live synchronised slave
// is yet to replace. The engine promotes the queues of a lost backend a
// batch at a time, and a broker that masters thousands of queues can take
// longer than FailoverWait to hand them all over; RabbitMQ keeps such a
// queue's consumers, which carry on at the new master.
func (m *consumerMover) cancelUnpromoted(lost string, orphans []orphan) []orphan {
	waiting := orphans[:0]
	for _, o := range orphans {
		if meta, ok := m.mirror.Lookup(o.cons.queue.ID); ok && meta.Master == lost && m.locator.promotionPending(meta) {
			waiting = append(waiting, o)
			continue
		}
		if m.cancelConsumer(o) == moveWait {
			waiting = append(waiting, o)
			continue
		}
		m.log.Warn("no new master for a consumer's queue; cancelled the consumer", "queue", o.cons.queue.ID.Name, "consumer", o.tag, "lost", lost)
	}
	return waiting
}

// moveConsumer moves one orphan if its queue has a new master.
func (m *consumerMover) moveConsumer(lost string, o orphan) moveOutcome {
	if m.channels.get(o.ch.id) != o.ch || o.ch.closing.Load() != chanOpen {
		return moveDone // the channel is gone, and the consumer with it
	}
	meta, ok := m.mirror.Lookup(o.cons.queue.ID)
	if !ok {
		return m.cancelConsumer(o) // the queue is gone
	}
	// While the lost master is down the consumer waits for a new one; a
	// master that is no longer counted down (serf wrongly judged its proxy
	// failed, or its broker came back with nobody promoted) takes it back,
	// on a new link.
	if meta.Master == lost && m.mirror.BackendDown(lost) {
		return moveWait
	}
	if o.cons.cancelOnFailover {
		return m.cancelConsumer(o)
	}
	var consume frames.BasicConsume
	if err := consume.Decode(o.cons.args); err != nil {
		return m.cancelConsumer(o)
	}
	consume.ConsumerTag = o.tag
	// The client loop must not be between a publish's frames on this
	// channel: a consume there would split its content.
	m.send.lock()
	defer m.send.unlock()
	if o.ch.publisher.inContent() {
		return moveWait
	}
	targets := m.router.reach(o.ch, meta.Master)
	if len(targets) == 0 {
		return moveWait
	}
	l := targets[0]
	moved := o.cons
	moved.link = l.idx
	if !o.ch.adoptOrphan(o.tag, moved) {
		return moveDone // the client cancelled it meanwhile
	}
	m.cancelLeftOver(o)
	if !consume.NoWait {
		l.expect(o.ch.id, nil) // consume-ok: the client had its own
	}
	if err := l.sock.WriteMethod(o.ch.id, &consume); err != nil {
		m.writeFailed(l, err)
		return moveDone
	}
	l.sock.Flush()
	m.log.Info("consumer moved to the queue's new master", "queue", meta.ID.Name, "consumer", o.tag, "from", lost, "to", l.name, "epoch", meta.Epoch)
	return moveDone
}

// cancelConsumer ends orphan o's consumer: on its queue's old master, if
// checkMasters left it there (orphan.uncancelled), and for the client, which
// is told that the server cancelled it, as RabbitMQ does when a queue's node
// goes down (a client that announced consumer_cancel_notify; others never
// learn, as with RabbitMQ). It reports moveWait while that old master's
// cancel waits for the client's publish on o's channel to be whole.
func (m *consumerMover) cancelConsumer(o orphan) moveOutcome {
	if o.uncancelled != nil {
		m.send.lock()
		if o.ch.publisher.inContent() {
			m.send.unlock()
			return moveWait
		}
		m.cancelLeftOver(o)
		m.send.unlock()
	}
	m.tellCancelled(o)
	return moveDone
}

// tellCancelled forgets orphan o's consumer and tells the client, if it
// announced consumer_cancel_notify, that the server cancelled it.
func (m *consumerMover) tellCancelled(o orphan) {
	if !o.ch.dropOrphan(o.tag) {
		return // the client cancelled it itself
	}
	if !m.cancelNotify {
		// Without consumer_cancel_notify the client is not told, as
		// RabbitMQ does not tell it: its consumer just gets nothing more.
		return
	}
	if m.channels.get(o.ch.id) != o.ch || o.ch.closing.Load() != chanOpen {
		return
	}
	m.out.sendOnChannel(o.ch, &frames.BasicCancel{ConsumerTag: o.tag, NoWait: true})
}
