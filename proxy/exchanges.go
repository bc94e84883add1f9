package proxy

import (
	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Exchanges and their bindings exist on every backend, as in a RabbitMQ
// cluster. With mirroring, what the client declares, deletes and binds is
// recorded in the metadata log as well, so that a publish to an exchange
// reaches only the backends holding a queue it routes to (exchangeRoute).

// exchangeMethod sends an exchange method to every backend and records it.
func (rt *router) exchangeMethod(ch *channelState, f frames.Frame, key uint32, args []byte) error {
	m := rt.mirror
	if m == nil {
		rt.sendTo(ch, f, nil, rt.links.homeOnly(), true)
		return nil
	}
	var noWait bool
	var record func() error
	switch key {
	case frames.ExchangeDeclareKey:
		var d frames.ExchangeDeclare
		if err := d.Decode(args); err != nil {
			return err
		}
		noWait = d.NoWait
		if d.Passive || d.Exchange == "" {
			break
		}
		id := mirror.ExchangeID{VHost: rt.vhost, Name: d.Exchange}
		if known, ok := m.LookupExchange(id); ok && known.Type != "" {
			break // declared through a proxy before: the record holds
		}
		x := mirror.ExchangeMeta{ID: id, Type: d.Type}
		if ae, ok := d.Arguments.Get("alternate-exchange"); ok {
			switch v := ae.(type) {
			case string:
				x.AlternateExchange = v
			case []byte:
				x.AlternateExchange = string(v)
			}
		}
		// Asked before the declare: once it is made, every backend has it.
		ctx, cancel := mirrorContext(rt.ctx)
		x.Fresh = m.ExchangeAbsent(ctx, id)
		cancel()
		record = func() error {
			ctx, cancel := mirrorContext(rt.ctx)
			defer cancel()
			m.ExchangeDeclared(ctx, x)
			return nil
		}
	case frames.ExchangeDeleteKey:
		var d frames.ExchangeDelete
		if err := d.Decode(args); err != nil {
			return err
		}
		noWait = d.NoWait
		record = func() error {
			ctx, cancel := mirrorContext(rt.ctx)
			defer cancel()
			m.ExchangeDeleted(ctx, mirror.ExchangeID{VHost: rt.vhost, Name: d.Exchange})
			return nil
		}
	case frames.ExchangeBindKey, frames.ExchangeUnbindKey:
		var source string
		var b mirror.ExchangeBinding
		bound := key == frames.ExchangeBindKey
		if bound {
			var d frames.ExchangeBind
			if err := d.Decode(args); err != nil {
				return err
			}
			noWait, source = d.NoWait, d.Source
			b = mirror.ExchangeBinding{Destination: d.Destination, RoutingKey: d.RoutingKey, Arguments: encodeTable(d.Arguments)}
		} else {
			var d frames.ExchangeUnbind
			if err := d.Decode(args); err != nil {
				return err
			}
			noWait, source = d.NoWait, d.Source
			b = mirror.ExchangeBinding{Destination: d.Destination, RoutingKey: d.RoutingKey, Arguments: encodeTable(d.Arguments)}
		}
		record = func() error {
			ctx, cancel := mirrorContext(rt.ctx)
			defer cancel()
			err := m.ExchangeBound(ctx, mirror.ExchangeID{VHost: rt.vhost, Name: source}, b, bound)
			if !bound {
				return nil // left in the log, a removed binding only widens routes
			}
			return err
		}
	}
	var after func([]byte) []byte
	if record != nil {
		// Recorded before the client hears of it: its next publish is
		// routed by the record.
		after = func(reply []byte) []byte {
			if err := record(); err != nil {
				rt.bindingNotRecorded(ch, key, err)
				return nil
			}
			return reply
		}
		if noWait {
			after(nil)
			after = nil
		}
	}
	rt.sendTo(ch, f, after, rt.reachAll(ch), !noWait)
	return nil
}

// boundUnrecorded notes, after a queue.bind of a queue the log does not
// record (exclusive, server-named) on backend, that the exchange's
// publishes must reach that backend.
func (rt *router) boundUnrecorded(exchange, backend string) error {
	if exchange == "" {
		return nil
	}
	ctx, cancel := mirrorContext(rt.ctx)
	defer cancel()
	return rt.mirror.BoundUnrecorded(ctx, mirror.ExchangeID{VHost: rt.vhost, Name: exchange}, backend)
}

// bindingNotRecorded closes the channel of a binding the brokers made but
// the metadata log could not record: publishes through the proxies are
// routed by the log and would miss it, so the client must not take it as
// bound; it may bind again on a new channel (binding is idempotent).
// Called where a reply would go (a link's read loop, or the client loop
// for no-wait), the close waits for the channel's message boundary.
func (rt *router) bindingNotRecorded(ch *channelState, key uint32, err error) {
	classID, methodID := uint16(key>>16), uint16(key)
	rt.log.Warn("a binding is not recorded in the metadata log; closing its channel", "err", err)
	rt.atBoundary(ch, func() {
		rt.closeChannel(ch, frames.InternalError,
			"INTERNAL_ERROR - the binding could not be recorded in amqp-mirror's metadata: "+err.Error(), classID, methodID)
	})
}
