package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"

	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// clientLoop reads the client's frames and passes them to the backend,
// acting on the ones that touch proxy state. It returns when the client
// socket is closed.
func (c *clientConn) clientLoop() {
	c.client.WhenDry(c.flushLinks)
	for {
		f, err := c.client.ReadFrame()
		if err == nil {
			c.sendMu.Lock()
			c.runBoundaryLocked()
			err = c.fromClient(f)
			c.runBoundaryLocked()
			c.unlockSend()
		}
		if err != nil {
			c.clientFailed(err)
			return
		}
	}
}

// clientFailed ends the connection after a read error or a frame the
// client should not have sent (a *frames.Error, answered like a broker).
func (c *clientConn) clientFailed(err error) {
	if c.tornDown.Load() {
		return
	}
	var fe *frames.Error
	if errors.As(err, &fe) {
		if errors.Is(fe, frames.ErrUnknownMethod) {
			c.dropClient(fe)
			return
		}
		c.protocolError(fe)
		c.drainClient()
		return
	}
	if st := c.closeInProgress(); st == closeByProxy || st == closeByClient {
		// closeByProxy: the client hung up instead of answering our close,
		// so it has heard it. closeByClient: the client hung up after the
		// close-ok, as it should (or took longer than CloseTimeout).
		reason, detail := c.outcome()
		c.teardown(reason, detail)
		return
	}
	detail := "client closed the TCP connection without connection.close"
	if !errors.Is(err, io.EOF) {
		detail = fmt.Sprintf("client connection failed: %v", err)
	}
	c.teardown(ReasonClientGone, detail)
}

// drainClient waits, after a protocol error was answered with
// connection.close, for the client's close-ok, discarding everything else,
// until the client hangs up or CloseTimeout passes. Once frames can no longer
// be parsed (a framing error leaves no trustworthy boundary) it reads raw
// bytes: closing a socket with unread input would reset it and could destroy
// the close the client has not read yet.
func (c *clientConn) drainClient() {
	c.client.Conn().SetReadDeadline(time.Now().Add(c.srv.opts.CloseTimeout))
	for {
		f, err := c.client.ReadFrame()
		if err != nil {
			var fe *frames.Error
			if errors.As(err, &fe) {
				io.Copy(io.Discard, c.client.Conn())
			}
			break
		}
		if f.Type == frames.FrameMethod && f.Channel == 0 {
			if isMethod(f.Payload, frames.ConnectionCloseOkKey) {
				break
			}
			// A closing RabbitMQ still looks up what comes on channel 0,
			// and drops the socket for an undefined method.
			if classID, methodID, _, err := frames.ParseMethodID(f.Payload); err == nil && !definedMethod(classID, methodID) {
				resetOnClose(c.client.Conn())
				break
			}
		}
	}
	reason, detail := c.outcome()
	c.teardown(reason, detail)
}

// definedMethod reports whether RabbitMQ 3.10's 0-9-1 framing defines
// classID/methodID: every method of the codec, plus access.request and
// access.request-ok (class 30), which the spec the codec is generated from
// leaves out but RabbitMQ still answers (request-ok, ticket 1), so that old
// clients sending them must reach it. Measured against a 3.10 node for
// classes 0-120 and methods 0-125: exactly these pairs are not dropped.
func definedMethod(classID, methodID uint16) bool {
	return frames.SentByClient(classID, methodID) || frames.SentByServer(classID, methodID) ||
		(classID == 30 && (methodID == 10 || methodID == 11))
}

// undefinedMethod is the error for a method frame whose ids RabbitMQ does
// not define; clientFailed drops the connection for it.
func undefinedMethod(classID, methodID uint16) *frames.Error {
	return &frames.Error{Code: frames.NotImplemented, ClassID: classID, MethodID: methodID, Err: frames.ErrUnknownMethod,
		Text: fmt.Sprintf("undefined method: class %d, method %d", classID, methodID)}
}

// dropClient ends the connection without a word, as RabbitMQ 3.10 does when
// a client sends a method its framing does not define: the connection's
// reader fails on the lookup and the socket is reset at once, with no
// connection.close and no wait. The backend connection is closed politely
// by teardown; it never saw the method.
func (c *clientConn) dropClient(fe *frames.Error) {
	c.log.Warn("client sent an undefined method, dropping the connection as the broker would", "class", fe.ClassID, "method", fe.MethodID)
	resetOnClose(c.client.Conn())
	c.teardown(ReasonProtocolError, fe.Error())
}

// resetOnClose makes closing conn send a TCP reset, as a RabbitMQ listener's
// close does (its default tcp_listen_options have linger {true, 0}).
func resetOnClose(conn net.Conn) {
	if tlsConn, ok := conn.(*tls.Conn); ok {
		conn = tlsConn.NetConn()
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetLinger(0)
	}
}

// fromClient handles one client frame: it is decoded as far as the proxy
// acts on it, applied to its channel's state, and sent to the links the
// method must reach (route.go decides which).
func (c *clientConn) fromClient(f frames.Frame) error {
	if st := c.closeInProgress(); st != closeNone {
		return c.fromClientWhileClosing(st, f)
	}
	if f.Type == frames.FrameHeartbeat {
		return nil
	}
	if f.Type != frames.FrameMethod {
		// A publish's content goes where its method went: the broker
		// assembles content even on a channel it is closing, so content
		// without its method, or a method without its content, would be
		// a connection error there.
		ch := c.channels.get(f.Channel)
		if ch == nil {
			c.toBackend(f)
			return nil
		}
		if ch.dropContent {
			return nil
		}
		if ch.tx.on {
			_, err := c.fromClientInEmulatedTx(ch, f, 0)
			return err
		}
		return c.publishContent(ch, f)
	}
	classID, methodID, args, err := frames.ParseMethodID(f.Payload)
	if err != nil {
		return err
	}
	if !definedMethod(classID, methodID) {
		// Before any channel state: RabbitMQ looks the method up as it
		// parses the frame, whatever the channel and its state.
		return undefinedMethod(classID, methodID)
	}
	key := frames.MethodKey(classID, methodID)
	if f.Channel == 0 {
		if key == frames.ConnectionCloseKey {
			var cl frames.ConnectionClose
			detail := "client sent connection.close"
			if cl.Decode(args) == nil && cl.ReplyCode != frames.ReplySuccess {
				detail = fmt.Sprintf("client sent connection.close %d %s", cl.ReplyCode, cl.ReplyText)
			}
			c.beginClosing(closeByClient, ReasonClientClosed, detail)
		}
		c.toBackend(f)
		return nil
	}

	ch := c.channels.get(f.Channel)
	if ch == nil {
		if key == frames.ChannelOpenKey {
			ch = c.channels.open(f.Channel)
			if home := c.home.Load(); ch != nil && home != nil {
				return c.openChannel(ch, f, home)
			}
		}
		// Anything else on a channel that is not open: the home backend
		// answers it with the error a broker gives.
		c.toBackend(f)
		return nil
	}
	if len(ch.heldPublish) > 0 {
		// A method where a publish's content header belongs.
		if err := c.sendDeferred(ch, nil); err != nil {
			return err
		}
	}
	ch.dropContent = false
	if state := ch.closing.Load(); state != chanOpen {
		ch.dropContent = true
		if state != chanClientClosing {
			c.fromClientOnClosingChannel(ch, state, key, f)
		}
		return nil
	}
	if ch.tx.on {
		if handled, err := c.fromClientInEmulatedTx(ch, f, key); handled || err != nil {
			return err
		}
	}

	switch key {
	case frames.BasicPublishKey:
		return c.publish(ch, f, args)
	case frames.BasicAckKey:
		if err := ch.clientAck.Decode(args); err != nil {
			return err
		}
		return c.settle(ch, f, key, ch.clientAck.DeliveryTag, ch.clientAck.Multiple, false)
	case frames.BasicNackKey:
		if err := ch.clientNack.Decode(args); err != nil {
			return err
		}
		return c.settle(ch, f, key, ch.clientNack.DeliveryTag, ch.clientNack.Multiple, ch.clientNack.Requeue)
	case frames.BasicRejectKey:
		if err := ch.clientReject.Decode(args); err != nil {
			return err
		}
		return c.settle(ch, f, key, ch.clientReject.DeliveryTag, false, ch.clientReject.Requeue)
	case frames.BasicConsumeKey:
		return c.consume(ch, f, args)
	case frames.BasicGetKey:
		return c.get(ch, f, args)
	case frames.BasicCancelKey:
		return c.cancel(ch, f, args)
	case frames.ChannelCloseKey:
		c.clientClosesChannel(ch, f)
		return nil
	case frames.ChannelCloseOkKey:
		// Not closing: nothing to answer. The home backend judges it.
		c.sendTo(ch, f, nil, c.openLinks(ch), false)
		return nil
	case frames.QueueDeclareKey, frames.QueueBindKey, frames.QueueUnbindKey, frames.QueuePurgeKey, frames.QueueDeleteKey:
		return c.queueMethod(ch, f, key, args)
	case frames.ExchangeDeclareKey, frames.ExchangeDeleteKey, frames.ExchangeBindKey, frames.ExchangeUnbindKey:
		// Exchanges and their bindings exist on every backend, as in a
		// RabbitMQ cluster.
		return c.exchangeMethod(ch, f, key, args)
	case frames.BasicQosKey:
		var qos frames.BasicQos
		if err := qos.Decode(args); err != nil {
			return err
		}
		ch.qos = &qos
		return c.onOpenLinks(ch, f, true)
	case frames.ConfirmSelectKey:
		var sel frames.ConfirmSelect
		if err := sel.Decode(args); err != nil {
			return err
		}
		ch.mu.Lock()
		if !ch.confirming.Load() {
			ch.confirms.ClientSelected()
		}
		ch.confirming.Store(true)
		ch.mu.Unlock()
		return c.onOpenLinks(ch, f, !sel.NoWait)
	case frames.TxSelectKey:
		if ch.ownConfirms.Load() {
			// The backends would refuse it ("cannot switch from confirm
			// to tx mode"): the proxy keeps the transaction itself.
			c.beginEmulatedTx(ch)
			return nil
		}
		ch.mu.Lock()
		ch.transactional = true
		ch.mu.Unlock()
		return c.onOpenLinks(ch, f, true)
	case frames.TxCommitKey, frames.TxRollbackKey:
		// The broker applies the transaction before anything sent after
		// it, so the client's next acks already see the outcome: a
		// rollback leaves the transaction's acks unapplied, and those
		// deliveries can be acked again at once.
		ch.mu.Lock()
		if key == frames.TxRollbackKey {
			ch.tags.Restore(ch.txSettled)
		} else {
			c.trimSettled(ch.txSettled, ch.txTrims)
		}
		ch.txSettled = ch.txSettled[:0]
		ch.txTrims = ch.txTrims[:0]
		ch.mu.Unlock()
		return c.onOpenLinks(ch, f, true)
	case frames.BasicRecoverAsyncKey:
		ch.mu.Lock()
		ch.tags.DropAll()
		ch.mu.Unlock()
		return c.onOpenLinks(ch, f, false)
	case frames.BasicRecoverKey:
		return c.onOpenLinks(ch, f, true)
	case frames.ChannelFlowKey:
		return c.onOpenLinks(ch, f, true)
	case frames.ChannelOpenKey:
		// Already open: the home backend answers as a broker does.
		c.toBackend(f)
		return nil
	}
	c.toBackend(f)
	return nil
}

// openChannel opens a client channel on the home link; other links open it
// when the channel first needs them (ensureChannel).
func (c *clientConn) openChannel(ch *channelState, f frames.Frame, home *link) error {
	home.mu.Lock()
	lc := home.channelLocked(ch.id)
	lc.open, lc.confirm, lc.closing = true, false, false
	home.mu.Unlock()
	c.send(ch, f, []*link{home}, true, nil)
	return nil
}

// trimKind is what settling a delivery does to the slave copies of its
// message.
type trimKind uint8

const (
	trimNone   trimKind = iota // requeued: the copies stay
	trimAck                    // acked: the copies are acked
	trimReject                 // rejected without requeue: the copies are rejected too, to be dead-lettered
)

// settle passes a client's basic.ack, basic.nack or basic.reject to the
// backends of the deliveries it settles, with their own delivery tags; the
// slave copies of the messages it removes from their masters are trimmed.
func (c *clientConn) settle(ch *channelState, f frames.Frame, key uint32, tag uint64, multiple, requeue bool) error {
	kind := trimNone
	switch {
	case key == frames.BasicAckKey:
		kind = trimAck
	case !requeue:
		kind = trimReject
	}
	var trims *[]ledger.Trimmed
	if c.srv.opts.Mirror != nil && kind != trimNone {
		ch.trims = ch.trims[:0]
		trims = &ch.trims
	}
	ch.mu.Lock()
	transactional := ch.transactional
	if transactional {
		trims = nil // trimmed at tx.commit, from txSettled
	}
	acks, settled, ok := ch.tags.Settle(tag, multiple, ch.acks[:0], transactional, ch.txSettled, trims)
	if transactional {
		for range settled[len(ch.txSettled):] {
			ch.txTrims = append(ch.txTrims, kind)
		}
	}
	ch.acks, ch.txSettled = acks, settled
	ch.mu.Unlock()
	if !ok {
		classID, methodID := uint16(key>>16), uint16(key)
		c.closeChannelByProxy(ch, frames.PreconditionFailed,
			fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", tag), classID, methodID)
		return nil
	}
	if trims != nil && len(*trims) > 0 {
		c.trim(*trims, kind == trimReject)
	}
	if len(acks) == 1 && acks[0].BackendTag == tag && acks[0].Multiple == multiple {
		if l := c.linkAt(acks[0].Backend); l != nil && l.gen == acks[0].Gen {
			if err := l.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
				c.writeFailed(l, err)
			}
		}
		return nil
	}
	for _, a := range acks {
		l := c.linkAt(a.Backend)
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
			c.writeFailed(l, err)
		}
	}
	return nil
}

// trimSettled trims the mirrored messages among tx-settled entries, at
// commit, each as kinds says.
func (c *clientConn) trimSettled(entries []ledger.TagEntry, kinds []trimKind) {
	if c.srv.opts.Mirror == nil {
		return
	}
	for _, kind := range []trimKind{trimAck, trimReject} {
		var trims []ledger.Trimmed
		for i, e := range entries {
			if e.Queue != nil && kinds[i] == kind {
				trims = append(trims, ledger.Trimmed{Queue: e.Queue, ID: e.ID})
			}
		}
		c.trim(trims, kind == trimReject)
	}
}

// trim tells the engine which messages left their masters, one call per
// queue: rejected without requeue (reject) or acked.
func (c *clientConn) trim(trims []ledger.Trimmed, reject bool) {
	for len(trims) > 0 {
		q := trims[0].Queue
		ids := c.trimIDs[:0]
		rest := trims[:0]
		for _, t := range trims {
			if t.Queue == q {
				ids = append(ids, t.ID)
			} else {
				rest = append(rest, t)
			}
		}
		if reject {
			c.srv.opts.Mirror.Reject(q.ID, ids)
		} else {
			c.srv.opts.Mirror.Settle(q.ID, ids)
		}
		c.trimIDs = ids
		trims = rest
	}
}

// fromClientWhileClosing handles client frames during a connection close.
func (c *clientConn) fromClientWhileClosing(st closeState, f frames.Frame) error {
	if f.Type != frames.FrameMethod || f.Channel != 0 {
		return nil
	}
	classID, methodID, _, err := frames.ParseMethodID(f.Payload)
	if err != nil {
		return nil
	}
	if !definedMethod(classID, methodID) {
		// Dropped, as by a closing RabbitMQ, which still looks up what
		// comes on channel 0 (and ignores the other channels).
		return undefinedMethod(classID, methodID)
	}
	key := frames.MethodKey(classID, methodID)
	reason, detail := c.outcome()
	switch {
	case st == closeByBackend && key == frames.ConnectionCloseOkKey:
		// The backend's close handshake completes through the proxy.
		if home := c.home.Load(); home != nil {
			home.sock.SendFrame(f.Type, 0, f.Payload)
		}
		c.markBackendClosed()
		c.teardown(reason, detail)
	case st == closeByProxy && key == frames.ConnectionCloseOkKey:
		c.teardown(reason, detail)
	case (st == closeByProxy || st == closeByBackend) && key == frames.ConnectionCloseKey:
		// The client closed at the same time: answer it and end.
		c.client.SendMethod(0, &frames.ConnectionCloseOk{})
		c.teardown(reason, detail)
	}
	return nil
}

func (c *clientConn) markBackendClosed() {
	c.mu.Lock()
	c.backendClosed = true
	c.mu.Unlock()
}

// toBackend passes a frame to the home backend as it came.
func (c *clientConn) toBackend(f frames.Frame) {
	home := c.home.Load()
	if home == nil {
		return
	}
	if err := home.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
		c.linkFailed(home, err)
	}
}
