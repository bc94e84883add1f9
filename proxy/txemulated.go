package proxy

import (
	"fmt"
	"sync/atomic"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// A channel the proxy put in confirm mode on the backends itself
// (ownConfirms) can no longer become transactional there: a broker refuses
// tx.select after confirm.select. RabbitMQ lets a client select tx on a
// channel that published before, so the proxy keeps the transaction itself:
// after tx.select, the channel's publishes, acks, nacks and rejects are held
// in the proxy until tx.commit, which sends them as outside a transaction
// and answers commit-ok once every copy the confirms count took the
// transaction's publishes; tx.rollback drops them. The client sees what a
// broker's transaction shows: nothing of the transaction before its commit,
// all of it after commit-ok. What differs: an error a publish would have
// met at once (a missing exchange) closes the channel at the commit.
//
// The channel holds its emulatedTx by value. The client loop keeps the
// transaction through the router (the router methods below): it holds
// what the client sends, answers tx.select and tx.rollback, and at the
// commit replays the held frames through the channel's publisher and the
// settler; the settler answers the commit once the confirms come
// (ownConfirmsAnswered).
type emulatedTx struct {
	on        bool
	held      []frames.Frame // client loop only; payloads copied
	heldBytes int

	// A commit waits (committing) for the confirms of the publishes
	// numbered after from, up to and including to once they were all sent
	// (sent). committing is read without a lock by every confirm of the
	// proxy's own; it and the rest are written under the channel's mu.
	committing atomic.Bool
	sent       bool
	from, to   uint64
	nacked     bool
}

// maxEmulatedTxBytes bounds what one kept transaction holds in the proxy's
// memory. A broker keeps a transaction in memory too, but under its memory
// alarm; the proxy, without one, closes the channel rather than grow
// without bound.
const maxEmulatedTxBytes = 64 << 20

// txRefusedInConfirmMode is RabbitMQ's answer to confirm.select on a
// transactional channel.
const txRefusedInConfirmMode = "PRECONDITION_FAILED - cannot switch from tx to confirm mode"

// fromClientInEmulatedTx handles what the client sends on a channel whose
// transaction the proxy keeps; handled is false for what goes on as usual.
func (rt *router) fromClientInEmulatedTx(ch *channelState, f frames.Frame, key uint32) (handled bool, err error) {
	t := &ch.tx
	switch {
	case f.Type != frames.FrameMethod:
	case key == frames.BasicPublishKey, key == frames.BasicAckKey, key == frames.BasicNackKey, key == frames.BasicRejectKey:
	default:
		return rt.emulatedTxMethod(ch, key)
	}
	if t.heldBytes+len(f.Payload) > maxEmulatedTxBytes {
		t.drop()
		rt.closeChannel(ch, frames.PreconditionFailed, fmt.Sprintf(
			"PRECONDITION_FAILED - transaction larger than the %d MiB amqp-mirror keeps for a channel that published before tx.select; commit more often",
			maxEmulatedTxBytes>>20), frames.ClassBasic, 40)
		ch.dropContent = true
		return true, nil
	}
	t.hold(f)
	return true, nil
}

// emulatedTxMethod handles the methods of a kept transaction but those it
// holds; handled is false for what goes on as usual.
func (rt *router) emulatedTxMethod(ch *channelState, key uint32) (handled bool, err error) {
	t := &ch.tx
	switch key {
	case frames.TxSelectKey:
		rt.out.sendOnChannel(ch, &frames.TxSelectOk{})
	case frames.TxRollbackKey:
		t.drop()
		rt.out.sendOnChannel(ch, &frames.TxRollbackOk{})
	case frames.TxCommitKey:
		return true, rt.commitEmulatedTx(ch)
	case frames.ConfirmSelectKey:
		rt.closeChannel(ch, frames.PreconditionFailed, txRefusedInConfirmMode, frames.ClassConfirm, 10)
	default:
		return false, nil
	}
	return true, nil
}

// beginEmulatedTx answers tx.select on a channel in the proxy's own confirm
// mode.
func (rt *router) beginEmulatedTx(ch *channelState) {
	ch.tx.on = true
	rt.out.sendOnChannel(ch, &frames.TxSelectOk{})
}

// beginCommit starts the commit of the kept transaction: it waits for the
// confirms of the publishes numbered from now on.
func (ch *channelState) beginCommit() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	t := &ch.tx
	t.committing.Store(true)
	t.sent, t.nacked = false, false
	t.from = ch.confirms.publishes.LastSeq()
}

// commitSent records that every publish of the committing transaction was
// sent: the commit is answered once they are all confirmed.
func (ch *channelState) commitSent() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.tx.to, ch.tx.sent = ch.confirms.publishes.LastSeq(), true
}

// commitAnswered applies the confirms out of the proxy's own confirm mode
// to the committing transaction, and reports whether its publishes are all
// answered now (the commit ends) and whether one was nacked.
func (ch *channelState) commitAnswered(out []ledger.ClientConfirm) (done, nacked bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	t := &ch.tx
	if !t.committing.Load() {
		return false, false
	}
	for _, cc := range out {
		if cc.Nack && cc.Seq > t.from {
			t.nacked = true
		}
	}
	done = t.sent && ch.confirms.publishes.AnsweredThrough(t.to)
	if done {
		t.committing.Store(false)
	}
	return done, t.nacked
}

func (t *emulatedTx) hold(f frames.Frame) {
	f.Payload = append([]byte(nil), f.Payload...)
	t.held = append(t.held, f)
	t.heldBytes += len(f.Payload)
}

func (t *emulatedTx) drop() {
	clear(t.held)
	t.held, t.heldBytes = t.held[:0], 0
}

// commitEmulatedTx sends what the transaction held, in the order the client
// sent it, and answers commit-ok once its publishes are confirmed.
func (rt *router) commitEmulatedTx(ch *channelState) error {
	t := &ch.tx
	ch.beginCommit()
	held := t.held
	t.held, t.heldBytes = nil, 0
	for _, f := range held {
		if err := rt.replayHeld(ch, f); err != nil {
			return err
		}
		if ch.closing.Load() != chanOpen {
			return nil // a held frame closed the channel: no commit-ok
		}
	}
	ch.commitSent()
	ch.outMu.Lock()
	rt.settler.ownConfirmsAnswered(ch, nil)
	ch.outMu.Unlock()
	return nil
}

// replayHeld sends one held frame as fromClient would outside a
// transaction.
func (rt *router) replayHeld(ch *channelState, f frames.Frame) error {
	if f.Type != frames.FrameMethod {
		if ch.dropContent {
			return nil
		}
		return ch.publisher.publishContent(rt, f)
	}
	ch.dropContent = false
	classID, methodID, args, err := frames.ParseMethodID(f.Payload)
	if err != nil {
		return err
	}
	switch key := frames.MethodKey(classID, methodID); key {
	case frames.BasicPublishKey:
		return ch.publisher.publish(rt, f, args)
	case frames.BasicAckKey, frames.BasicNackKey, frames.BasicRejectKey:
		return rt.settler.settleMethod(ch, f, key, args)
	}
	return nil
}

// ownConfirmsAnswered sees the confirms of the proxy's own confirm mode
// that out answers, and a commit of an emulated transaction whose publishes
// are all answered now gets its commit-ok, or, if a master refused one of
// them, the channel is closed with 541. The caller holds outMu.
func (s *settler) ownConfirmsAnswered(ch *channelState, out []ledger.ClientConfirm) {
	t := &ch.tx
	if !t.committing.Load() {
		return
	}
	done, nacked := ch.commitAnswered(out)
	switch {
	case !done:
	case nacked:
		// closeChannel writes to the client on this channel, which
		// needs outMu, held here.
		go s.closeChannel(ch, frames.InternalError,
			"INTERNAL_ERROR - a backend refused a message of the transaction; the transaction's other messages may have been delivered",
			frames.ClassTx, 20)
	default:
		s.out.method(ch.id, &frames.TxCommitOk{})
		s.out.flush()
	}
}
