package proxy

import (
	"context"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Mirror is the replication engine as the proxy sees it; package
// mirror/engine implements it. With a nil Mirror the proxy serves one
// backend and every frame passes as it came.
//
// The proxy carries out the data path on the client's own backend links
// (declares, binds, publishes fanned out to every copy, consumes and gets
// from the master); the engine decides and records where queues live, and
// does the work that needs no client: slave copies added or dropped by a
// policy, trimming slaves, synchronisation.
type Mirror interface {
	// Lookup returns what the metadata log says about a queue, without I/O:
	// it is on the publish path. The returned Slaves slice is shared and
	// must not be modified.
	Lookup(id mirror.QueueID) (mirror.QueueMeta, bool)
	// Resolve is Lookup for a queue the log may not know yet: a queue that
	// already exists on a backend (it was there before the proxy) is found
	// there and adopted into the log. ok is false when no backend has it.
	Resolve(ctx context.Context, id mirror.QueueID) (meta mirror.QueueMeta, ok bool, err error)
	// Place decides where a new queue lives: q carries the ID and the
	// declaration (Durable, AutoDelete, Arguments); the result adds Master
	// and Slaves (all synchronised: a new queue is empty). Nothing is
	// recorded yet. An error is the client's: a bad x-queue-master-locator
	// (406) or no live backend.
	Place(ctx context.Context, q mirror.QueueMeta, clientNode string) (mirror.QueueMeta, error)
	// Declared records a queue whose copies the proxy declared on every
	// backend of q, and starts keeping its slaves in step. When another
	// proxy recorded the queue meanwhile, that record is returned.
	Declared(ctx context.Context, q mirror.QueueMeta) (mirror.QueueMeta, error)
	// Deleted forgets a queue the client deleted (every copy is gone).
	Deleted(ctx context.Context, id mirror.QueueID)
	// Purged empties the slave copies of a queue whose master the client
	// purged.
	Purged(ctx context.Context, id mirror.QueueID)
	// Bound records a binding added (bound true) or removed on every copy,
	// so that a slave added later gets it too and publishes to the exchange
	// are routed to the queue. An error: the binding is not recorded.
	Bound(ctx context.Context, id mirror.QueueID, b mirror.Binding, bound bool) error
	// LookupExchange returns what the metadata log says about an exchange
	// declared through a proxy.
	LookupExchange(id mirror.ExchangeID) (mirror.ExchangeMeta, bool)
	// ExchangeAbsent returns the backends on which an exchange does not
	// exist yet; asked before a client's first declare of it.
	ExchangeAbsent(ctx context.Context, id mirror.ExchangeID) []string
	// ExchangeDeclared records an exchange declared on every backend (a
	// record that exists already is kept).
	ExchangeDeclared(ctx context.Context, x mirror.ExchangeMeta)
	// ExchangeDeleted forgets an exchange deleted on every backend.
	ExchangeDeleted(ctx context.Context, id mirror.ExchangeID)
	// ExchangeBound records an exchange-to-exchange binding added (bound
	// true) or removed on every backend.
	ExchangeBound(ctx context.Context, source mirror.ExchangeID, b mirror.ExchangeBinding, bound bool) error
	// BoundUnrecorded says that a queue the log does not record, on
	// backend, was bound to the exchange: publishes to it must reach that
	// backend whatever the log says.
	BoundUnrecorded(ctx context.Context, exchange mirror.ExchangeID, backend string) error
	// Routing returns the routing table of the metadata as it is now, the
	// same value until it changes; nil routes every exchange publish to
	// every backend. It is on the publish path and must not block.
	Routing() *mirror.RoutingTable
	// Settle says what became of the master's copies of these messages:
	// acked (the slaves drop theirs); rejected without requeue (basic.reject,
	// basic.nack: the master's broker dead-letters its copies, and the
	// slaves reject theirs the same way, so that each broker dead-letters
	// its own copy into its own copies of the target queues); delivered to
	// a client that has not settled them, or requeued (a slave's copy of an
	// expiring message is given back to its broker at its TTL only while
	// the master's is in its queue). It is on the ack and delivery paths
	// and must not block on the network; ids is valid only during the call.
	Settle(id mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome)
	// Missed says that the slave copy on backend of queue (of every queue
	// with a synchronised slave there, when queue is nil: a publish to an
	// exchange) may lack a publish: the backend nacked it, the client's
	// link broke before the backend confirmed it, or the backend was
	// counted down and the publish not sent there. Such a slave is no
	// longer synchronised. It must not block.
	Missed(backend string, queue *mirror.QueueID)
	// Holds reports whether the metadata counts backend as the master or a
	// synchronised slave of queue (of any queue with slaves, when queue is
	// nil): a copy there that was lost before it confirmed a publish keeps
	// the publish waiting until the log records the loss. It is called on
	// the publish path while a backend cannot be reached, and must not block.
	Holds(backend string, queue *mirror.QueueID) bool
	// BackendDown reports whether the engine counts a backend down (its
	// connections reset, or no answer within failover_grace). The proxy
	// drops its links to such a backend even when their sockets look
	// alive: a frozen broker's sockets stay open, and whatever it says after
	// its queues were promoted away must not reach a client.
	BackendDown(backend string) bool
	// Current reports whether the metadata Lookup serves from is known
	// current: false from a moment this proxy stood still (SIGSTOP, a
	// paused VM, a starved host) until its metadata log has caught up with
	// the other proxies', which may have moved masters meanwhile. It is on
	// the delivery path and must not block.
	Current() bool
	// AwaitCurrent returns once Current holds, or with ctx's error.
	AwaitCurrent(ctx context.Context) error
	// Clustered reports whether other proxies share the metadata log (a
	// sidecar cluster): each delivers its own clients' messages, so what
	// one delivered another may deliver again after a promotion.
	Clustered() bool
	// DeliveredByPeers asks every other live proxy which messages of queue
	// id it delivered while the queue's epoch was below epoch (their
	// Server.DeliveredBefore). With an error, which names the proxies that
	// did not answer before ctx ended, it returns what the others said.
	DeliveredByPeers(ctx context.Context, id mirror.QueueID, epoch uint64) ([]mirror.MessageID, error)
	// ReplyBackend returns the backend whose broker runs node, the Erlang
	// node of a direct reply-to name (mirror.ReplyToNode): the only broker
	// that can deliver a reply to it. It may ask backends it has not asked
	// before (one round trip each); ok is false when no live backend runs
	// node.
	ReplyBackend(ctx context.Context, node string) (backend string, ok bool)
}
