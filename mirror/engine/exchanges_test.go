package engine

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// The exchange records the proxy writes through the engine, and the
// routing they give publishes: against the three real brokers, which
// ExchangeAbsent asks.
func TestExchangeRecordsRoutePublishes(t *testing.T) {
	h := newHarness(t, "", nil)
	defer h.close() // closed before the restart below too; close is idempotent
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	route := func(exchange, key string) mirror.Route {
		return h.engine.Routing().Route(mirror.RoutedMessage{VHost: "/", Exchange: exchange, RoutingKey: key})
	}

	// An exchange that exists on rabbit2 before any proxy declared it: its
	// bindings there are not known.
	old := uniqueName(t, "existing")
	conn := dial(t, "rabbit2")
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(old, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if got := h.engine.ExchangeAbsent(ctx, mirror.ExchangeID{VHost: "/", Name: old}); !slices.Equal(got, []string{"rabbit1", "rabbit3"}) {
		t.Errorf("ExchangeAbsent(%s) = %v, want the backends without it", old, got)
	}

	fresh := mirror.ExchangeID{VHost: "/", Name: uniqueName(t, "fresh")}
	absent := h.engine.ExchangeAbsent(ctx, fresh)
	if !slices.Equal(absent, []string{"rabbit1", "rabbit2", "rabbit3"}) {
		t.Fatalf("ExchangeAbsent(new exchange) = %v, want every backend", absent)
	}
	h.engine.ExchangeDeclared(ctx, mirror.ExchangeMeta{ID: fresh, Type: "direct", Fresh: absent})
	if r := route(fresh.Name, "k"); !r.All {
		t.Errorf("a publish to an exchange with no binding: %+v, want every backend", r)
	}

	// A queue on rabbit3 bound with key k: the publish goes there only,
	// visible the moment Bound returns.
	q := queueID(uniqueName(t, "bound"))
	if _, err := h.engine.Declared(ctx, mirror.QueueMeta{ID: q, Master: "rabbit3"}); err != nil {
		t.Fatal(err)
	}
	if err := h.engine.Bound(ctx, q, mirror.Binding{Exchange: fresh.Name, RoutingKey: "k"}, true); err != nil {
		t.Fatal(err)
	}
	if r := route(fresh.Name, "k"); r.All || !slices.Equal(r.Backends, []string{"rabbit3"}) {
		t.Errorf("route after the binding: %+v, want rabbit3", r)
	}

	// Declared again (a client's idempotent declare): the record stays.
	h.engine.ExchangeDeclared(ctx, mirror.ExchangeMeta{ID: fresh, Type: "direct"})
	if x, ok := h.engine.LookupExchange(fresh); !ok || len(x.Fresh) != 3 {
		t.Errorf("record after a second declare: %+v, %v; want it unchanged", x, ok)
	}

	// An exclusive queue on rabbit1 bound to it: rabbit1 gets every publish.
	if err := h.engine.BoundUnrecorded(ctx, fresh, "rabbit1"); err != nil {
		t.Fatal(err)
	}
	if r := route(fresh.Name, "k"); !slices.Equal(r.Backends, []string{"rabbit1", "rabbit3"}) {
		t.Errorf("route after an unrecorded queue's binding: %+v, want rabbit1 and rabbit3", r)
	}

	// An exchange-to-exchange binding into fresh from a second exchange.
	source := mirror.ExchangeID{VHost: "/", Name: uniqueName(t, "source")}
	h.engine.ExchangeDeclared(ctx, mirror.ExchangeMeta{ID: source, Type: "fanout", Fresh: absent})
	if err := h.engine.ExchangeBound(ctx, source, mirror.ExchangeBinding{Destination: fresh.Name}, true); err != nil {
		t.Fatal(err)
	}
	if r := route(source.Name, "k"); !slices.Equal(r.Backends, []string{"rabbit1", "rabbit3"}) {
		t.Errorf("route through the exchange binding: %+v, want rabbit1 and rabbit3", r)
	}
	// Deleting the destination removes the binding too: nothing routed.
	h.engine.ExchangeDeleted(ctx, fresh)
	if x, ok := h.engine.LookupExchange(source); !ok || len(x.Bindings) != 0 {
		t.Errorf("source after its destination was deleted: %+v, %v; want no binding", x, ok)
	}
	if m, ok := h.store.Get(q); !ok || len(m.Bindings) != 0 {
		t.Errorf("queue bound to the deleted exchange: %+v, %v; want its binding gone", m, ok)
	}
	if r := route(source.Name, "k"); !r.All {
		t.Errorf("route after the destination's deletion: %+v, want every backend", r)
	}

	// The records survive a restart of the store (log and snapshot).
	if err := h.store.Snapshot(); err != nil {
		t.Fatal(err)
	}
	h.close()
	restarted := newHarness(t, h.dir, nil)
	defer restarted.close()
	if x, ok := restarted.engine.LookupExchange(source); !ok || x.Type != "fanout" || len(x.Fresh) != 3 {
		t.Errorf("record after a restart: %+v, %v", x, ok)
	}
}
