package proxy

import (
	"fmt"
	"log/slog"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// settler settles a connection's messages both ways. The client's acks,
// nacks and rejects go to the links that delivered the messages, with the
// backends' own delivery tags, and the slave copies of what left a master
// are trimmed; the backends' publisher confirms become the client's (or
// answer the proxy's own confirm mode), and what they say of the slave
// copies goes to the engine: a refused publish's copies are dropped, and
// a copy that may lack a publish synchronises again. The bookkeeping is
// the channel's (its delivery tags and publisher confirms, under
// channelState.mu, in its methods); the settler carries out what it
// decides. clientConn holds it by value and the router a pointer to it.
//
// Who uses it:
//
//   - the client loop settles the client's acks (settleMethod, settle,
//     and trimSettled at a commit), and passes on the confirms a publish
//     settled at once (confirmedAtPublish, through the router);
//   - the link read loops pass the backends' confirms on (confirm);
//   - whoever loses a link, and the server's watcher that releases lost
//     copies, pass on the confirms those settle (passConfirms,
//     reportMissed).
//
// Everything but trimIDs and acked is set once by clientConn.open under
// clientConn.mu, before the connection counts as open, and only read
// after; trimIDs and acked belong to the client loop. What it writes to
// the client on a channel goes under the channel's outMu: confirm and
// confirmedAtPublish take it, passConfirms and ownConfirmsAnswered
// (txemulated.go: the confirms of the proxy's own confirm mode, which
// answer a kept transaction's commit) are called with it held.
type settler struct {
	srv    *Server // the backends' names, the counts
	mirror Mirror  // nil without mirroring
	links  *linkSet
	log    *slog.Logger
	// out is the connection's clientOut, a copy: it keeps no state.
	out clientOut
	// The connection's own work: writeFailed handles a failed write to a
	// link (linkKeeper.writeFailed), closeChannel closes a channel for a
	// reason the proxy found (clientConn.closeChannelByProxy).
	writeFailed  func(l *link, err error)
	closeChannel func(ch *channelState, code uint16, text string, classID, methodID uint16)
	// Client loop only: scratch for trim, and the acked messages not yet
	// told to the engine (flushAcked).
	trimIDs []mirror.MessageID
	acked   []ledger.Trimmed
}

// trimKind is what settling a delivery does to the slave copies of its
// message.
type trimKind uint8

const (
	trimNone   trimKind = iota // requeued: the copies stay, their TTL runs again
	trimAck                    // acked: the copies are acked
	trimReject                 // rejected without requeue: the copies are rejected too, to be dead-lettered
)

// outcome is what the engine is told of the master's copies.
func (k trimKind) outcome() mirror.Outcome {
	switch k {
	case trimAck:
		return mirror.Acked
	case trimReject:
		return mirror.Rejected
	}
	return mirror.Requeued
}

// settleMethod decodes basic.ack, basic.nack or basic.reject and settles
// the deliveries it names.
func (s *settler) settleMethod(ch *channelState, f frames.Frame, key uint32, args []byte) error {
	switch key {
	case frames.BasicAckKey:
		if err := ch.clientAck.Decode(args); err != nil {
			return err
		}
		return s.settle(ch, f, key, ch.clientAck.DeliveryTag, ch.clientAck.Multiple, false)
	case frames.BasicNackKey:
		if err := ch.clientNack.Decode(args); err != nil {
			return err
		}
		return s.settle(ch, f, key, ch.clientNack.DeliveryTag, ch.clientNack.Multiple, ch.clientNack.Requeue)
	default:
		if err := ch.clientReject.Decode(args); err != nil {
			return err
		}
		return s.settle(ch, f, key, ch.clientReject.DeliveryTag, false, ch.clientReject.Requeue)
	}
}

// settle passes a client's basic.ack, basic.nack or basic.reject to the
// backends of the deliveries it settles, with their own delivery tags; the
// slave copies of the messages it removes from their masters are trimmed.
func (s *settler) settle(ch *channelState, f frames.Frame, key uint32, tag uint64, multiple, requeue bool) error {
	kind := trimNone
	switch {
	case key == frames.BasicAckKey:
		kind = trimAck
	case !requeue:
		kind = trimReject
	}
	var trims *[]ledger.Trimmed
	if s.mirror != nil {
		ch.trims = ch.trims[:0]
		trims = &ch.trims
	}
	acks, trims, settled, ok := ch.settleDeliveries(tag, multiple, kind, trims)
	if kind == trimAck && settled > 0 {
		s.srv.stats.Acks.Add(uint64(settled))
	}
	if !ok {
		classID, methodID := uint16(key>>16), uint16(key)
		s.closeChannel(ch, frames.PreconditionFailed,
			fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", tag), classID, methodID)
		return nil
	}
	if trims != nil && len(*trims) > 0 {
		s.trim(*trims, kind.outcome())
	}
	if len(acks) == 1 && acks[0].BackendTag == tag && acks[0].Multiple == multiple {
		if l := s.links.at(acks[0].Backend); l != nil && l.gen == acks[0].Gen {
			if err := l.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
				s.writeFailed(l, err)
			}
		}
		return nil
	}
	for _, a := range acks {
		l := s.links.at(a.Backend)
		if l == nil || l.gen != a.Gen {
			continue // the delivery's link is gone, and its broker requeued it
		}
		var m frames.Method
		switch key {
		case frames.BasicAckKey:
			m = &frames.BasicAck{DeliveryTag: a.BackendTag, Multiple: a.Multiple}
		case frames.BasicNackKey:
			m = &frames.BasicNack{DeliveryTag: a.BackendTag, Multiple: a.Multiple, Requeue: requeue}
		default:
			m = &frames.BasicReject{DeliveryTag: a.BackendTag, Requeue: requeue}
		}
		if err := l.sock.WriteMethod(f.Channel, m); err != nil {
			s.writeFailed(l, err)
		}
	}
	return nil
}

// trimSettled trims the mirrored messages among tx-settled entries, at
// commit, each as kinds says.
func (s *settler) trimSettled(entries []ledger.TagEntry, kinds []trimKind) {
	if s.mirror == nil {
		return
	}
	for _, kind := range []trimKind{trimAck, trimReject, trimNone} {
		var trims []ledger.Trimmed
		for i, e := range entries {
			if e.Queue != nil && kinds[i] == kind {
				trims = append(trims, ledger.Trimmed{Queue: e.Queue, ID: e.ID})
			}
		}
		s.trim(trims, kind.outcome())
	}
}

// trim tells the engine what became of messages at their masters (acked,
// rejected without requeue, or requeued), one call per queue. Acks wait
// for flushAcked: a consumer that acks each message sends dozens of acks
// in one read, and one call for them all costs the engine and the
// trimmers (and, in a sidecar cluster, the peers) what one ack did.
func (s *settler) trim(trims []ledger.Trimmed, outcome mirror.Outcome) {
	if outcome == mirror.Acked {
		s.acked = append(s.acked, trims...)
		return
	}
	s.flushAcked()
	s.trimIDs = byQueue(trims, s.trimIDs, func(q *ledger.QueueRef, ids []mirror.MessageID) {
		s.mirror.Settle(q.ID, ids, outcome)
	})
}

// flushAcked tells the engine of the acks trim kept back. The client loop
// calls it when it has read everything the client sent (with the flush of
// the acks to the masters), before any method other than an ack, and when
// it ends, so that the engine hears of everything in the client's order.
func (s *settler) flushAcked() {
	if len(s.acked) == 0 {
		return
	}
	s.trimIDs = byQueue(s.acked, s.trimIDs, func(q *ledger.QueueRef, ids []mirror.MessageID) {
		s.mirror.Settle(q.ID, ids, mirror.Acked)
	})
	clear(s.acked) // drops the queues' references
	s.acked = s.acked[:0]
}

// byQueue calls f once per queue of messages, with the identities of that
// queue's messages in ids (scratch, reused from one call to the next, and
// returned for the caller to keep). It reorders messages.
func byQueue(messages []ledger.Trimmed, ids []mirror.MessageID, f func(q *ledger.QueueRef, ids []mirror.MessageID)) []mirror.MessageID {
	for len(messages) > 0 {
		q := messages[0].Queue
		ids = ids[:0]
		rest := messages[:0]
		for _, m := range messages {
			if m.Queue == q {
				ids = append(ids, m.ID)
			} else {
				rest = append(rest, m)
			}
		}
		f(q, ids)
		messages = rest
	}
	return ids
}

// takenBack tells the engine that the brokers took back the master's
// copies of messages a client had not settled (its channel or connection
// ended, basic.recover): they are ready again, and their TTL applies again
// (mirror.Requeued). Any goroutine may call it: unlike trim it keeps no
// scratch.
func (s *settler) takenBack(messages []ledger.Trimmed) {
	if s.mirror == nil {
		return
	}
	byQueue(messages, nil, func(q *ledger.QueueRef, ids []mirror.MessageID) {
		s.mirror.Settle(q.ID, ids, mirror.Requeued)
	})
}

// confirm turns a backend's publisher confirm into the client's; in the
// proxy's own confirm mode (ownConfirms) it tells the client nothing.
func (s *settler) confirm(ch *channelState, l *link, f frames.Frame, seq uint64, multiple, nack bool) {
	own := !ch.confirming.Load()
	if own && !ch.ownConfirms.Load() {
		return
	}
	ch.outMu.Lock()
	defer ch.outMu.Unlock()
	out, missed, refused := ch.confirms.applyConfirm(l.idx, seq, multiple, nack, l.confirmed[:0], l.missed[:0], l.refused[:0])
	l.confirmed, l.missed, l.refused = out, missed, refused
	if len(missed) > 0 {
		s.reportMissed(missed, "nacked")
	}
	if len(refused) > 0 {
		s.dropRefused(refused)
	}
	if own {
		s.ownConfirmsAnswered(ch, out)
		return
	}
	if len(out) == 1 && out[0] == (ledger.ClientConfirm{Seq: seq, Multiple: multiple, Nack: nack}) {
		s.out.frame(f)
		return
	}
	for _, cc := range out {
		s.out.confirm(ch.id, cc)
	}
}

// confirmedAtPublish passes on the confirms a publish settled at once, the
// links of its copies being lost (the router calls it): the client's, or
// those of the proxy's own confirm mode.
func (s *settler) confirmedAtPublish(ch *channelState, out []ledger.ClientConfirm) {
	if !ch.confirming.Load() {
		ch.outMu.Lock()
		s.ownConfirmsAnswered(ch, out)
		ch.outMu.Unlock()
		return
	}
	for _, cc := range out {
		ch.outMu.Lock()
		s.out.confirm(ch.id, cc)
		ch.outMu.Unlock()
		s.out.flush()
	}
}

// passConfirms passes on confirms that a lost link or a released copy
// settled: to the client, or to the proxy's own confirm mode. The caller
// holds outMu.
func (s *settler) passConfirms(ch *channelState, out []ledger.ClientConfirm) {
	if !ch.confirming.Load() {
		s.ownConfirmsAnswered(ch, out)
		return
	}
	for _, cc := range out {
		s.out.confirm(ch.id, cc)
	}
}

// dropRefused removes from the slaves the copies of publishes their
// queue's master nacked. The master's broker refused them (an overflow of
// reject-publish or reject-publish-dlx: RabbitMQ counts only ready
// messages towards x-max-length, and a slave's trimmer holds every copy
// unacknowledged, so the slaves' brokers never refuse), and the client
// heard the nack: kept, a slave's copy would stay for ever, and be
// delivered after a promotion. Under reject-publish-dlx the master's broker
// dead-letters the refused publish, so the slaves' copies are rejected, for
// each broker to dead-letter its own into its copies of the targets.
func (s *settler) dropRefused(refused []ledger.RefusedPublish) {
	m := s.mirror
	for len(refused) > 0 {
		queue := refused[0].Queue
		ids := make([]mirror.MessageID, 0, len(refused))
		rest := refused[:0]
		for _, r := range refused {
			if *r.Queue == *queue {
				ids = append(ids, r.ID)
			} else {
				rest = append(rest, r)
			}
		}
		refused = rest
		outcome := mirror.Acked
		if meta, ok := m.Lookup(*queue); ok && mirror.RefusalDeadLettered(meta.Arguments) {
			outcome = mirror.Rejected
		}
		m.Settle(*queue, ids, outcome)
	}
}

// reportMissed tells the engine which slave copies may lack a publish, so
// that they stop counting as synchronised (they rejoin as the youngest
// slave and synchronise again, as a RabbitMQ mirror that missed messages
// would restart). why is "nacked" or "link lost".
func (s *settler) reportMissed(missed []ledger.MissedCopy, why string) {
	for _, m := range missed {
		backend := s.srv.backends[m.Backend].Name
		var queue *mirror.QueueID // nil: any queue with a slave there
		if m.Queue != ledger.AnyQueue {
			queue = m.Queue
		}
		s.log.Warn("a slave copy may lack publishes; it synchronises again", "backend", backend, "queue", queueName(queue), "why", why)
		s.mirror.Missed(backend, queue)
	}
}

func queueName(q *mirror.QueueID) string {
	if q == nil {
		return "(any reached by an exchange publish)"
	}
	return q.Name
}
