package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// errBackendDone ends the backend loop after the backend's close-ok was
// passed to the client: the backend has nothing more to say.
var errBackendDone = errors.New("backend connection closed cleanly")

// fromLink handles one frame from a link. An error means the backend broke
// the protocol and the link is lost.
func (c *clientConn) fromLink(l *link, f frames.Frame) error {
	if f.Type == frames.FrameHeartbeat {
		return nil
	}
	if f.Channel == 0 {
		if c.links.home() == l {
			return c.fromBackendConnection(l, f)
		}
		return c.fromLinkConnection(l, f)
	}
	ch := c.channels.get(f.Channel)
	lc, closing := l.channelSide(f.Channel)
	if ch == nil || lc == nil {
		if ch == nil && c.links.home() == l && !closing {
			c.out.frame(f) // a channel the proxy does not track
		}
		return nil
	}
	if f.Type != frames.FrameMethod {
		m := &lc.assembled
		if !m.active {
			return nil
		}
		complete, err := m.content(f)
		if err != nil {
			return err
		}
		if complete {
			m.active = false
			if !closing {
				c.deliverer.messageArrived(ch, l, m)
			}
		}
		return nil
	}
	classID, methodID, args, err := frames.ParseMethodID(f.Payload)
	if err != nil {
		return err
	}
	key := frames.MethodKey(classID, methodID)
	lc.assembled.active = false
	if closing {
		return c.fromLinkOnClosingChannel(ch, l, f, key)
	}
	switch key {
	case frames.BasicDeliverKey, frames.BasicReturnKey:
		lc.assembled.begin(key, f.Payload, nil)
		return nil
	case frames.BasicGetOkKey:
		g, ok := l.nextReply(ch.id)
		var get *pendingGet
		if ok && g != nil {
			get = g.get
		}
		if get == nil {
			get = &pendingGet{}
		}
		lc.assembled.begin(key, f.Payload, get)
		return nil
	case frames.BasicAckKey:
		if err := l.backAck.Decode(args); err != nil {
			return err
		}
		c.settler.confirm(ch, l, f, l.backAck.DeliveryTag, l.backAck.Multiple, false)
		return nil
	case frames.BasicNackKey:
		if err := l.backNack.Decode(args); err != nil {
			return err
		}
		c.settler.confirm(ch, l, f, l.backNack.DeliveryTag, l.backNack.Multiple, true)
		return nil
	case frames.BasicCancelKey: // the server cancelled a consumer (queue deleted)
		if err := l.cancel.Decode(args); err != nil {
			return err
		}
		if !ch.brokerCancels(l.cancel.ConsumerTag, l.idx) {
			return nil // the old master of a consumer that moved
		}
		c.out.frameOnChannel(ch, f)
		return nil
	case frames.ChannelCloseKey: // a channel error
		return c.linkClosesChannel(ch, l, f)
	case frames.BasicRecoverOkKey:
		c.settler.takenBack(ch.dropDeliveriesFrom(l.idx))
	case frames.ChannelCloseOkKey: // the answer to the client's close
		if err := l.closeOkArrived(ch.id); err != nil {
			return err
		}
	}
	if isReply(key) {
		c.router.replyArrived(ch, l, f)
		return nil
	}
	c.out.frameOnChannel(ch, f)
	return nil
}

// fromLinkOnClosingChannel handles a link's frames on a channel the proxy is
// closing there: replies to what was sent before the close are matched and
// dropped, the close-ok ends it, and a close of the link's own is answered.
func (c *clientConn) fromLinkOnClosingChannel(ch *channelState, l *link, f frames.Frame, key uint32) error {
	switch {
	case key == frames.ChannelCloseKey:
		// The backend closed it too; it still answers ours with close-ok,
		// and its close is answered after that (closeOkArrived).
		l.owesCloseOk(ch.id)
		return nil
	case key == frames.ChannelCloseOkKey:
		if err := l.closeOkArrived(ch.id); err != nil {
			return err
		}
		for {
			g, ok := l.nextReply(ch.id)
			if !ok {
				return nil
			}
			if g != nil && g.own {
				g.after(nil)
				return nil
			}
			c.router.abandonReply(ch, g)
		}
	case isReply(key):
		g, _ := l.nextReply(ch.id)
		c.router.abandonReply(ch, g)
	}
	return nil
}

// fromLinkConnection handles channel-0 methods of a link other than the
// home link. A broker that closes it with 320 (it is shutting down) loses
// the link and the client's connection goes on; another connection error is
// the client's doing (a frame the broker refused), and the client hears it
// as from a single broker.
func (c *clientConn) fromLinkConnection(l *link, f frames.Frame) error {
	if f.Type != frames.FrameMethod {
		return nil
	}
	classID, methodID, args, err := frames.ParseMethodID(f.Payload)
	if err != nil {
		return err
	}
	if frames.MethodKey(classID, methodID) != frames.ConnectionCloseKey {
		return nil // blocked/unblocked: only the home broker's reach the client
	}
	var cl frames.ConnectionClose
	if err := cl.Decode(args); err != nil {
		return err
	}
	l.sock.SendMethod(0, &frames.ConnectionCloseOk{})
	l.markClosed()
	if cl.ReplyCode != frames.ConnectionForced {
		c.closeClient(ReasonBackendClosed, cl.ReplyCode, cl.ReplyText, cl.ClassID, cl.MethodID)
	}
	return fmt.Errorf("backend %s closed the connection: %d %s", l.name, cl.ReplyCode, cl.ReplyText)
}

// fromBackendConnection handles the home backend's channel-0 methods.
func (c *clientConn) fromBackendConnection(l *link, f frames.Frame) error {
	if f.Type != frames.FrameMethod {
		c.out.frame(f)
		return nil
	}
	classID, methodID, args, err := frames.ParseMethodID(f.Payload)
	if err != nil {
		return err
	}
	switch frames.MethodKey(classID, methodID) {
	case frames.ConnectionCloseKey:
		var cl frames.ConnectionClose
		if err := cl.Decode(args); err != nil {
			return err
		}
		if cl.ReplyCode == frames.ConnectionForced && c.closer.inProgress() == closeNone && c.srv.opts.Mirror != nil {
			// The broker is shutting down: with mirroring, another backend
			// takes over as home and the client stays.
			l.sock.SendMethod(0, &frames.ConnectionCloseOk{})
			l.markClosed()
			return fmt.Errorf("backend %s closed the connection: %d %s", l.name, cl.ReplyCode, cl.ReplyText)
		}
		detail := fmt.Sprintf("backend %s closed the connection: %d %s", l.name, cl.ReplyCode, cl.ReplyText)
		if !c.beginClosing(closeByBackend, ReasonBackendClosed, detail) {
			// A close of our own is in flight; answer the backend's and end.
			l.sock.SendMethod(0, &frames.ConnectionCloseOk{})
			c.closer.backendDone()
			reason, detail := c.closer.outcome()
			c.teardown(reason, detail)
			return nil
		}
		if err := c.client.SendFrame(f.Type, 0, f.Payload); err != nil {
			c.teardown(ReasonClientGone, err.Error())
		}
		return nil
	case frames.ConnectionCloseOkKey:
		if c.closer.inProgress() == closeByClient {
			// The client closes the socket once it has the close-ok;
			// closing it first would make the client read EOF before the
			// close-ok and report an error for a clean close. The client
			// loop ends the connection when the client hangs up, or after
			// CloseTimeout.
			c.closer.backendDone()
			c.client.Conn().SetReadDeadline(time.Now().Add(c.srv.opts.CloseTimeout))
			c.client.SendFrame(f.Type, 0, f.Payload)
			return errBackendDone
		}
	}
	c.out.frame(f)
	return nil
}

// isMethod reports whether a method frame's payload is one of keys.
func isMethod(payload []byte, keys ...uint32) bool {
	classID, methodID, _, err := frames.ParseMethodID(payload)
	if err != nil {
		return false
	}
	k := frames.MethodKey(classID, methodID)
	for _, want := range keys {
		if k == want {
			return true
		}
	}
	return false
}
