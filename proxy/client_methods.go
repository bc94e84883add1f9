package proxy

import (
	"fmt"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// What the proxy does with each client frame that fromClient dispatches:
// one handler per method it acts on, named after the method; the state
// they change belongs to the channel (channelState's methods). The methods
// routed to the links are the router's (route.go), and the acks, nacks
// and rejects the settler's (settle.go).

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
		_, err := c.fromClientInEmulatedTx(ch, f, 0)
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
			return c.openChannel(ch, f, home)
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
		if handled, err := c.fromClientInEmulatedTx(ch, f, key); handled || err != nil {
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
		return c.qos(ch, f, args)
	case frames.ConfirmSelectKey:
		return c.confirmSelect(ch, f, args)
	case frames.TxSelectKey:
		return c.txSelect(ch, f)
	case frames.TxCommitKey, frames.TxRollbackKey:
		return c.txEnd(ch, f, key == frames.TxRollbackKey)
	case frames.BasicRecoverAsyncKey:
		return c.recoverAsync(ch, f)
	case frames.BasicRecoverKey, frames.ChannelFlowKey:
		return c.router.onOpenLinks(ch, f, true, nil)
	}
	c.toBackend(f)
	return nil
}

// qos records the client's basic.qos, to repeat on links the channel opens
// on later, and passes it to the links it is open on.
func (c *clientConn) qos(ch *channelState, f frames.Frame, args []byte) error {
	var qos frames.BasicQos
	if err := qos.Decode(args); err != nil {
		return err
	}
	ch.qos = &qos
	return c.router.onOpenLinks(ch, f, true, &frames.BasicQosOk{})
}

// confirmSelect puts the channel in confirm mode for the client.
func (c *clientConn) confirmSelect(ch *channelState, f frames.Frame, args []byte) error {
	var sel frames.ConfirmSelect
	if err := sel.Decode(args); err != nil {
		return err
	}
	var observe func(float64)
	if o := c.srv.confirmLatency.Load(); o != nil {
		observe = *o
	}
	ch.selectConfirms(observe)
	return c.router.onOpenLinks(ch, f, !sel.NoWait, &frames.ConfirmSelectOk{})
}

// txSelect makes the channel transactional. On a channel in the proxy's
// own confirm mode the backends would refuse it ("cannot switch from
// confirm to tx mode"): the proxy keeps the transaction itself.
func (c *clientConn) txSelect(ch *channelState, f frames.Frame) error {
	if ch.ownConfirms.Load() {
		c.beginEmulatedTx(ch)
		return nil
	}
	ch.selectTransactions()
	return c.router.onOpenLinks(ch, f, true, &frames.TxSelectOk{})
}

// txEnd passes tx.commit or tx.rollback on. The broker applies the
// transaction before anything sent after it, so the client's next acks
// already see the outcome: a rollback leaves the transaction's acks
// unapplied, and those deliveries can be acked again at once.
func (c *clientConn) txEnd(ch *channelState, f frames.Frame, rollback bool) error {
	ch.endTransaction(rollback, c.settler.trimSettled)
	return c.router.onOpenLinks(ch, f, true, nil)
}

// recoverAsync passes basic.recover-async on: the brokers redeliver every
// outstanding delivery with a new tag, so the old tags are void.
func (c *clientConn) recoverAsync(ch *channelState, f frames.Frame) error {
	ch.forgetDeliveries()
	return c.router.onOpenLinks(ch, f, false, nil)
}

// openChannel opens a client channel on the home link; other links open it
// when the channel first needs them (ensureChannel).
func (c *clientConn) openChannel(ch *channelState, f frames.Frame, home *link) error {
	home.openChannel(ch.id)
	c.router.send(ch, f, []*link{home}, true, nil)
	return nil
}
