package proxy

import "github.com/amqp-mirror/amqp-mirror/frames"

// The router's channel-wide methods: channel.open, which opens the channel
// on the home link (other links open it when the channel first needs them),
// and the settings and requests that reach every link the channel is open
// on (basic.qos, confirm.select, tx, basic.recover-async, basic.recover,
// channel.flow). A setting is recorded on the channel first, so that links
// the channel opens on later repeat it (ensureChannel).

// onOpenLinks sends a channel-wide method to every link the channel is open
// on; the first answers. settingOk is the reply to a setting the proxy
// repeats on every link it opens later (basic.qos, confirm.select,
// tx.select: ensureChannel), nil for other methods: when no link can take
// the setting now, or every link asked is lost before it answers, the
// setting still holds, and the proxy answers it.
func (rt *router) onOpenLinks(ch *channelState, f frames.Frame, wantReply bool, settingOk frames.Method) error {
	targets := rt.links.openOn(ch)
	if len(targets) > 1 && f.Type == frames.FrameMethod && isMethod(f.Payload, frames.ConfirmSelectKey) {
		for _, l := range targets {
			l.selectConfirm(ch.id)
		}
	}
	if len(targets) == 0 {
		if home := rt.links.home(); home != nil {
			targets = rt.reach(ch, home.name)
		}
	}
	switch {
	case len(targets) > 0:
		rt.sendGroup(ch, f, targets, newGroup(targets, wantReply, nil, settingOk))
	case wantReply && settingOk != nil:
		rt.out.methodOnChannel(ch, settingOk)
	}
	return nil
}

// qos records the client's basic.qos, to repeat on links the channel opens
// on later, and passes it to the links it is open on.
func (rt *router) qos(ch *channelState, f frames.Frame, args []byte) error {
	var qos frames.BasicQos
	if err := qos.Decode(args); err != nil {
		return err
	}
	ch.qos = &qos
	return rt.onOpenLinks(ch, f, true, &frames.BasicQosOk{})
}

// confirmSelect puts the channel in confirm mode for the client.
func (rt *router) confirmSelect(ch *channelState, f frames.Frame, args []byte) error {
	var sel frames.ConfirmSelect
	if err := sel.Decode(args); err != nil {
		return err
	}
	var observe func(float64)
	if o := rt.srv.confirmLatency.Load(); o != nil {
		observe = *o
	}
	ch.selectConfirms(observe)
	return rt.onOpenLinks(ch, f, !sel.NoWait, &frames.ConfirmSelectOk{})
}

// txSelect makes the channel transactional. On a channel in the proxy's
// own confirm mode the backends would refuse it ("cannot switch from
// confirm to tx mode"): the proxy keeps the transaction itself.
func (rt *router) txSelect(ch *channelState, f frames.Frame) error {
	if ch.ownConfirms.Load() {
		rt.beginEmulatedTx(ch)
		return nil
	}
	ch.selectTransactions()
	return rt.onOpenLinks(ch, f, true, &frames.TxSelectOk{})
}

// txEnd passes tx.commit or tx.rollback on. The broker applies the
// transaction before anything sent after it, so the client's next acks
// already see the outcome: a rollback leaves the transaction's acks
// unapplied, and those deliveries can be acked again at once.
func (rt *router) txEnd(ch *channelState, f frames.Frame, rollback bool) error {
	ch.endTransaction(rollback, rt.settler.trimSettled)
	return rt.onOpenLinks(ch, f, true, nil)
}

// recoverAsync passes basic.recover-async on: the brokers redeliver every
// outstanding delivery with a new tag, so the old tags are void.
func (rt *router) recoverAsync(ch *channelState, f frames.Frame) error {
	rt.settler.takenBack(ch.forgetDeliveries())
	return rt.onOpenLinks(ch, f, false, nil)
}

// openChannel opens a client channel on the home link; other links open it
// when the channel first needs them (ensureChannel).
func (rt *router) openChannel(ch *channelState, f frames.Frame, home *link) error {
	home.openChannel(ch.id)
	rt.send(ch, f, []*link{home}, true, nil)
	return nil
}
