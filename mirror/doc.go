// Package mirror is amqp-mirror's replication engine: it gives queues on
// plain, unclustered AMQP 0-9-1 brokers the behaviour of RabbitMQ 3.x's
// classic mirrored queues. This comment is the architecture; the code that
// carries it out arrives issue by issue, and the comment says which parts
// exist (see "Status" at the end).
//
// # Roles
//
// A mirrored queue has one master and zero or more slaves, each a plain
// queue of the same name on a different backend broker. The proxy, not the
// brokers, keeps them in step:
//
//	       clients (any AMQP 0-9-1 client library)
//	              │ publish / consume / ack
//	       ┌──────▼──────┐
//	       │    proxy    │  client-facing AMQP server (package proxy);
//	       │   mirror    │  asks mirror where each queue lives and
//	       └──┬───┬───┬──┘  what every operation must reach
//	          │   │   │
//	┌─────────▼┐ ┌▼───────┐ ┌▼────────┐
//	│ rabbit1  │ │rabbit3 │ │ rabbit2 │  independent brokers,
//	│ q master │ │q slave1│ │ q slave2│  no Erlang clustering
//	└──────────┘ └────────┘ └─────────┘
//	             (slave1 joined first: it is promoted first)
//
// The metadata of a queue is: its master backend, its slaves in join order,
// which slaves are synchronised, and an epoch raised at every promotion.
// Decisions about it — placement, promotion, confirm quorum, which slave
// copies to trim, what a sync must copy — are pure functions over that
// metadata, tested with tables; the sockets that carry them out (the
// proxy's backend links, amqp091-go control connections, serf membership)
// sit behind small interfaces, so the engine is testable without brokers.
//
// # Publish path
//
// A publish goes to every backend that can route it to a copy of a target
// queue: for the default exchange, the named queue's master and slaves; for
// other exchanges, the backends holding queues bound to it (all backends when
// unknown). Each broker routes locally, so slaves receive their copy through
// their own broker's routing. Every backend channel is in confirm mode,
// whether or not the client asked: a broker's confirm is how the proxy knows
// what it accepted. The client's confirm (ack) is sent once the master and
// every synchronised slave confirmed; a nack as soon as the master nacks.
// The proxy's publisherConfirms (package proxy) already keeps one sequence
// per backend and answers the client's sequence from all of them.
//
// Each published message carries an identity the proxy can read on every
// copy (a header added at publish and removed on delivery, so a consumer
// receives exactly the properties that were published).
//
// # Deliver and ack path
//
// Consumers consume from the master only: the master fixes the order
// (seed rule 7). When a client acks, or rejects without requeue, the proxy
// removes the same message from every slave: a proxy-owned consumer on each
// slave copy holds slave deliveries unacknowledged and acks them once the
// master's copy is gone. Client delivery tags are the proxy's own and map to
// (backend, backend tag, epoch), so a tag handed out before a failover can
// never settle a message delivered after it.
//
// # Synchronisation
//
// A new slave starts empty and unsynchronised. With ha-sync-mode automatic,
// the proxy copies the master's messages to it at once, in batches of
// ha-sync-batch-size; with manual (RabbitMQ's default), only on `ctl
// sync_queue`, and a slave that never synced becomes synchronised when the
// messages older than its join have been consumed. Unlike RabbitMQ, a sync
// must not block the queue: the goal is to keep serving while it copies.
//
// # Failover
//
// A backend is down at once when its connections are reset or refused, and
// after failover_grace when it merely stops answering. For every queue
// mastered there, the oldest live synchronised slave becomes master and the
// epoch rises; with no synchronised slave, ha-promote-on-failure decides
// (default always: promote the oldest slave, and messages only the old
// master held are lost, as the seed says). The new master requeues every
// message clients had not acked, even if the ack was in flight; consumers
// move to it transparently with their consumer tags, except those declared
// with x-cancel-on-ha-failover, which receive basic.cancel. Publishes in
// flight during promotion are confirmed once the surviving copies hold them.
// A returning old master is never read as master again: it rejoins as the
// youngest slave, purged and then synchronised per ha-sync-mode.
//
// # Cluster of proxies
//
// In sidecar mode one proxy runs beside each broker; serf gives membership
// and failure detection. Serf gives no total order, so the master and epoch
// of a queue change only by a rule that cannot split (a promotion decided
// by a proxy that sees a majority of nodes, with the epoch fencing stale
// masters); what this guarantees, and what it does not, will be written here
// with the code.
//
// # Guarantees
//
// A message the proxy confirmed to a client is held by the master and every
// synchronised slave, so losing any one backend loses no confirmed message
// while a synchronised slave exists. Not guaranteed: messages on an
// unsynchronised queue whose master dies (as in RabbitMQ), exactly-once
// delivery (a requeued message is redelivered with the redelivered flag),
// and consistency across a network partition that splits the proxies into
// minorities, which refuse to promote rather than diverge.
//
// # Status
//
// Built: the proxy data path (package proxy) with the proxy's own delivery
// tags and confirm sequences per backend, the configuration and policy
// matching (package config). Not yet built: everything else in this comment.
package mirror
