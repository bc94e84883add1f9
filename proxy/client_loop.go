package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// clientLoop reads the client's frames and passes them to the backend,
// acting on the ones that touch proxy state. It returns when the client
// socket is closed.
func (c *clientConn) clientLoop() {
	c.client.whenDry(func() { c.backend.flush() })
	for {
		f, err := c.client.in.ReadFrame()
		if err == nil {
			err = c.fromClient(f)
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
	c.client.conn.SetReadDeadline(time.Now().Add(c.srv.opts.CloseTimeout))
	for {
		f, err := c.client.in.ReadFrame()
		if err != nil {
			var fe *frames.Error
			if errors.As(err, &fe) {
				io.Copy(io.Discard, c.client.conn)
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
				resetOnClose(c.client.conn)
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
	resetOnClose(c.client.conn)
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

// fromClient handles one client frame. An error return is a *frames.Error
// that closes the connection.
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
		if ch := c.channels.get(f.Channel); ch != nil && ch.dropContent {
			return nil
		}
		c.toBackend(f)
		return nil
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
			c.channels.open(f.Channel)
		}
		// Anything else on a channel that is not open: the backend answers
		// it with the error a broker gives.
		c.toBackend(f)
		return nil
	}
	ch.dropContent = false
	if ch.closedByProxy.Load() {
		ch.dropContent = true
		return c.fromClientOnClosedChannel(ch, key)
	}
	if ch.closedByBackend.Load() && key != frames.ChannelCloseOkKey && key != frames.ChannelCloseKey {
		// Sent before the client saw the backend's channel.close: the
		// backend discards it, as the spec says, and so does the proxy, so
		// that a late ack cannot start a second close. The close handshake
		// itself passes (both sides may close at once; the backend answers).
		ch.dropContent = true
		return nil
	}

	switch key {
	case frames.BasicPublishKey:
		if ch.confirming {
			ch.mu.Lock()
			ch.confirms.publish(0)
			ch.mu.Unlock()
		}
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
		if err := ch.clientConsume.Decode(args); err != nil {
			return err
		}
		ch.mu.Lock()
		if tag := ch.clientConsume.ConsumerTag; tag != "" {
			ch.consumers[tag] = ch.clientConsume.NoAck
		}
		if !ch.clientConsume.NoWait {
			ch.pendingConsumes = append(ch.pendingConsumes, ch.clientConsume.NoAck)
		} else if ch.clientConsume.ConsumerTag == "" {
			// The server picks a tag the client never learns; deliveries
			// with a tag we do not know take this consumer's mode.
			ch.unknownConsumerNoAck = ch.clientConsume.NoAck
		}
		ch.mu.Unlock()
	case frames.BasicGetKey:
		if err := ch.clientGet.Decode(args); err != nil {
			return err
		}
		ch.mu.Lock()
		ch.pendingGets = append(ch.pendingGets, ch.clientGet.NoAck)
		ch.mu.Unlock()
	case frames.BasicRecoverAsyncKey:
		ch.mu.Lock()
		ch.tags.dropAll()
		ch.mu.Unlock()
	case frames.ConfirmSelectKey:
		ch.confirming = true
	case frames.TxSelectKey:
		ch.mu.Lock()
		ch.transactional = true
		ch.mu.Unlock()
	case frames.TxCommitKey, frames.TxRollbackKey:
		// The broker applies the transaction before anything sent after
		// it, so the client's next acks already see the outcome: a
		// rollback leaves the transaction's acks unapplied, and those
		// deliveries can be acked again at once.
		ch.mu.Lock()
		if key == frames.TxRollbackKey {
			ch.tags.restore(ch.txSettled)
		}
		ch.txSettled = ch.txSettled[:0]
		ch.mu.Unlock()
	case frames.ChannelCloseOkKey:
		// The client confirms a close the backend started.
		c.channels.remove(f.Channel, ch)
	}
	c.toBackend(f)
	return nil
}

// settle passes a client's basic.ack, basic.nack or basic.reject to the
// backend with the backend's delivery tags. With a single backend the tags
// coincide and the frame passes as it came.
func (c *clientConn) settle(ch *channelState, f frames.Frame, key uint32, tag uint64, multiple, requeue bool) error {
	ch.mu.Lock()
	acks, settled, ok := ch.tags.settle(tag, multiple, ch.acks[:0], ch.transactional, ch.txSettled)
	ch.acks, ch.txSettled = acks, settled
	ch.mu.Unlock()
	if !ok {
		classID, methodID := uint16(key>>16), uint16(key)
		c.closeChannelByProxy(ch, frames.PreconditionFailed,
			fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", tag), classID, methodID)
		return nil
	}
	if len(acks) == 1 && acks[0].backendTag == tag && acks[0].multiple == multiple {
		c.toBackend(f)
		return nil
	}
	for _, a := range acks {
		var m frames.Method
		switch key {
		case frames.BasicAckKey:
			m = &frames.BasicAck{DeliveryTag: a.backendTag, Multiple: a.multiple}
		case frames.BasicNackKey:
			m = &frames.BasicNack{DeliveryTag: a.backendTag, Multiple: a.multiple, Requeue: requeue}
		default:
			m = &frames.BasicReject{DeliveryTag: a.backendTag, Requeue: requeue}
		}
		if err := c.backend.writeMethod(f.Channel, m); err != nil {
			c.backendLost(err)
			return nil
		}
	}
	return nil
}

// closeChannelByProxy closes a channel for a reason the proxy found itself:
// a plain channel.close to the backend now, whose close-ok and any frames
// before it are swallowed, and channel.close with the broker's code and
// text to the client, sent by the backend loop with that close-ok.
func (c *clientConn) closeChannelByProxy(ch *channelState, code uint16, text string, classID, methodID uint16) {
	if !ch.closedByProxy.CompareAndSwap(false, true) {
		return
	}
	c.channels.beginProxyClose(ch.id, &frames.ChannelClose{ReplyCode: code, ReplyText: text, ClassID: classID, MethodID: methodID})
	if err := c.backend.writeMethod(ch.id, &frames.ChannelClose{ReplyCode: frames.ReplySuccess, ReplyText: "closed by amqp-mirror: " + text}); err != nil {
		c.backendLost(err)
	}
}

// fromClientOnClosedChannel handles client frames on a channel the proxy is
// closing: only the close handshake counts, the rest is discarded, as the
// spec asks of a peer that sent channel.close.
func (c *clientConn) fromClientOnClosedChannel(ch *channelState, key uint32) error {
	switch key {
	case frames.ChannelCloseOkKey:
		c.channels.remove(ch.id, ch)
	case frames.ChannelCloseKey: // the client closed it too: answer, and it is closed
		c.channels.dropNotice(ch.id)
		c.client.sendMethod(ch.id, &frames.ChannelCloseOk{})
		c.channels.remove(ch.id, ch)
	}
	return nil
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
		c.backend.sendFrame(f.Type, 0, f.Payload)
		c.markBackendClosed()
		c.teardown(reason, detail)
	case st == closeByProxy && key == frames.ConnectionCloseOkKey:
		c.teardown(reason, detail)
	case (st == closeByProxy || st == closeByBackend) && key == frames.ConnectionCloseKey:
		// The client closed at the same time: answer it and end.
		c.client.sendMethod(0, &frames.ConnectionCloseOk{})
		c.teardown(reason, detail)
	}
	return nil
}

func (c *clientConn) markBackendClosed() {
	c.mu.Lock()
	c.backendClosed = true
	c.mu.Unlock()
}

// toBackend passes a frame to the backend as it came.
func (c *clientConn) toBackend(f frames.Frame) {
	if err := c.backend.writeFrame(f.Type, f.Channel, f.Payload); err != nil {
		c.backendLost(err)
	}
}
