package proxy

import (
	"fmt"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// What the proxy does with each client frame that fromClient dispatches:
// one handler per method it acts on, named after the method; the state
// they change belongs to the channel (channelState's methods). The methods
// routed to the links are the router's (route.go, channelwide.go for the
// channel-wide ones), and the acks, nacks and rejects the settler's
// (settle.go).

// contentFromClient handles a content frame (header or body). A publish's
// content goes where its method went: the broker assembles content even on
// a channel it is closing, so content without its method, or a method
// without its content, would be a connection error there.
func (c *clientConn) contentFromClient(f frames.Frame) error {
	ch := c.channels.get(f.Channel)
	if ch == nil {
		c.toBackend(f)
		return nil
	}
	if ch.dropContent {
		return nil
	}
	if ch.tx.on {
		_, err := c.router.fromClientInEmulatedTx(ch, f, 0)
		return err
	}
	return ch.publisher.publishContent(&c.router, f)
}

// connectionMethod handles a method on channel 0: the home backend answers
// them all; connection.close also begins the proxy's close.
func (c *clientConn) connectionMethod(f frames.Frame, key uint32, args []byte) {
	if key == frames.ConnectionCloseKey {
		var cl frames.ConnectionClose
		detail := "client sent connection.close"
		if cl.Decode(args) == nil && cl.ReplyCode != frames.ReplySuccess {
			detail = fmt.Sprintf("client sent connection.close %d %s", cl.ReplyCode, cl.ReplyText)
		}
		c.beginClosing(closeByClient, ReasonClientClosed, detail)
	}
	c.toBackend(f)
}

// methodOnClosedChannel handles a method on a channel that is not open:
// channel.open opens it; anything else the home backend answers with the
// error a broker gives.
func (c *clientConn) methodOnClosedChannel(f frames.Frame, key uint32) error {
	if key == frames.ChannelOpenKey {
		ch := c.channels.open(f.Channel)
		if home := c.links.home(); ch != nil && home != nil {
			return c.router.openChannel(ch, f, home)
		}
	}
	c.toBackend(f)
	return nil
}

// channelMethod handles a method on an open channel. A publish held for its
// content header goes out first (a method came where the header belongs), a
// closing channel takes only its close handshake, and a transaction the
// proxy keeps holds what it must; dispatchChannelMethod has the rest.
func (c *clientConn) channelMethod(ch *channelState, f frames.Frame, key uint32, args []byte) error {
	if err := ch.publisher.methodArrived(&c.router); err != nil {
		return err
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
		if handled, err := c.router.fromClientInEmulatedTx(ch, f, key); handled || err != nil {
			return err
		}
	}
	return c.dispatchChannelMethod(ch, f, key, args)
}

// dispatchChannelMethod passes a method on an open channel to its handler;
// the methods the proxy does not act on go to the home backend as they came
// (channel.open on an open channel too: the backend answers as a broker
// does).
func (c *clientConn) dispatchChannelMethod(ch *channelState, f frames.Frame, key uint32, args []byte) error {
	switch key {
	case frames.BasicPublishKey:
		return ch.publisher.publish(&c.router, f, args)
	case frames.BasicAckKey, frames.BasicNackKey, frames.BasicRejectKey:
		return c.settler.settleMethod(ch, f, key, args)
	case frames.BasicConsumeKey:
		return c.router.consume(ch, f, args)
	case frames.BasicGetKey:
		return c.router.get(ch, f, args)
	case frames.BasicCancelKey:
		return c.router.cancel(ch, f, args)
	case frames.ChannelCloseKey:
		c.clientClosesChannel(ch, f)
		return nil
	case frames.ChannelCloseOkKey:
		// Not closing: nothing to answer. The home backend judges it.
		c.router.sendTo(ch, f, nil, c.links.openOn(ch), false)
		return nil
	case frames.QueueDeclareKey, frames.QueueBindKey, frames.QueueUnbindKey, frames.QueuePurgeKey, frames.QueueDeleteKey:
		return c.router.queueMethod(ch, f, key, args)
	case frames.ExchangeDeclareKey, frames.ExchangeDeleteKey, frames.ExchangeBindKey, frames.ExchangeUnbindKey:
		// Exchanges and their bindings exist on every backend, as in a
		// RabbitMQ cluster.
		return c.router.exchangeMethod(ch, f, key, args)
	case frames.BasicQosKey:
		return c.router.qos(ch, f, args)
	case frames.ConfirmSelectKey:
		return c.router.confirmSelect(ch, f, args)
	case frames.TxSelectKey:
		return c.router.txSelect(ch, f)
	case frames.TxCommitKey, frames.TxRollbackKey:
		return c.router.txEnd(ch, f, key == frames.TxRollbackKey)
	case frames.BasicRecoverAsyncKey:
		return c.router.recoverAsync(ch, f)
	case frames.BasicRecoverKey, frames.ChannelFlowKey:
		return c.router.onOpenLinks(ch, f, true, nil)
	}
	c.toBackend(f)
	return nil
}
