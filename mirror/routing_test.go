package mirror

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// exchangeIn is an exchange record in vhost, fresh on every seed backend
// (the log knows all its bindings) unless fresh says otherwise.
func exchangeIn(vhost, name, kind string, options ...func(*ExchangeMeta)) ExchangeMeta {
	x := ExchangeMeta{ID: ExchangeID{VHost: vhost, Name: name}, Type: kind, Fresh: seedBackends}
	for _, o := range options {
		o(&x)
	}
	return x
}

func exchange(name, kind string, options ...func(*ExchangeMeta)) ExchangeMeta {
	return exchangeIn("/", name, kind, options...)
}

func alternate(name string) func(*ExchangeMeta) {
	return func(x *ExchangeMeta) { x.AlternateExchange = name }
}

func fresh(backends ...string) func(*ExchangeMeta) {
	return func(x *ExchangeMeta) { x.Fresh = backends }
}

// toExchange is an exchange-to-exchange binding from the exchange.
func toExchange(destination, key string, arguments ...[]byte) func(*ExchangeMeta) {
	return func(x *ExchangeMeta) {
		b := ExchangeBinding{Destination: destination, RoutingKey: key}
		if len(arguments) > 0 {
			b.Arguments = arguments[0]
		}
		x.Bindings = append(x.Bindings, b)
	}
}

// boundQueue is a queue in vhost "/" whose master is the first backend of
// copies ("rabbit1,rabbit2" is a master on rabbit1 and a slave on rabbit2).
func boundQueue(name, copies string, bindings ...Binding) QueueMeta {
	return boundQueueIn("/", name, copies, bindings...)
}

func boundQueueIn(vhost, name, copies string, bindings ...Binding) QueueMeta {
	backends := strings.Split(copies, ",")
	q := QueueMeta{ID: QueueID{VHost: vhost, Name: name}, Master: backends[0], Bindings: bindings}
	for _, s := range backends[1:] {
		q.Slaves = append(q.Slaves, Slave{Backend: s, Synchronised: true})
	}
	return q
}

func bind(exchange, key string) Binding { return Binding{Exchange: exchange, RoutingKey: key} }

func bindArguments(exchange string, arguments []byte) Binding {
	return Binding{Exchange: exchange, Arguments: arguments}
}

// arguments encodes a field table the way it came on the wire.
func arguments(tb testing.TB, fields ...frames.Field) []byte {
	tb.Helper()
	b, err := frames.AppendTable(nil, frames.Table(fields))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func field(key string, value any) frames.Field { return frames.Field{Key: key, Value: value} }

// undecodable is a table whose size runs past its end.
var undecodable = []byte{0, 0, 0, 9, 1}

func publish(exchange, key string) RoutedMessage {
	return RoutedMessage{VHost: "/", Exchange: exchange, RoutingKey: key, HeadersKnown: true}
}

func withHeaders(m RoutedMessage, fields ...frames.Field) RoutedMessage {
	m.Headers, m.HeadersKnown = frames.Table(fields), true
	return m
}

func to(backends ...string) Route { return Route{Backends: backends} }

var everywhere = Route{All: true}

func TestRoute(t *testing.T) {
	headersAll := arguments(t, field("x-match", "all"), field("kind", "invoice"))
	tests := []struct {
		name      string
		backends  []string // seedBackends when nil
		exchanges []ExchangeMeta
		queues    []QueueMeta
		message   RoutedMessage
		want      Route
	}{
		{
			name:      "direct: the bound queue's master and slaves",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q", "rabbit2,rabbit3", bind("x", "k")), boundQueue("other", "rabbit1", bind("x", "other"))},
			message:   publish("x", "k"),
			want:      to("rabbit2", "rabbit3"),
		},
		{
			name:      "direct: the key must be equal",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q", "rabbit2", bind("x", "k")), boundQueue("q2", "rabbit1", bind("x", "K"))},
			message:   publish("x", "K"),
			want:      to("rabbit1"),
		},
		{
			name:      "fanout: every binding whatever its key",
			exchanges: []ExchangeMeta{exchange("x", "fanout")},
			queues:    []QueueMeta{boundQueue("q1", "rabbit1", bind("x", "a")), boundQueue("q3", "rabbit3", bind("x", ""))},
			message:   publish("x", "z"),
			want:      to("rabbit1", "rabbit3"),
		},
		{
			name:      "topic: the matching patterns only",
			exchanges: []ExchangeMeta{exchange("x", "topic")},
			queues: []QueueMeta{
				boundQueue("eu", "rabbit1", bind("x", "orders.eu.*")),
				boundQueue("all", "rabbit2", bind("x", "orders.#")),
				boundQueue("us", "rabbit3", bind("x", "orders.us.*")),
			},
			message: publish("x", "orders.eu.paid"),
			want:    to("rabbit1", "rabbit2"),
		},
		{
			name:      "order is the configured one, duplicates once, unconfigured names left out",
			backends:  []string{"rabbit3", "rabbit1", "rabbit2"},
			exchanges: []ExchangeMeta{exchange("x", "fanout")},
			queues: []QueueMeta{
				boundQueue("q1", "rabbit2,rabbit9,rabbit3", bind("x", "")),
				boundQueue("q2", "rabbit3,rabbit2", bind("x", "")),
			},
			message: publish("x", "k"),
			want:    to("rabbit3", "rabbit2"),
		},
		{
			name:      "a queue bound twice counts once",
			exchanges: []ExchangeMeta{exchange("x", "topic")},
			queues:    []QueueMeta{boundQueue("q", "rabbit3,rabbit1", bind("x", "a.*"), bind("x", "#"))},
			message:   publish("x", "a.b"),
			want:      to("rabbit1", "rabbit3"),
		},
		{
			name:      "nothing routed: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k"))},
			message:   publish("x", "miss"),
			want:      everywhere,
		},
		{
			name:      "no binding at all: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "fanout")},
			message:   publish("x", "k"),
			want:      everywhere,
		},
		{
			name:    "default exchange: everywhere",
			queues:  []QueueMeta{boundQueue("q", "rabbit1")},
			message: publish("", "q"),
			want:    everywhere,
		},
		{
			name:      "exchange without a record: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("y", "k"))},
			message:   publish("y", "k"),
			want:      everywhere,
		},
		{
			name:      "a plugin's exchange type: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "x-consistent-hash")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "1"))},
			message:   publish("x", "k"),
			want:      everywhere,
		},
		{
			name:      "an exchange known only as a binding's source (no type): everywhere",
			exchanges: []ExchangeMeta{exchange("x", "", toExchange("y", "")), exchange("y", "fanout")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("y", ""))},
			message:   publish("x", "k"),
			want:      everywhere,
		},
		{
			name:      "an unknown type on the way: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "fanout", toExchange("y", "")), exchange("y", "x-delayed-message")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", ""))},
			message:   publish("x", "k"),
			want:      everywhere,
		},
		{
			name:      "vhosts are apart: a queue of another vhost bound to a namesake",
			exchanges: []ExchangeMeta{exchange("x", "fanout"), exchangeIn("other", "x", "fanout")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "")), boundQueueIn("other", "q", "rabbit2", bind("x", ""))},
			message:   publish("x", "k"),
			want:      to("rabbit1"),
		},
		{
			name:      "vhosts are apart: the other vhost's exchange is not there",
			exchanges: []ExchangeMeta{exchangeIn("other", "x", "fanout")},
			queues:    []QueueMeta{boundQueueIn("other", "q", "rabbit2", bind("x", ""))},
			message:   publish("x", "k"),
			want:      everywhere,
		},
		{
			name:      "backends where the exchange is not fresh are added",
			exchanges: []ExchangeMeta{exchange("x", "direct", fresh("rabbit1", "rabbit2"))},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k"))},
			message:   publish("x", "k"),
			want:      to("rabbit1", "rabbit3"),
		},
		{
			name:      "an exchange fresh nowhere sends everywhere it is listed",
			exchanges: []ExchangeMeta{exchange("x", "direct", fresh())},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k"))},
			message:   publish("x", "k"),
			want:      to("rabbit1", "rabbit2", "rabbit3"),
		},
		{
			name: "backends where an exchange on the way is not fresh are added",
			exchanges: []ExchangeMeta{
				exchange("x", "fanout", toExchange("y", "")),
				exchange("y", "fanout", fresh("rabbit1", "rabbit3")),
			},
			queues:  []QueueMeta{boundQueue("q", "rabbit1", bind("y", ""))},
			message: publish("x", "k"),
			want:    to("rabbit1", "rabbit2"),
		},
		{
			name:      "non-fresh backends alone do not make a route: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "direct", fresh("rabbit1"))},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k"))},
			message:   publish("x", "miss"),
			want:      everywhere,
		},

		// CC and BCC
		{
			name:      "CC and BCC keys route like the routing key",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues: []QueueMeta{
				boundQueue("q1", "rabbit1", bind("x", "k")),
				boundQueue("q2", "rabbit2", bind("x", "cc")),
				boundQueue("q3", "rabbit3", bind("x", "bcc")),
			},
			message: withHeaders(publish("x", "miss"), field("CC", []any{"cc"}), field("BCC", []any{"bcc"})),
			want:    to("rabbit2", "rabbit3"),
		},
		{
			name:      "CC keys on a topic exchange",
			exchanges: []ExchangeMeta{exchange("x", "topic")},
			queues:    []QueueMeta{boundQueue("q1", "rabbit1", bind("x", "a.*")), boundQueue("q2", "rabbit2", bind("x", "b.#"))},
			message:   withHeaders(publish("x", "a.1"), field("CC", []any{"b", "c.d"})),
			want:      to("rabbit1", "rabbit2"),
		},
		{
			name:      "CC elements other than strings are not keys",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q1", "rabbit1", bind("x", "k")), boundQueue("q2", "rabbit2", bind("x", "5"))},
			message:   withHeaders(publish("x", "k"), field("CC", []any{int32(5), nil, frames.Table{}})),
			want:      to("rabbit1"),
		},
		{
			name:      "CC as byte arrays are keys too",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q1", "rabbit1", bind("x", "k")), boundQueue("q2", "rabbit2", bind("x", "cc"))},
			message:   withHeaders(publish("x", "k"), field("CC", []any{[]byte("cc")})),
			want:      to("rabbit1", "rabbit2"),
		},
		{
			name: "a byte array CC key keeps the alternate exchange in",
			exchanges: []ExchangeMeta{
				exchange("f", "fanout", toExchange("x", "")),
				exchange("x", "direct", alternate("ae")), exchange("ae", "fanout"),
			},
			queues: []QueueMeta{
				boundQueue("q1", "rabbit1", bind("x", "cc")),
				boundQueue("q2", "rabbit2", bind("ae", "")),
				boundQueue("q3", "rabbit3", bind("f", "")),
			},
			message: withHeaders(publish("f", "miss"), field("CC", []any{[]byte("cc")})),
			want:    to("rabbit1", "rabbit2", "rabbit3"),
		},
		{
			name:      "a byte array CC key alone makes no queue sure: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q1", "rabbit1", bind("x", "cc"))},
			message:   withHeaders(publish("x", "miss"), field("CC", []any{[]byte("cc")})),
			want:      everywhere,
		},
		{
			name:      "CC of another type: RabbitMQ refuses, everywhere",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q1", "rabbit1", bind("x", "k"))},
			message:   withHeaders(publish("x", "k"), field("CC", "cc")),
			want:      everywhere,
		},
		{
			name:      "BCC of another type: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q1", "rabbit1", bind("x", "k"))},
			message:   withHeaders(publish("x", "k"), field("BCC", nil)),
			want:      everywhere,
		},
		{
			name:      "headers not known: no CC",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q1", "rabbit1", bind("x", "k")), boundQueue("q2", "rabbit2", bind("x", "cc"))},
			message:   RoutedMessage{VHost: "/", Exchange: "x", RoutingKey: "k", Headers: frames.Table{field("CC", []any{"cc"})}},
			want:      to("rabbit1"),
		},
		{
			name:      "cc in lower case is just a header",
			exchanges: []ExchangeMeta{exchange("x", "direct")},
			queues:    []QueueMeta{boundQueue("q1", "rabbit1", bind("x", "k")), boundQueue("q2", "rabbit2", bind("x", "cc"))},
			message:   withHeaders(publish("x", "k"), field("cc", []any{"cc"})),
			want:      to("rabbit1"),
		},

		// headers exchanges
		{
			name:      "headers exchange without the headers: ask for them",
			exchanges: []ExchangeMeta{exchange("h", "headers")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bindArguments("h", headersAll))},
			message:   RoutedMessage{VHost: "/", Exchange: "h"},
			want:      Route{NeedHeaders: true},
		},
		{
			name:      "headers exchange on the way without the headers: ask for them",
			exchanges: []ExchangeMeta{exchange("x", "fanout", toExchange("h", "")), exchange("h", "headers")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", ""))},
			message:   RoutedMessage{VHost: "/", Exchange: "x"},
			want:      Route{NeedHeaders: true},
		},
		{
			name:      "headers exchange: the matching bindings",
			exchanges: []ExchangeMeta{exchange("h", "headers")},
			queues: []QueueMeta{
				boundQueue("invoices", "rabbit1", bindArguments("h", headersAll)),
				boundQueue("any", "rabbit2", bindArguments("h", arguments(t, field("x-match", "any"), field("kind", "order"), field("urgent", nil)))),
				boundQueue("orders", "rabbit3", bindArguments("h", arguments(t, field("kind", "order")))),
			},
			message: withHeaders(publish("h", ""), field("kind", "invoice"), field("urgent", false)),
			want:    to("rabbit1", "rabbit2"),
		},
		{
			name:      "headers exchange: headers known but none, only the empty all binding",
			exchanges: []ExchangeMeta{exchange("h", "headers")},
			queues: []QueueMeta{
				boundQueue("invoices", "rabbit1", bindArguments("h", headersAll)),
				boundQueue("everything", "rabbit2", bindArguments("h", nil)),
			},
			message: publish("h", ""),
			want:    to("rabbit2"),
		},
		{
			name: "exchange-to-exchange binding read by a headers source",
			exchanges: []ExchangeMeta{
				exchange("h", "headers", toExchange("y", "", headersAll), toExchange("z", "", arguments(t, field("kind", "order")))),
				exchange("y", "fanout"), exchange("z", "fanout"),
			},
			queues:  []QueueMeta{boundQueue("qy", "rabbit1", bind("y", "")), boundQueue("qz", "rabbit2", bind("z", ""))},
			message: withHeaders(publish("h", ""), field("kind", "invoice")),
			want:    to("rabbit1"),
		},

		// alternate exchanges
		{
			name:      "alternate exchange followed when nothing matched",
			exchanges: []ExchangeMeta{exchange("x", "direct", alternate("ae")), exchange("ae", "fanout")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k")), boundQueue("unrouted", "rabbit3", bind("ae", ""))},
			message:   publish("x", "miss"),
			want:      to("rabbit3"),
		},
		{
			name:      "alternate exchange not followed when a queue matched",
			exchanges: []ExchangeMeta{exchange("x", "direct", alternate("ae")), exchange("ae", "fanout")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k")), boundQueue("unrouted", "rabbit3", bind("ae", ""))},
			message:   publish("x", "k"),
			want:      to("rabbit1"),
		},
		{
			name: "alternate exchange not followed when only an exchange binding matched",
			exchanges: []ExchangeMeta{
				exchange("x", "direct", alternate("ae"), toExchange("y", "k")),
				exchange("y", "fanout"), exchange("ae", "fanout"),
			},
			queues:  []QueueMeta{boundQueue("qy", "rabbit2", bind("y", "")), boundQueue("unrouted", "rabbit3", bind("ae", ""))},
			message: publish("x", "k"),
			want:    to("rabbit2"),
		},
		{
			name: "alternate exchange of an exchange on the way",
			exchanges: []ExchangeMeta{
				exchange("x", "fanout", toExchange("y", "")),
				exchange("y", "direct", alternate("ae")), exchange("ae", "fanout"),
			},
			queues:  []QueueMeta{boundQueue("qx", "rabbit1", bind("x", "")), boundQueue("unrouted", "rabbit3", bind("ae", ""))},
			message: publish("x", "k"),
			want:    to("rabbit1", "rabbit3"),
		},
		{
			name: "alternate exchange of an alternate exchange",
			exchanges: []ExchangeMeta{
				exchange("x", "direct", alternate("ae1")),
				exchange("ae1", "direct", alternate("ae2")), exchange("ae2", "fanout"),
			},
			queues:  []QueueMeta{boundQueue("q1", "rabbit1", bind("ae1", "k")), boundQueue("q2", "rabbit2", bind("ae2", ""))},
			message: publish("x", "miss"),
			want:    to("rabbit2"),
		},
		{
			name:      "an alternate exchange that is its own: no loop",
			exchanges: []ExchangeMeta{exchange("x", "direct", alternate("x"))},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k"))},
			message:   publish("x", "miss"),
			want:      everywhere,
		},
		{
			name:      "alternate exchange without a record: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "direct", alternate("ae"))},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k"))},
			message:   publish("x", "miss"),
			want:      everywhere,
		},
		{
			name:      "alternate exchange without a record is not needed when a queue matched",
			exchanges: []ExchangeMeta{exchange("x", "direct", alternate("ae"))},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k"))},
			message:   publish("x", "k"),
			want:      to("rabbit1"),
		},
		{
			name:      "alternate exchange's non-fresh backends are added when it is followed",
			exchanges: []ExchangeMeta{exchange("x", "direct", alternate("ae")), exchange("ae", "fanout", fresh("rabbit1", "rabbit3"))},
			queues:    []QueueMeta{boundQueue("unrouted", "rabbit3", bind("ae", ""))},
			message:   publish("x", "miss"),
			want:      to("rabbit2", "rabbit3"),
		},
		{
			name:      "alternate exchange's non-fresh backends are not added when it is not followed",
			exchanges: []ExchangeMeta{exchange("x", "direct", alternate("ae")), exchange("ae", "fanout", fresh("rabbit1", "rabbit3"))},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k")), boundQueue("unrouted", "rabbit3", bind("ae", ""))},
			message:   publish("x", "k"),
			want:      to("rabbit1"),
		},
		{
			name:      "alternate exchange in another vhost is not the one",
			exchanges: []ExchangeMeta{exchange("x", "direct", alternate("ae")), exchangeIn("other", "ae", "fanout")},
			queues:    []QueueMeta{boundQueueIn("other", "unrouted", "rabbit3", bind("ae", ""))},
			message:   publish("x", "miss"),
			want:      everywhere,
		},

		// exchange-to-exchange bindings
		{
			name: "a chain of exchange bindings, each matched by its source's type",
			exchanges: []ExchangeMeta{
				exchange("x", "topic", toExchange("y", "orders.#"), toExchange("miss", "invoices.#")),
				exchange("y", "direct", toExchange("z", "orders.eu")),
				exchange("z", "fanout"), exchange("miss", "fanout"),
			},
			queues:  []QueueMeta{boundQueue("qz", "rabbit3,rabbit2", bind("z", "")), boundQueue("qmiss", "rabbit1", bind("miss", ""))},
			message: publish("x", "orders.eu"),
			want:    to("rabbit2", "rabbit3"),
		},
		{
			name: "a cycle of exchange bindings ends",
			exchanges: []ExchangeMeta{
				exchange("x", "fanout", toExchange("y", "")),
				exchange("y", "fanout", toExchange("z", "")),
				exchange("z", "fanout", toExchange("x", ""), toExchange("y", "")),
			},
			queues:  []QueueMeta{boundQueue("qx", "rabbit1", bind("x", "")), boundQueue("qz", "rabbit3", bind("z", ""))},
			message: publish("y", "k"),
			want:    to("rabbit1", "rabbit3"),
		},
		{
			name:      "exchange binding to an exchange without a record: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "fanout", toExchange("gone", ""))},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", ""))},
			message:   publish("x", "k"),
			want:      everywhere,
		},
		{
			name:      "unmatched exchange binding to an exchange without a record does not matter",
			exchanges: []ExchangeMeta{exchange("x", "direct", toExchange("gone", "other"))},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", "k"))},
			message:   publish("x", "k"),
			want:      to("rabbit1"),
		},
		{
			name:      "the default exchange on the way: everywhere",
			exchanges: []ExchangeMeta{exchange("x", "fanout", toExchange("", "")), exchange("", "direct")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bind("x", ""))},
			message:   publish("x", "q"),
			want:      everywhere,
		},
		{
			name:      "exchange bindings stay in the vhost",
			exchanges: []ExchangeMeta{exchange("x", "fanout", toExchange("y", "")), exchangeIn("other", "y", "fanout")},
			queues:    []QueueMeta{boundQueueIn("other", "q", "rabbit1", bind("y", ""))},
			message:   publish("x", "k"),
			want:      everywhere,
		},

		// bindings the proxy cannot evaluate
		{
			name:      "an undecodable headers binding may match: its queue, and no queue is sure",
			exchanges: []ExchangeMeta{exchange("h", "headers", alternate("ae")), exchange("ae", "fanout")},
			queues:    []QueueMeta{boundQueue("q", "rabbit1", bindArguments("h", undecodable)), boundQueue("unrouted", "rabbit3", bind("ae", ""))},
			message:   publish("h", ""),
			want:      everywhere,
		},
		{
			name: "a binding that may match keeps the alternate exchange in",
			exchanges: []ExchangeMeta{
				exchange("x", "fanout", toExchange("h", "")),
				exchange("h", "headers", alternate("ae")), exchange("ae", "fanout"),
			},
			queues: []QueueMeta{
				boundQueue("qx", "rabbit2", bind("x", "")),
				boundQueue("q", "rabbit1", bindArguments("h", arguments(t, field("n", 1.5)))),
				boundQueue("unrouted", "rabbit3", bind("ae", "")),
			},
			message: withHeaders(publish("x", ""), field("n", 1.5)),
			want:    to("rabbit1", "rabbit2", "rabbit3"),
		},
		{
			name: "a binding that surely matches keeps the alternate exchange out",
			exchanges: []ExchangeMeta{
				exchange("x", "fanout", toExchange("h", "")),
				exchange("h", "headers", alternate("ae")), exchange("ae", "fanout"),
			},
			queues: []QueueMeta{
				boundQueue("qx", "rabbit2", bind("x", "")),
				boundQueue("q", "rabbit1", bindArguments("h", arguments(t, field("n", int32(15))))),
				boundQueue("unrouted", "rabbit3", bind("ae", "")),
			},
			message: withHeaders(publish("x", ""), field("n", int64(15))),
			want:    to("rabbit1", "rabbit2"),
		},
		{
			name: "an exchange reached first uncertainly, then surely, routes surely",
			exchanges: []ExchangeMeta{
				// x's bindings are taken last first: h, where y only may
				// match, is walked before g.
				exchange("x", "fanout", toExchange("g", ""), toExchange("h", "")),
				exchange("g", "fanout", toExchange("y", "")),
				exchange("h", "headers", toExchange("y", "", undecodable)),
				exchange("y", "fanout"),
			},
			queues:  []QueueMeta{boundQueue("q", "rabbit1", bind("y", ""))},
			message: withHeaders(publish("x", "")),
			want:    to("rabbit1"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			backends := tt.backends
			if backends == nil {
				backends = seedBackends
			}
			table := NewRoutingTable(backends, tt.exchanges, tt.queues)
			if got := table.Route(tt.message); !sameRoute(got, tt.want) {
				t.Errorf("Route(%+v) = %+v, want %+v", tt.message, got, tt.want)
			}
		})
	}
}

func sameRoute(a, b Route) bool {
	return a.All == b.All && a.NeedHeaders == b.NeedHeaders && slices.Equal(a.Backends, b.Backends)
}

func TestTopicMatch(t *testing.T) {
	tests := []struct {
		pattern, key string
		want         bool
	}{
		{"", "", true},
		{"", "a", false},
		{"", ".", false},
		{"#", "", true},
		{"#", "a", true},
		{"#", "a.b.c", true},
		{"#", ".", true},
		{"#.#", "", true},
		{"#.#", "a.b", true},
		{"*", "", false},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*", ".", false},
		{"*.*", ".", true}, // two empty words
		{"a", "a", true},
		{"a", "ab", false},
		{"a", "a.", false},
		{"a.", "a.", true},
		{"a.*", "a.", true}, // '*' matches the empty word
		{"a.#", "a", true},
		{"a.#", "a.b.c", true},
		{"a.#", "b.a", false},
		{"a.#", "ab", false},
		{"#.a", "a", true},
		{"#.a", "b.c.a", true},
		{"#.a", "a.b", false},
		{"a.*.b", "a.x.b", true},
		{"a.*.b", "a..b", true},
		{"a.*.b", "a.b", false},
		{"a.*.b", "a.x.y.b", false},
		{"a..b", "a..b", true},
		{"a..b", "a.b", false},
		{"a.#.b", "a.b", true},
		{"a.#.b", "a.x.y.b", true},
		{"a.#.b", "a.x.y.c", false},
		{"#.b.#", "b", true},
		{"#.b.#", "a.b.c", true},
		{"#.b.#", "a.c", false},
		{"*.#", "", false},
		{"*.#", "a", true},
		{"#.*", "a.b", true},
		{"a.*", "a.*", true}, // a key's '*' is a word like any other
		{"a.b", "a.*", false},
		{"a.#", "a.#", true},
		{"a.b", "a.#", false},
	}
	for _, tt := range tests {
		if got := topicMatches(tt.pattern, tt.key); got != tt.want {
			t.Errorf("topic pattern %q on key %q = %v, want %v", tt.pattern, tt.key, got, tt.want)
		}
	}
}

// topicMatches is what a topic binding with pattern answers for key.
func topicMatches(pattern, key string) bool {
	b := topicBinding{words: topicPattern(pattern)}
	return b.matches(key)
}

// TestTopicMatchAgreesWithWords compares topic bindings with a plain reading
// of RabbitMQ's trie walk over every pattern and key of a few short words.
func TestTopicMatchAgreesWithWords(t *testing.T) {
	patterns := joinAll([]string{"a", "b", "", "*", "#"}, 4)
	keys := joinAll([]string{"a", "b", "", "*"}, 4)
	for _, p := range patterns {
		for _, k := range keys {
			want := wordsMatch(splitTopic(p), splitTopic(k))
			if got := topicMatches(p, k); got != want {
				t.Fatalf("topic pattern %q on key %q = %v, want %v", p, k, got, want)
			}
		}
	}
}

// joinAll returns every key of up to n of the words, joined with '.'.
func joinAll(words []string, n int) []string {
	out := []string{""}
	level := [][]string{nil}
	for range n {
		var next [][]string
		for _, prefix := range level {
			for _, w := range words {
				key := append(slices.Clone(prefix), w)
				next = append(next, key)
				out = append(out, strings.Join(key, "."))
			}
		}
		level = next
	}
	return out
}

func splitTopic(key string) []string {
	if key == "" {
		return nil
	}
	return strings.Split(key, ".")
}

func wordsMatch(pattern, words []string) bool {
	if len(pattern) == 0 {
		return len(words) == 0
	}
	switch {
	case pattern[0] == "#":
		for skip := 0; skip <= len(words); skip++ {
			if wordsMatch(pattern[1:], words[skip:]) {
				return true
			}
		}
		return false
	case len(words) == 0:
		return false
	case pattern[0] == "*" || pattern[0] == words[0]:
		return wordsMatch(pattern[1:], words[1:])
	}
	return false
}

func TestHeadersMatch(t *testing.T) {
	f := field
	tests := []struct {
		name      string
		arguments []byte // nil: no arguments
		binding   frames.Table
		headers   frames.Table
		want      matchResult
	}{
		{name: "all by default: every field", binding: frames.Table{f("a", "1"), f("b", "2")}, headers: frames.Table{f("b", "2"), f("c", "3"), f("a", "1")}, want: matched},
		{name: "all: a field missing", binding: frames.Table{f("a", "1"), f("b", "2")}, headers: frames.Table{f("a", "1")}, want: unmatched},
		{name: "all: a value differs", binding: frames.Table{f("x-match", "all"), f("a", "1"), f("b", "2")}, headers: frames.Table{f("a", "1"), f("b", "3")}, want: unmatched},
		{name: "all: no headers at all", binding: frames.Table{f("a", "1")}, want: unmatched},
		{name: "all without fields matches anything", binding: frames.Table{f("x-match", "all")}, want: matched},
		{name: "no arguments at all matches anything", want: matched},
		{name: "any: one field", binding: frames.Table{f("x-match", "any"), f("a", "1"), f("b", "2")}, headers: frames.Table{f("b", "2")}, want: matched},
		{name: "any: none", binding: frames.Table{f("x-match", "any"), f("a", "1"), f("b", "2")}, headers: frames.Table{f("a", "2")}, want: unmatched},
		{name: "any without fields matches nothing", binding: frames.Table{f("x-match", "any")}, headers: frames.Table{f("a", "1")}, want: unmatched},
		{name: "void: present with any value", binding: frames.Table{f("a", nil)}, headers: frames.Table{f("a", int8(0))}, want: matched},
		{name: "void: absent", binding: frames.Table{f("a", nil)}, headers: frames.Table{f("b", nil)}, want: unmatched},
		{name: "void header against a value", binding: frames.Table{f("a", "1")}, headers: frames.Table{f("a", nil)}, want: unmatched},
		{name: "x- keys are not matched", binding: frames.Table{f("x-match", "all"), f("x-priority", int32(3)), f("a", "1")}, headers: frames.Table{f("a", "1")}, want: matched},
		{name: "x- keys are not matched, any", binding: frames.Table{f("x-match", "any"), f("x-priority", int32(3))}, headers: frames.Table{f("x-priority", int32(3))}, want: unmatched},
		{name: "all-with-x matches x- keys", binding: frames.Table{f("x-match", "all-with-x"), f("x-tenant", "t1"), f("a", "1")}, headers: frames.Table{f("a", "1")}, want: unmatched},
		{name: "all-with-x: every field", binding: frames.Table{f("x-match", "all-with-x"), f("x-tenant", "t1"), f("a", "1")}, headers: frames.Table{f("a", "1"), f("x-tenant", "t1")}, want: matched},
		{name: "any-with-x: an x- field", binding: frames.Table{f("x-match", "any-with-x"), f("x-tenant", "t1"), f("a", "1")}, headers: frames.Table{f("x-tenant", "t1")}, want: matched},
		{name: "x-match is never matched", binding: frames.Table{f("x-match", "all-with-x")}, headers: frames.Table{f("x-match", "any")}, want: matched},
		{name: "integers of other types compare by value", binding: frames.Table{f("a", int32(5)), f("b", uint8(7)), f("c", frames.Timestamp(9))}, headers: frames.Table{f("a", int64(5)), f("b", int16(7)), f("c", uint32(9))}, want: matched},
		{name: "integers differ", binding: frames.Table{f("a", int32(5))}, headers: frames.Table{f("a", int32(6))}, want: unmatched},
		{name: "negative and unsigned", binding: frames.Table{f("a", int8(-1))}, headers: frames.Table{f("a", uint8(255))}, want: unmatched},
		{name: "timestamp beyond int64", binding: frames.Table{f("a", frames.Timestamp(math.MaxUint64))}, headers: frames.Table{f("a", int64(-1))}, want: unmatched},
		{name: "timestamp beyond int64, equal", binding: frames.Table{f("a", frames.Timestamp(math.MaxUint64))}, headers: frames.Table{f("a", frames.Timestamp(math.MaxUint64))}, want: matched},
		{name: "float may equal an integer", binding: frames.Table{f("a", 1.0)}, headers: frames.Table{f("a", int32(1))}, want: mayMatch},
		{name: "floats: not modelled", binding: frames.Table{f("a", float32(0.5))}, headers: frames.Table{f("a", 0.5)}, want: mayMatch},
		{name: "float against absent is still absent", binding: frames.Table{f("a", 0.5)}, want: unmatched},
		{name: "longstr equals byte array", binding: frames.Table{f("a", "v")}, headers: frames.Table{f("a", []byte("v"))}, want: matched},
		{name: "string is not a number", binding: frames.Table{f("a", "5")}, headers: frames.Table{f("a", int32(5))}, want: unmatched},
		{name: "bools", binding: frames.Table{f("a", true), f("b", false)}, headers: frames.Table{f("a", true), f("b", false)}, want: matched},
		{name: "bool is not a number", binding: frames.Table{f("a", true)}, headers: frames.Table{f("a", uint8(1))}, want: unmatched},
		{name: "decimals equal", binding: frames.Table{f("a", frames.Decimal{Scale: 2, Value: 150})}, headers: frames.Table{f("a", frames.Decimal{Scale: 2, Value: 150})}, want: matched},
		{name: "decimals of another scale", binding: frames.Table{f("a", frames.Decimal{Scale: 1, Value: 15})}, headers: frames.Table{f("a", frames.Decimal{Scale: 2, Value: 150})}, want: unmatched},
		{name: "tables: not modelled", binding: frames.Table{f("a", frames.Table{f("b", "1")})}, headers: frames.Table{f("a", frames.Table{f("b", "1")})}, want: mayMatch},
		{name: "arrays: not modelled", binding: frames.Table{f("a", []any{"1"})}, headers: frames.Table{f("a", []any{"2"})}, want: mayMatch},
		{name: "all: a sure miss beats a may", binding: frames.Table{f("a", 1.0), f("b", "1")}, headers: frames.Table{f("a", 1.0), f("b", "2")}, want: unmatched},
		{name: "any: a sure match beats a may", binding: frames.Table{f("x-match", "any"), f("a", 1.0), f("b", "1")}, headers: frames.Table{f("a", 1.0), f("b", "1")}, want: matched},
		{name: "repeated header", binding: frames.Table{f("a", "1")}, headers: frames.Table{f("a", "2"), f("a", "1")}, want: mayMatch},
		{name: "repeated header not bound does not matter", binding: frames.Table{f("a", "1")}, headers: frames.Table{f("a", "1"), f("b", "1"), f("b", "2")}, want: matched},
		{name: "repeated binding key", binding: frames.Table{f("a", "1"), f("a", "2")}, headers: frames.Table{f("a", "1")}, want: mayMatch},
		{name: "x-match of an unknown value", binding: frames.Table{f("x-match", "none"), f("a", "1")}, headers: frames.Table{f("a", "2")}, want: mayMatch},
		{name: "x-match not a longstr", binding: frames.Table{f("x-match", []byte("any")), f("a", "1")}, want: mayMatch},
		{name: "undecodable arguments", arguments: undecodable, want: mayMatch},
		{name: "arguments with bytes after the table", arguments: []byte{0, 0, 0, 0, 0}, want: mayMatch},
		{name: "an empty table", arguments: []byte{0, 0, 0, 0}, headers: frames.Table{f("a", "1")}, want: matched},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			encoded := tt.arguments
			if tt.binding != nil {
				encoded = arguments(t, tt.binding...)
			}
			b := newHeadersBinding(encoded, destination{exchange: toQueue})
			if got := b.match(tt.headers); got != tt.want {
				t.Errorf("binding %v on headers %v: %s, want %s", tt.binding, tt.headers, got, tt.want)
			}
		})
	}
}

func TestRouteMatchResultString(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{unmatched.String(), "unmatched"},
		{mayMatch.String(), "may match"},
		{matched.String(), "matched"},
		{matchResult(7).String(), "unknown(7)"},
	} {
		if tt.got != tt.want {
			t.Errorf("String() = %q, want %q", tt.got, tt.want)
		}
	}
}

func TestRouteConcurrently(t *testing.T) {
	table, messages := topicBenchTable(3)
	want := make([]Route, len(messages))
	for i, m := range messages {
		want[i] = table.Route(m)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for round := range 200 {
				i := round % len(messages)
				if got := table.Route(messages[i]); !sameRoute(got, want[i]) {
					t.Errorf("Route(%+v) = %+v concurrently, %+v alone", messages[i], got, want[i])
					return
				}
			}
		})
	}
	wg.Wait()
}

// topicBenchTable is a topic exchange with 100 bindings, each to its own
// queue mirrored on two of five backends, and messages routed by it.
func topicBenchTable(messages int) (*RoutingTable, []RoutedMessage) {
	backends := []string{"rabbit1", "rabbit2", "rabbit3", "rabbit4", "rabbit5"}
	var queues []QueueMeta
	for i := range 100 {
		var pattern string
		switch i % 4 {
		case 0:
			pattern = fmt.Sprintf("orders.region%d.*", i)
		case 1:
			pattern = fmt.Sprintf("orders.*.item%d", i)
		case 2:
			pattern = fmt.Sprintf("#.customer%d", i)
		default:
			pattern = fmt.Sprintf("audit.%d.#", i)
		}
		copies := backends[i%5] + "," + backends[(i+1)%5]
		queues = append(queues, boundQueue(fmt.Sprintf("q%d", i), copies, bind("events", pattern)))
	}
	table := NewRoutingTable(backends, []ExchangeMeta{exchange("events", "topic", fresh(backends...))}, queues)
	var out []RoutedMessage
	for i := range messages {
		out = append(out, RoutedMessage{VHost: "/", Exchange: "events", RoutingKey: fmt.Sprintf("orders.region%d.created", 4*i)})
	}
	return table, out
}

func BenchmarkRouteTopic(b *testing.B) {
	table, messages := topicBenchTable(1)
	if r := table.Route(messages[0]); len(r.Backends) != 2 {
		b.Fatalf("route = %+v, want two backends", r)
	}
	b.ReportAllocs()
	for b.Loop() {
		table.Route(messages[0])
	}
}

func BenchmarkRouteDirect(b *testing.B) {
	backends := []string{"rabbit1", "rabbit2", "rabbit3", "rabbit4", "rabbit5"}
	var queues []QueueMeta
	for i := range 100 {
		name := fmt.Sprintf("q%d", i)
		queues = append(queues, boundQueue(name, backends[i%5]+","+backends[(i+2)%5], bind("jobs", name)))
	}
	table := NewRoutingTable(backends, []ExchangeMeta{exchange("jobs", "direct", fresh(backends...))}, queues)
	m := RoutedMessage{VHost: "/", Exchange: "jobs", RoutingKey: "q42"}
	if r := table.Route(m); len(r.Backends) != 2 {
		b.Fatalf("route = %+v, want two backends", r)
	}
	b.ReportAllocs()
	for b.Loop() {
		table.Route(m)
	}
}
