package engine

import (
	"context"
	"errors"
	"slices"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// What the proxy tells the engine about exchanges, so that a publish to
// one reaches only the backends holding a queue it routes to (the routing
// table, mirror.RoutingTable). The records are conservative: a backend
// may hold bindings of an exchange the log does not know (the exchange was
// there before the proxy, or a queue the log does not record was bound to
// it), and such a backend gets every publish to the exchange.

// LookupExchange returns the log's record of an exchange.
func (e *Engine) LookupExchange(id mirror.ExchangeID) (mirror.ExchangeMeta, bool) {
	return e.opts.Store.GetExchange(id)
}

// ExchangeAbsent returns the backends on which the exchange does not exist
// (a passive declare answers 404), asked before a client's first declare
// of it through the proxy: there, every binding it will have is made
// through a proxy. A backend that is down, or does not answer clearly, is
// not in the list; nor is one that refuses the proxy's account in the
// exchange's vhost.
func (e *Engine) ExchangeAbsent(ctx context.Context, id mirror.ExchangeID) []string {
	var absent []string
	live := e.liveness.live()
	for _, b := range e.opts.Backends {
		if !live.Has(b.Name) || ctx.Err() != nil {
			continue
		}
		err := e.operator.withChannel(b.Name, id.VHost, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(id.Name, "direct", false, false, false, false, nil)
		})
		if replyCode(err) == amqp.NotFound {
			absent = append(absent, b.Name)
		}
	}
	return absent
}

// ExchangeDeclared records an exchange a client declared through the proxy
// (x.Fresh from ExchangeAbsent before the declare). An exchange recorded
// already keeps its record: declared again, it is the same exchange, and
// what its Fresh list says still holds.
func (e *Engine) ExchangeDeclared(ctx context.Context, x mirror.ExchangeMeta) {
	// Not recorded, the exchange stays unknown: its publishes go to every
	// backend, which is never wrong.
	_ = e.records.updateExchange(ctx, x.ID, func(cur mirror.ExchangeMeta, exists bool) (mirror.ExchangeMeta, bool) {
		if exists && cur.Type != "" {
			return cur, false
		}
		if exists {
			// Known only as a binding's source so far: its bindings stay,
			// and a backend was fresh only if it still is and was now.
			x.Bindings = cur.Bindings
			x.Fresh = slices.DeleteFunc(x.Fresh, func(b string) bool { return !cur.IsFresh(b) })
		}
		return x, true
	})
}

// ExchangeDeleted forgets an exchange the client deleted, the
// exchange-to-exchange bindings to it and the queues' bindings to it, as
// RabbitMQ removes them: left in the log, they would route publishes to
// an exchange of that name declared again (a backend the binding sends
// the message to, with no copy of a queue it routes to there, would hand
// it to the alternate exchange), and bind a slave added later to it.
func (e *Engine) ExchangeDeleted(ctx context.Context, id mirror.ExchangeID) {
	for range maxConflicts {
		x, ok := e.opts.Store.GetExchange(id)
		if !ok {
			break
		}
		err := e.opts.Writer.DeleteExchange(ctx, id, x.Version)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			e.log.Warn("cannot forget a deleted exchange", "exchange", id.Name, "vhost", id.VHost, "err", err)
		}
		break
	}
	for _, x := range e.opts.Store.ListExchanges() {
		if x.ID.VHost != id.VHost || !slices.ContainsFunc(x.Bindings, func(b mirror.ExchangeBinding) bool { return b.Destination == id.Name }) {
			continue
		}
		// A failure is logged; the binding left behind matters only if an
		// exchange of that name is declared again.
		_ = e.records.updateExchange(ctx, x.ID, func(cur mirror.ExchangeMeta, exists bool) (mirror.ExchangeMeta, bool) {
			if !exists {
				return cur, false
			}
			cur.Bindings = slices.DeleteFunc(cur.Bindings, func(b mirror.ExchangeBinding) bool { return b.Destination == id.Name })
			return cur, true
		})
	}
	for _, q := range e.opts.Store.List() {
		if q.ID.VHost == id.VHost && slices.ContainsFunc(q.Bindings, func(b mirror.Binding) bool { return b.Exchange == id.Name }) {
			err := e.records.changeBindings(ctx, q.ID, func(bindings []mirror.Binding) ([]mirror.Binding, bool) {
				before := len(bindings)
				kept := slices.DeleteFunc(bindings, func(b mirror.Binding) bool { return b.Exchange == id.Name })
				return kept, len(kept) != before
			})
			if err != nil {
				e.log.Warn("cannot forget a queue's bindings to a deleted exchange", "queue", q.ID.Name, "vhost", q.ID.VHost, "exchange", id.Name, "err", err)
			}
		}
	}
	e.view.rebuild()
}

// ExchangeBound records an exchange-to-exchange binding added (bound true)
// or removed on every backend. A source the log has no record of gets one
// of unknown type: publishes to it still go to every backend, but the
// binding is known when the route of another exchange passes through it.
// An error says the binding exists on the brokers but not in the log.
func (e *Engine) ExchangeBound(ctx context.Context, source mirror.ExchangeID, b mirror.ExchangeBinding, bound bool) error {
	return e.records.updateExchange(ctx, source, func(cur mirror.ExchangeMeta, exists bool) (mirror.ExchangeMeta, bool) {
		if !exists {
			if !bound {
				return cur, false
			}
			cur = mirror.ExchangeMeta{ID: source}
		}
		i := slices.IndexFunc(cur.Bindings, func(x mirror.ExchangeBinding) bool {
			return x.Destination == b.Destination && x.RoutingKey == b.RoutingKey && slices.Equal(x.Arguments, b.Arguments)
		})
		switch {
		case bound && i >= 0, !bound && i < 0:
			return cur, false
		case bound:
			cur.Bindings = append(cur.Bindings, b)
		default:
			cur.Bindings = slices.Delete(cur.Bindings, i, i+1)
		}
		return cur, true
	})
}

// BoundUnrecorded says that a queue the log does not record (exclusive,
// server-named) on backend was bound to the exchange: that backend now
// holds a binding the log does not know, and gets every publish to it. An
// error says the log does not know that yet.
func (e *Engine) BoundUnrecorded(ctx context.Context, exchange mirror.ExchangeID, backend string) error {
	return e.records.updateExchange(ctx, exchange, func(cur mirror.ExchangeMeta, exists bool) (mirror.ExchangeMeta, bool) {
		if !exists || !cur.IsFresh(backend) {
			return cur, false
		}
		cur.Fresh = slices.DeleteFunc(cur.Fresh, func(b string) bool { return b == backend })
		return cur, true
	})
}

// Routing returns the routing table of the metadata as this proxy sees
// it now; the same table until the metadata changes, so a caller may keep
// a route it computed while Routing returns the same table.
func (e *Engine) Routing() *mirror.RoutingTable { return e.view.routing(e.backends) }

// WaitApplied returns once this proxy has applied the metadata log up to
// index and its routing shows it (another proxy recorded a binding and
// waits for every proxy before its client hears of it).
func (m Member) WaitApplied(ctx context.Context, index uint64) error {
	if err := m.e.opts.Store.WaitApplied(ctx, index); err != nil {
		return err
	}
	m.e.view.rebuild()
	return nil
}
