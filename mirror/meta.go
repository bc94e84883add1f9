package mirror

import (
	"bytes"
	"fmt"
	"slices"
)

// QueueID names a queue: queues are per virtual host, so the same name in
// two vhosts is two queues.
type QueueID struct {
	VHost string `json:"vhost"`
	Name  string `json:"name"`
}

func (q QueueID) String() string { return fmt.Sprintf("queue '%s' in vhost '%s'", q.Name, q.VHost) }

// Slave is one mirror of a queue on another backend.
type Slave struct {
	Backend string `json:"backend"`
	// Synchronised is set once the slave holds every message the master
	// holds; only synchronised slaves count towards a publish's confirm and
	// only they may be promoted without losing messages.
	Synchronised bool `json:"synchronised"`
}

// QueueMeta is what every proxy agrees on about one queue: where its copies
// live and which of them may be trusted. It changes only through the
// metadata store's replicated log.
type QueueMeta struct {
	ID QueueID `json:"id"`
	// Master is the backend whose copy clients consume from; it orders every
	// operation on the queue.
	Master string `json:"master"`
	// Slaves are the mirrors in join order, oldest first: the oldest live
	// synchronised slave is the one promoted when the master is lost.
	Slaves []Slave `json:"slaves,omitempty"`
	// Epoch rises at every promotion. Delivery tags and backend links carry
	// it, so that nothing read from a stale master is ever acted on.
	Epoch uint64 `json:"epoch"`

	// The declaration, needed to declare the queue again on a new slave.
	Durable    bool `json:"durable,omitempty"`
	AutoDelete bool `json:"auto_delete,omitempty"`
	// Arguments is the queue.declare arguments field table as it came on
	// the wire (frames encoding), or nil.
	Arguments []byte `json:"arguments,omitempty"`
	// Bindings are the queue's bindings made through the proxy, applied to
	// every new slave.
	Bindings []Binding `json:"bindings,omitempty"`
	// Adopted is set for a queue found on a backend rather than declared
	// through a proxy: AMQP cannot read a queue's flags, so Durable and
	// AutoDelete are guesses (it may be auto-delete, and then a consumer of
	// the proxy's own that goes away would delete it).
	Adopted bool `json:"adopted,omitempty"`
	// ForwardsDeadLetters is set for a queue that drops its head
	// (DropsHead) declared through a proxy: its copies dead-letter into
	// DeadLetterExchange (BrokerArguments), and the proxy sends on what
	// they dead-letter. A queue recorded without it keeps the client's
	// dead-letter arguments on every copy.
	ForwardsDeadLetters bool `json:"forwards_dead_letters,omitempty"`

	// Version is the metadata log index of the write that produced this
	// record; conditional writes name the version they read.
	Version uint64 `json:"version"`
}

// Backends returns the master followed by the slaves in join order.
func (m *QueueMeta) Backends() []string {
	out := make([]string, 0, 1+len(m.Slaves))
	out = append(out, m.Master)
	for _, s := range m.Slaves {
		out = append(out, s.Backend)
	}
	return out
}

// Holds reports whether backend has a copy of the queue (master or slave).
func (m *QueueMeta) Holds(backend string) bool {
	return m.Master == backend || m.SlaveIndex(backend) >= 0
}

// SlaveIndex returns the position of backend among the slaves, or -1.
func (m *QueueMeta) SlaveIndex(backend string) int {
	return slices.IndexFunc(m.Slaves, func(s Slave) bool { return s.Backend == backend })
}

// SynchronisedSlaves returns the backends of the synchronised slaves in
// join order.
func (m *QueueMeta) SynchronisedSlaves() []string {
	var out []string
	for _, s := range m.Slaves {
		if s.Synchronised {
			out = append(out, s.Backend)
		}
	}
	return out
}

// Clone returns a deep copy, so that a decision can change it without
// touching the store's record.
func (m QueueMeta) Clone() QueueMeta {
	m.Slaves = slices.Clone(m.Slaves)
	m.Arguments = slices.Clone(m.Arguments)
	m.Bindings = slices.Clone(m.Bindings)
	return m
}

// Binding is one binding of a queue, as queue.bind declared it, so that a
// slave added later is bound like the master.
type Binding struct {
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routing_key"`
	// Arguments is the field table as it came on the wire, or nil.
	Arguments []byte `json:"arguments,omitempty"`
}

// messageTTLKey is x-message-ttl as a field table key on the wire: a
// shortstr, its length byte first.
var messageTTLKey = []byte("\x0dx-message-ttl")

// SetsMessageTTL reports whether queue.declare arguments as they came on
// the wire (QueueMeta.Arguments) set x-message-ttl. It looks for the key
// without decoding the table: it is on the delivery path.
func SetsMessageTTL(arguments []byte) bool { return bytes.Contains(arguments, messageTTLKey) }
