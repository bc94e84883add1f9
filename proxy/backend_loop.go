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

// backendIndex is the index of the one backend link a client connection has
// today. Tag and confirm bookkeeping already name the backend of each entry,
// so that mirroring can add links without changing it.
const backendIndex = 0

// backendLoop reads the backend's frames and passes them to the client,
// giving deliveries the proxy's delivery tags and confirms the client's
// sequence numbers. After teardown it keeps reading only until the backend
// confirms the proxy's connection.close.
func (c *clientConn) backendLoop() {
	defer close(c.backendDone)
	defer c.backend.conn.Close()
	c.backend.whenDry(func() { c.client.flush() })
	for {
		f, err := c.backend.in.ReadFrame()
		if err != nil {
			if !c.tornDown.Load() {
				if c.closeInProgress() == closeByClient {
					// The backend hung up instead of sending close-ok: the
					// client asked to close, so that is what happened.
					reason, detail := c.outcome()
					c.markBackendClosed()
					c.teardown(reason, detail)
					return
				}
				c.backendLost(err)
			}
			return
		}
		if c.tornDown.Load() {
			if f.Type == frames.FrameMethod && f.Channel == 0 && isMethod(f.Payload, frames.ConnectionCloseOkKey, frames.ConnectionCloseKey) {
				return
			}
			continue
		}
		if err := c.fromBackend(f); err != nil {
			if !errors.Is(err, errBackendDone) {
				c.backendLost(err)
			}
			return
		}
	}
}

// fromBackend handles one backend frame. An error means the backend broke
// the protocol and the connection to it is lost.
func (c *clientConn) fromBackend(f frames.Frame) error {
	if f.Type == frames.FrameHeartbeat {
		return nil
	}
	if f.Channel == 0 {
		return c.fromBackendConnection(f)
	}
	if c.channels.isProxyClosing(f.Channel) {
		return c.fromBackendOnClosedChannel(f)
	}
	if f.Type != frames.FrameMethod {
		c.toClient(f)
		return nil
	}
	classID, methodID, args, err := frames.ParseMethodID(f.Payload)
	if err != nil {
		return err
	}
	ch := c.channels.get(f.Channel)
	if ch == nil {
		c.toClient(f)
		return nil
	}
	key := frames.MethodKey(classID, methodID)
	ch.backendContentOpen = key == frames.BasicDeliverKey || key == frames.BasicGetOkKey || key == frames.BasicReturnKey
	switch key {
	case frames.BasicDeliverKey:
		d := &ch.deliver
		if err := d.Decode(args); err != nil {
			return err
		}
		ch.mu.Lock()
		noAck, known := ch.consumers[d.ConsumerTag]
		if !known {
			noAck = ch.unknownConsumerNoAck
		}
		tag := ch.tags.deliver(backendIndex, d.DeliveryTag, !noAck)
		ch.mu.Unlock()
		if tag != d.DeliveryTag {
			d.DeliveryTag = tag
			c.toClientMethod(f.Channel, d)
			return nil
		}
	case frames.BasicGetOkKey:
		g := &ch.getOk
		if err := g.Decode(args); err != nil {
			return err
		}
		ch.mu.Lock()
		noAck := popFront(&ch.pendingGets)
		tag := ch.tags.deliver(backendIndex, g.DeliveryTag, !noAck)
		ch.mu.Unlock()
		if tag != g.DeliveryTag {
			g.DeliveryTag = tag
			c.toClientMethod(f.Channel, g)
			return nil
		}
	case frames.BasicGetEmptyKey:
		ch.mu.Lock()
		popFront(&ch.pendingGets)
		ch.mu.Unlock()
	case frames.BasicConsumeOkKey:
		if err := ch.consumeOk.Decode(args); err != nil {
			return err
		}
		ch.mu.Lock()
		ch.consumers[ch.consumeOk.ConsumerTag] = popFront(&ch.pendingConsumes)
		ch.mu.Unlock()
	case frames.BasicCancelKey: // the server cancelled a consumer (queue deleted, failover)
		if err := ch.cancel.Decode(args); err != nil {
			return err
		}
		ch.mu.Lock()
		delete(ch.consumers, ch.cancel.ConsumerTag)
		ch.mu.Unlock()
	case frames.BasicCancelOkKey:
		if err := ch.cancelOk.Decode(args); err != nil {
			return err
		}
		ch.mu.Lock()
		delete(ch.consumers, ch.cancelOk.ConsumerTag)
		ch.mu.Unlock()
	case frames.BasicAckKey:
		if err := ch.backAck.Decode(args); err != nil {
			return err
		}
		return c.confirm(ch, f, ch.backAck.DeliveryTag, ch.backAck.Multiple, false)
	case frames.BasicNackKey:
		if err := ch.backNack.Decode(args); err != nil {
			return err
		}
		return c.confirm(ch, f, ch.backNack.DeliveryTag, ch.backNack.Multiple, true)
	case frames.BasicRecoverOkKey:
		ch.mu.Lock()
		ch.tags.dropAll()
		ch.mu.Unlock()
	case frames.ChannelCloseKey: // a channel error: the client's close-ok follows
		ch.closedByBackend.Store(true)
	case frames.ChannelCloseOkKey: // the backend confirms the client's close
		c.channels.remove(f.Channel, ch)
	}
	c.toClient(f)
	return nil
}

// confirm turns a backend's publisher confirm into the client's.
func (c *clientConn) confirm(ch *channelState, f frames.Frame, seq uint64, multiple, nack bool) error {
	ch.mu.Lock()
	out := ch.confirms.confirm(backendIndex, seq, multiple, nack, ch.confirmed[:0])
	ch.confirmed = out
	ch.mu.Unlock()
	if len(out) == 1 && out[0] == (clientConfirm{seq: seq, multiple: multiple, nack: nack}) {
		c.toClient(f)
		return nil
	}
	for _, cc := range out {
		var m frames.Method
		if cc.nack {
			m = &frames.BasicNack{DeliveryTag: cc.seq, Multiple: cc.multiple}
		} else {
			m = &frames.BasicAck{DeliveryTag: cc.seq, Multiple: cc.multiple}
		}
		c.toClientMethod(f.Channel, m)
	}
	return nil
}

// fromBackendConnection handles the backend's channel-0 methods.
func (c *clientConn) fromBackendConnection(f frames.Frame) error {
	if f.Type != frames.FrameMethod {
		c.toClient(f)
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
		detail := fmt.Sprintf("backend %s closed the connection: %d %s", c.srv.opts.Backend.Name, cl.ReplyCode, cl.ReplyText)
		if !c.beginClosing(closeByBackend, ReasonBackendClosed, detail) {
			// A close of our own is in flight; answer the backend's and end.
			c.backend.sendMethod(0, &frames.ConnectionCloseOk{})
			c.markBackendClosed()
			reason, detail := c.outcome()
			c.teardown(reason, detail)
			return nil
		}
		if err := c.client.sendFrame(f.Type, 0, f.Payload); err != nil {
			c.teardown(ReasonClientGone, err.Error())
		}
		return nil
	case frames.ConnectionCloseOkKey:
		if c.closeInProgress() == closeByClient {
			// The client closes the socket once it has the close-ok;
			// closing it first would make the client read EOF before the
			// close-ok and report an error for a clean close. The client
			// loop ends the connection when the client hangs up, or after
			// CloseTimeout.
			c.markBackendClosed()
			c.client.conn.SetReadDeadline(time.Now().Add(c.srv.opts.CloseTimeout))
			c.client.sendFrame(f.Type, 0, f.Payload)
			return errBackendDone
		}
	}
	c.toClient(f)
	return nil
}

// fromBackendOnClosedChannel handles the backend's frames on a channel the
// proxy closed, up to its close-ok. A delivery already begun reaches the
// client whole; later ones are dropped (the backend requeues them when the
// channel closes, as the broker does after a channel error). The client gets
// the proxy's channel.close only with the backend's close-ok: only then may
// it reuse the channel id, which the backend would otherwise still be
// closing.
func (c *clientConn) fromBackendOnClosedChannel(f frames.Frame) error {
	ch := c.channels.get(f.Channel)
	if f.Type != frames.FrameMethod {
		if ch != nil && ch.backendContentOpen {
			c.toClient(f)
		}
		return nil
	}
	if ch != nil {
		ch.backendContentOpen = false
	}
	switch {
	case isMethod(f.Payload, frames.ChannelCloseOkKey):
		if notice := c.channels.takeNotice(f.Channel); notice != nil {
			c.toClientMethod(f.Channel, notice)
		}
		c.channels.closeOkArrived(f.Channel)
	case isMethod(f.Payload, frames.ChannelCloseKey):
		// The backend closed it too; it still answers ours with close-ok.
		if err := c.backend.writeMethod(f.Channel, &frames.ChannelCloseOk{}); err != nil {
			return err
		}
	}
	return nil
}

// toClient passes a frame to the client as it came.
func (c *clientConn) toClient(f frames.Frame) {
	if err := c.client.writeFrame(f.Type, f.Channel, f.Payload); err != nil {
		c.teardown(ReasonClientGone, fmt.Sprintf("writing to client: %v", err))
	}
}

func (c *clientConn) toClientMethod(channel uint16, m frames.Method) {
	if err := c.client.writeMethod(channel, m); err != nil {
		c.teardown(ReasonClientGone, fmt.Sprintf("writing to client: %v", err))
	}
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

// popFront removes and returns the first element, or false when empty.
func popFront(q *[]bool) bool {
	if len(*q) == 0 {
		return false
	}
	v := (*q)[0]
	*q = (*q)[1:]
	return v
}
