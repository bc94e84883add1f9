package mirror

import (
	"fmt"
	"slices"
)

// ExchangeID names an exchange: exchanges are per virtual host.
type ExchangeID struct {
	VHost string `json:"vhost"`
	Name  string `json:"name"`
}

func (x ExchangeID) String() string {
	return fmt.Sprintf("exchange '%s' in vhost '%s'", x.Name, x.VHost)
}

// ExchangeMeta is what the metadata log knows about an exchange declared
// through a proxy, so that a publish to it reaches only the backends that
// hold a queue it routes to: a backend it does not reach cannot hand the
// message to the exchange's alternate exchange when its own copies of the
// bound queues are missing (copies of the alternate exchange's queues
// would differ), nor pay for a copy nobody wants.
type ExchangeMeta struct {
	ID ExchangeID `json:"id"`
	// Type is direct, fanout, topic or headers; any other (a plugin's
	// exchange type) routes in ways the proxy cannot evaluate, and a
	// publish to it goes to every backend. Empty when the exchange is
	// known only as the source of an exchange binding.
	Type string `json:"type,omitempty"`
	// AlternateExchange is the alternate-exchange argument of the
	// declaration (an alternate exchange set by a broker's own policy is
	// not known here).
	AlternateExchange string `json:"alternate_exchange,omitempty"`
	// Fresh lists the backends on which the exchange did not exist when a
	// proxy first declared it, and on which no queue the log does not
	// record (exclusive, server-named) was bound to it since: there, every
	// binding with the exchange as source was made through a proxy and is
	// in the log. Any other backend may hold bindings the log does not
	// know (made before the proxy, or to a queue not recorded), and gets
	// every publish to the exchange.
	Fresh []string `json:"fresh,omitempty"`
	// Bindings are the exchange-to-exchange bindings with this exchange as
	// source. Queue bindings are in the queues' records.
	Bindings []ExchangeBinding `json:"bindings,omitempty"`

	// Version is the metadata log index of the write that produced this
	// record; conditional writes name the version they read.
	Version uint64 `json:"version"`
}

// ExchangeBinding is one exchange-to-exchange binding, as exchange.bind
// declared it.
type ExchangeBinding struct {
	Destination string `json:"destination"`
	RoutingKey  string `json:"routing_key"`
	// Arguments is the field table as it came on the wire, or nil.
	Arguments []byte `json:"arguments,omitempty"`
}

// Clone returns a deep copy.
func (x ExchangeMeta) Clone() ExchangeMeta {
	x.Fresh = slices.Clone(x.Fresh)
	x.Bindings = slices.Clone(x.Bindings)
	return x
}

// IsFresh reports whether every binding of the exchange on backend is in
// the log.
func (x *ExchangeMeta) IsFresh(backend string) bool { return slices.Contains(x.Fresh, backend) }
