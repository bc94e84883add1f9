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
	c.client.WhenDry(func() {
		c.settler.flushAcked()
		c.links.flush()
	})
	for {
		f, err := c.client.ReadFrame()
		if err == nil {
			c.send.lock()
			c.send.runWaitingLocked()
			err = c.fromClient(f)
			c.send.runWaitingLocked()
			c.send.unlock()
		}
		if err != nil {
			c.settler.flushAcked()
			c.clientFailed(err)
			return
		}
	}
}

// clientFailed ends the connection after a read error or a frame the
// client should not have sent (a *frames.Error, answered like a broker).
func (c *clientConn) clientFailed(err error) {
	if c.closer.tornDown() {
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
	if st := c.closer.inProgress(); st == closeByProxy || st == closeByClient {
		// closeByProxy: the client hung up instead of answering our close,
		// so it has heard it. closeByClient: the client hung up after the
		// close-ok, as it should (or took longer than CloseTimeout).
		reason, detail := c.closer.outcome()
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
	reason, detail := c.closer.outcome()
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
// method must reach (route.go decides which). It only dispatches: content
// frames to contentFromClient, channel 0 to connectionMethod, other
// channels to channelMethod (client_methods.go).
func (c *clientConn) fromClient(f frames.Frame) error {
	if st := c.closer.inProgress(); st != closeNone {
		return c.fromClientWhileClosing(st, f)
	}
	switch f.Type {
	case frames.FrameHeartbeat:
		return nil
	case frames.FrameMethod:
	default:
		return c.contentFromClient(f)
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
	if key != frames.BasicAckKey {
		c.settler.flushAcked()
	}
	if f.Channel == 0 {
		c.connectionMethod(f, key, args)
		return nil
	}
	ch := c.channels.get(f.Channel)
	if ch == nil {
		return c.methodOnClosedChannel(f, key)
	}
	return c.channelMethod(ch, f, key, args)
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
	reason, detail := c.closer.outcome()
	switch {
	case st == closeByBackend && key == frames.ConnectionCloseOkKey:
		// The backend's close handshake completes through the proxy.
		if home := c.links.home(); home != nil {
			home.sock.SendFrame(f.Type, 0, f.Payload)
		}
		c.closer.backendDone()
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

// toBackend passes a frame to the home backend as it came.
func (c *clientConn) toBackend(f frames.Frame) {
	home := c.links.home()
	if home == nil {
		return
	}
	if err := home.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
		c.keeper.linkFailed(home, err)
	}
}
