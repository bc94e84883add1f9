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
	if rt.mirror == nil {
		rt.sendTo(ch, f, nil, rt.links.homeOnly(), true)
		return nil
	}
	var noWait bool
	var record func() error
	var err error
	switch key {
	case frames.ExchangeDeclareKey:
		noWait, record, err = rt.declareRecord(args)
	case frames.ExchangeDeleteKey:
		noWait, record, err = rt.deleteRecord(args)
	case frames.ExchangeBindKey, frames.ExchangeUnbindKey:
		noWait, record, err = rt.bindRecord(key == frames.ExchangeBindKey, args)
	}
	if err != nil {
		return err
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

// declareRecord decodes an exchange.declare and returns its no-wait flag
// and what records the exchange once the backends declared it: nil for a
// passive declare, the default exchange, and an exchange the log knows.
func (rt *router) declareRecord(args []byte) (noWait bool, record func() error, err error) {
	var d frames.ExchangeDeclare
	if err := d.Decode(args); err != nil {
		return false, nil, err
	}
	if d.Passive || d.Exchange == "" {
		return d.NoWait, nil, nil
	}
	m := rt.mirror
	id := mirror.ExchangeID{VHost: rt.vhost, Name: d.Exchange}
	if known, ok := m.LookupExchange(id); ok && known.Type != "" {
		return d.NoWait, nil, nil // declared through a proxy before: the record holds
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
	return d.NoWait, func() error {
		ctx, cancel := mirrorContext(rt.ctx)
		defer cancel()
		m.ExchangeDeclared(ctx, x)
		return nil
	}, nil
}

// deleteRecord decodes an exchange.delete and returns its no-wait flag and
// what records the deletion.
func (rt *router) deleteRecord(args []byte) (noWait bool, record func() error, err error) {
	var d frames.ExchangeDelete
	if err := d.Decode(args); err != nil {
		return false, nil, err
	}
	return d.NoWait, func() error {
		ctx, cancel := mirrorContext(rt.ctx)
		defer cancel()
		rt.mirror.ExchangeDeleted(ctx, mirror.ExchangeID{VHost: rt.vhost, Name: d.Exchange})
		return nil
	}, nil
}

// bindRecord decodes an exchange.bind (bound) or exchange.unbind and
// returns its no-wait flag and what records the binding. A binding the log
// could not record is an error; an unbinding is not, since a removed
// binding left in the log only widens routes.
func (rt *router) bindRecord(bound bool, args []byte) (noWait bool, record func() error, err error) {
	var source string
	var b mirror.ExchangeBinding
	if bound {
		var d frames.ExchangeBind
		if err := d.Decode(args); err != nil {
			return false, nil, err
		}
		noWait, source = d.NoWait, d.Source
		b = mirror.ExchangeBinding{Destination: d.Destination, RoutingKey: d.RoutingKey, Arguments: encodeTable(d.Arguments)}
	} else {
		var d frames.ExchangeUnbind
		if err := d.Decode(args); err != nil {
			return false, nil, err
		}
		noWait, source = d.NoWait, d.Source
		b = mirror.ExchangeBinding{Destination: d.Destination, RoutingKey: d.RoutingKey, Arguments: encodeTable(d.Arguments)}
	}
	return noWait, func() error {
		ctx, cancel := mirrorContext(rt.ctx)
		defer cancel()
		err := rt.mirror.ExchangeBound(ctx, mirror.ExchangeID{VHost: rt.vhost, Name: source}, b, bound)
		if !bound {
			return nil
		}
		return err
	}, nil
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
