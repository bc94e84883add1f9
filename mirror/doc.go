// Package mirror is amqp-mirror's replication engine: it gives queues on
// plain, unclustered AMQP 0-9-1 brokers the behaviour of RabbitMQ 3.x's
// classic mirrored queues. This comment is the architecture; "Where it
// lives", at the end, says which package carries out each part.
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
// every synchronised slave confirmed; a nack as soon as the master (or a
// synchronised slave, whose copy the ack would otherwise promise) nacks.
// The proxy's publisherConfirms (package proxy) already keeps one sequence
// per backend and answers the client's sequence from all of them.
//
// Each published message carries an identity the proxy can read on every
// copy: a header (x-amqp-mirror-id, 16 bytes: proxy, connection, channel,
// sequence) added at publish and removed on delivery; a message published
// without headers loses the whole table again, so a consumer receives
// exactly the properties that were published.
//
// Which queues an exchange publish reaches the proxy evaluates itself
// (RoutingTable): the log records the exchanges declared through a proxy
// (type, alternate-exchange argument, exchange-to-exchange bindings) beside
// the queues' bindings, and a publish goes to the backends holding a copy
// of a queue it routes to, matched as RabbitMQ matches (direct, fanout,
// topic, headers; CC and BCC; alternate exchanges where an exchange's own
// bindings match nothing). A backend that holds no such copy does not get
// the publish: it would route it nowhere and hand it to the exchange's
// alternate exchange, whose queues' copies would then differ. Where the
// log cannot know (an exchange that existed on a backend before a proxy
// declared it, a plugin's exchange type, a queue the log does not record
// bound to it, a route that reaches no queue) the publish goes to every
// backend, each routing to the copies it holds, as RabbitMQ's own routing
// would. A binding's bind-ok reaches the client once every proxy of a
// sidecar cluster applied it. The confirm quorum of an exchange publish
// is every live backend it was sent to; a backend lost while a publish is
// pending stops counting towards it. A mandatory publish is returned to
// the client only when every backend it was sent to returned it (each
// return precedes that backend's confirm).
//
// Transactions and confirms exclude each other on a channel, so a backend
// channel is put in confirm mode only once the client's channel publishes
// outside a transaction; tx.select before that keeps it transactional, and
// tx.commit commits on every backend the transaction touched. tx.select
// after it is kept by the proxy: the transaction's publishes and acks wait
// in the proxy until tx.commit sends them, and commit-ok follows the
// confirms of every copy counted.
//
// # Deliver and ack path
//
// Consumers consume from the master only: the master fixes the order, as
// in RabbitMQ's mirroring. When a client acks, or rejects without requeue, the proxy
// removes the same message from every slave. It does so with a trimmer per
// slave copy: a consumer of the proxy's own (the backend URL's account, not
// a client's) that holds the slave's deliveries unacknowledged, keyed by
// message identity, and acks a slave delivery once the master's copy is
// gone, in batches (multiple acks where the slave's order allows, sent
// at most 10ms after the first settlement they carry, never a round trip
// per message). Identities settled
// at the master before the slave's copy reached the trimmer wait in a set
// bounded by the queue's backlog. A trimmer recovers (basic.recover with
// requeue) well inside the broker's consumer_timeout, so holding a slow
// queue's messages never trips it; a channel the broker closes anyway is
// reopened and its deliveries arrive again, which loses nothing.
//
// Client delivery tags are the proxy's own and map to (backend link
// generation, backend tag), so a tag handed out before a failover can never
// settle a message delivered after it.
//
// # Dead-lettering
//
// RabbitMQ's mirrored queues dead-letter on the master and publish the
// dead-lettered message to every copy of its targets. Here each broker
// dead-letters only into its own copies of the targets, and a target's
// master may be on any broker, so a message dead-lettered by the source's
// master alone would reach a slave of the target (held by its trimmer,
// seen by no consumer) and miss the target's master. The design is
// therefore that every broker holding a copy of the message dead-letters
// that copy itself, for the same reason: then each broker puts one copy
// into its own copy of each target, and the target's copies stay equal
// whichever broker masters it.
//
//   - expired (x-message-ttl, expiration): every broker expires its own
//     copy; the trimmers give back the copies they hold once the TTL has
//     passed (a broker never expires a delivery it waits an ack for).
//     The master's broker does not expire what it delivered to a client
//     either: the proxy tells the trimmers of such a delivery
//     (mirror.Delivered) before the client sees it, and they hold those
//     copies past the TTL until the client acks (mirror.Acked) or
//     requeues (mirror.Requeued: the copies whose TTL passed are given
//     back then), at most until their recycle.
//   - rejected (basic.reject, basic.nack without requeue, also inside a
//     transaction at its commit): the master's broker dead-letters the
//     client's rejection; the proxy tells the slaves' trimmers, which
//     reject their copies without requeue instead of acking them
//     (Trimmer.Reject; in a cluster the rejection travels to the proxy
//     beside the slave like an ack's settle).
//   - maxlen, drop-head (x-max-length, x-max-length-bytes): RabbitMQ
//     counts only ready messages towards the limit and the trimmers hold
//     the slave copies unacknowledged, so only the master's broker drops,
//     and nothing would tell the slaves or the targets' other copies.
//     Making a slave's broker drop by itself is no answer: the brokers
//     order publishes of different channels each in its own interleaving,
//     so the head of a slave's copy need not be what the master dropped,
//     and a slave that drops what the master holds loses it at a
//     promotion. So the copies of such a queue, declared through a proxy
//     (QueueMeta.ForwardsDeadLetters), dead-letter into the proxy's own
//     exchange (DeadLetterExchange, BrokerArguments), whatever the client
//     asked, and the proxy sends each message on by its x-death: a drop by
//     the master is settled on the slaves and published to the client's
//     dead-letter exchange on every backend; a drop by a slave's broker
//     (its trimmer gave back more copies than the limit) goes back into
//     that slave, unless the drop came before the copy rejoined purged
//     (it was then the master's, before a promotion); a rejected or
//     expired copy goes to the client's dead-letter exchange on its own
//     backend, as without the proxy (engine/deadletters.go).
//   - maxlen, reject-publish and reject-publish-dlx (x-overflow): the
//     master's broker refuses a publish beyond the limit and the client
//     gets a nack, while the slaves' brokers (nothing ready, as above)
//     take their copies. The proxy removes them when the master's nack
//     comes: the slaves' trimmers ack them, or under reject-publish-dlx
//     reject them, for each broker to dead-letter its own copy into its
//     copies of the targets as the master's broker did (with x-death
//     reason rejected there, maxlen on the master's broker). Only a
//     publish to the default exchange names its queue; a refused
//     exchange publish, or one inside a broker transaction (which the
//     broker refuses silently), stays on the slaves.
//   - delivery_limit: x-delivery-limit is a quorum queue's; classic queues,
//     which are what is mirrored, ignore it.
//
// A dead-lettered message keeps its headers, the identity header
// included, so the trimmers of a target's slaves key it, and match it
// with the settlements of the target's master, like any publish. Each
// broker writes its own x-death: the same queue, reason, exchange and
// routing keys on every copy (a copy a sync brought to a slave has those
// of the sync's publish), and its own clock's time.
//
// Each client connection reaches each backend through a backend link of its
// own, opened lazily with the client's credentials (kept in memory for the
// connection's life and never logged, as RabbitMQ's shovels keep theirs),
// so every broker authenticates and authorises the client as always. A link
// is identified by backend and generation; a lost link is an event for the
// engine (failover), not the end of the client's connection.
//
// # Synchronisation
//
// A new slave starts empty and unsynchronised. With ha-sync-mode automatic,
// the proxy copies the master's messages to it at once, in batches of
// ha-sync-batch-size; with manual (RabbitMQ's default), only on `ctl
// sync_queue`, and a slave that never synced becomes synchronised when the
// messages older than its join have been consumed. Unlike RabbitMQ, a sync
// must not block the queue: the goal is to keep serving while it copies.
// The copy is read by a synchronised slave's trimmer (it already holds every
// message in queue order, and slaves have no client consumers to disturb):
// it gives back what it holds, publishes a marker message behind it, and
// consumes again, copying to the new slave every message before the marker
// that the master has not settled (controllink.Trimmer.CopyTo). Messages
// published during the copy reach the new slave through normal fan-out too;
// the new slave's trimmer keeps one of each identity, and drops a late copy
// of a message it already trimmed. What a non-blocking sync gives up: on the
// new slave the copied older messages sit behind newer ones until the
// backlog drains, so a promotion in that window would deliver them out of
// order (RabbitMQ's blocking sync avoids that by stopping the queue).
// The same disorder makes the new slave's trimmer ack out of order: the
// newer messages clients consume during the copy are acked behind the
// copied block it holds. RabbitMQ 3.x walks a channel's unacknowledged
// deliveries up to each acked one, so a trimmer holds at most
// ChannelDeliveries unacknowledged deliveries on one channel (its
// prefetch), consumes on a fresh one when they fill it, and keeps the
// older channel open until what it holds there is acked; with one channel, the acks of a sync of 100 000
// under load each walked the copied block, and the slave's broker confirmed
// the copy at a trickle.
//
// # Metadata
//
// Queue metadata (QueueMeta: master, slaves in join order, which are
// synchronised, epoch) lives in a Raft log (package store: hashicorp/raft
// with raft-boltdb under state_dir). A lone proxy is a single voter; the sidecar
// cluster adds voters to the same log. Decisions are pure functions over a
// QueueMeta read from the store; the result is written back conditionally
// on the Version that was read, so of two proxies deciding at once one
// wins and the other decides again on the new state. A proxy that cannot
// reach the log's leader cannot record a decision and so does not act on
// one. Exclusive queues never enter the log: they are never mirrored and
// die with their connection, which knows where it declared them.
//
// # Failover
//
// A backend is down at once when its connections are reset or refused, and
// after failover_grace when it merely stops answering. One that closes the
// watcher's connection with 320 CONNECTION_FORCED was stopped cleanly; the
// watcher reads that close from its socket itself, so that a reset right
// after it (a write meeting the closed socket) does not turn the stop into
// a failure. For every queue mastered there, the oldest live synchronised
// slave becomes master and the epoch rises; with no synchronised slave,
// ha-promote-on-failure decides (default always: promote the oldest slave,
// and messages only the old master held are lost, as in RabbitMQ), or
// after a clean stop ha-promote-on-shutdown (default when-synced: the queue
// waits for its master). The new master requeues every
// message clients had not acked, even if the ack was in flight, with
// redelivered set (its trimmer held them; the proxy flags the ones the old
// master delivered before the trimmer took them, see
// proxy/internal/ledger/redelivered.go); consumers
// move to it transparently with their consumer tags, except those declared
// with x-cancel-on-ha-failover, which receive basic.cancel. Publishes in
// flight during promotion are confirmed once the surviving copies hold them.
// A returning old master is never read as master again: it rejoins as the
// youngest slave, purged and then synchronised per ha-sync-mode.
//
// # Cluster of proxies
//
// In sidecar mode one proxy runs beside each broker. Package cluster joins
// them with serf (membership and failure detection, about a second) and
// gives the metadata store a Raft voter on every node, added and removed by
// the leader as members join and leave (a failed member keeps its vote, so
// a partition cannot give two sides a majority). Serf gives no total order,
// so the master and epoch of a queue change only through the log: a
// promotion is a conditional write, which a side without a majority cannot
// make (cluster.Majority is false there), and the epoch fences masters a
// stale side still believes in. A proxy that sees no more than half of
// the proxies alive pauses (serve, as RabbitMQ's pause_minority): it closes
// its clients with 320 and refuses new ones until a majority is back, so
// the two sides of a partition never both serve a mirrored queue. The
// package documentation of cluster says what is guaranteed under which
// failures, and what is not.
//
// Every proxy of the cluster runs an engine on the same log, so the work
// on a queue is shared out by node, each part done by exactly one proxy:
//
//   - Trimming: a slave copy is trimmed only by the proxy beside its
//     backend (its `node`). Trimmers on several proxies would split the
//     copy's messages between them, and a settle reaching one would miss
//     the messages another holds. A proxy whose client settles a message
//     settles its own node's slave at once and hands the settles for the
//     other slaves to their nodes' proxies, batched, on one connection
//     per peer (fire and forget: a lost batch leaves messages on a slave,
//     which come back redelivered if it is promoted).
//   - Purge: the proxy the client purged through empties each slave copy
//     through its trimmer; a copy another proxy trims is purged by that
//     proxy, which the first asks and waits for (a call on the cluster's
//     raft port) before the client's purge-ok.
//   - Policy changes (slaves added, dropped, handed over) and masters that
//     deleted themselves: the proxy beside the queue's master. While that
//     proxy is down its broker is usually down too, and the queue is
//     promoted first.
//   - Synchronisation: the proxy beside the slave (it owns the slave's
//     trimmer), one slave of a queue at a time, the first unsynchronised
//     live slave in join order. It asks the proxy beside a synchronised
//     slave to copy that slave's copy into the new one (a job on the
//     source's proxy, which the asker names and asks after until it ends),
//     since only that proxy's trimmer holds the messages clients hold
//     unacknowledged at the master; with no synchronised slave it copies
//     from the master, so that two proxies never take the master's
//     messages at once. The slave is recorded synchronised only when no
//     other proxy counts its broker down (such a proxy sends it nothing).
//     ctl sync_queue,
//     through any proxy, asks the proxy beside the first unsynchronised
//     slave, which hands the request on to the next when it is done.
//   - A backend that comes back: the proxy beside it lets its copies
//     rejoin (purged through its trimmer).
//   - Promotion: every proxy that sees the master's backend go down,
//     once a majority of the proxies count it down (they are asked), or
//     serf declared the proxy beside it failed, proposes the same decision
//     (the oldest live synchronised slave) as a conditional write; the
//     log takes the first, the others find the queue promoted. One proxy
//     cut off from a broker the others reach (a partial partition) so
//     deposes nothing: the others would go on delivering from the old
//     master until their logs apply the promotion, while the new master
//     delivers the same messages. A proposal the log cannot take (no leader during an
//     election) is made again a second later. A node is judged failed by
//     serf: when serf has held a proxy failed for half a second (shorter
//     suspicions are an overloaded host's), every survivor counts the
//     backend beside it down at once, as a reset (engine.Member.MemberFailed),
//     so they all act on the same signal within one to two seconds; each
//     proxy's own probe still catches a broker that dies under a live
//     proxy.
//
// Writes from any proxy go through the leader of the log (cluster.Put).
// Runtime policies (ctl set_policy and friends) are entries of the same
// log (store.Store.ChangePolicies, forwarded to the leader like queue writes):
// every proxy applies them in log order and its PolicyStore shows them;
// the proxy that made a change shows it when ctl returns, the others
// moments later. A proxy without a majority refuses a change rather than
// apply it alone. Policies of the config file stay each proxy's own.
//
// # Tombstones
//
// Deleting a queue leaves a tombstone in the log (store.Store.Tombstone: its
// copies' backends, epoch and when), so that a broker that was down at the
// time, and kept its copy, has that copy deleted instead of adopted as a
// new queue: by the proxy beside it when that proxy starts again (the
// tombstones newer than its log at start) or sees its broker return, and
// by Resolve when a client names the queue and the copy holds messages (an
// empty one may be a declare in progress). A queue the log never knew is
// still adopted. Declaring the queue again removes its tombstone; the log
// keeps the newest store.MaxTombstones.
//
// # Guarantees
//
// A message the proxy confirmed to a client is held by the master and every
// synchronised slave, so losing any one backend loses no confirmed message
// while a synchronised slave exists. Not guaranteed: messages on an
// unsynchronised queue whose master dies (as in RabbitMQ), exactly-once
// delivery (a requeued message is redelivered with the redelivered flag),
// and consistency across a network partition that splits the proxies into
// minorities, which refuse to promote rather than diverge. A message a
// queue's copies dead-letter through the proxy (a drop under x-max-length,
// see "Dead-lettering") reaches its targets at least once: a forwarder
// stopped between sending it on and acking it sends it again.
//
// # Where it lives
//
// The configuration and policy matching are package config. The pure
// decisions are this package's:
//
//   - placement.go: ResolveLocator (x-queue-master-locator argument, then
//     policy, then config, default min-masters) and Placement.Master
//     (min-masters, client-local falling back to min-masters, random from
//     an injected source; live backends only);
//   - reconcile.go: Reconcile turns a queue's metadata and its effective
//     policy into a Plan (slaves to add in ring order, slaves to drop, the
//     ha-mode nodes hand-over, slaves to sync under automatic);
//   - promotion.go: Promote (oldest live synchronised slave, else
//     ha-promote-on-failure / -on-shutdown), SlaveLost, and Rejoin (a
//     returning old master or slave becomes the youngest slave, purged);
//   - quorum.go: AppendPublishTargets, AppendConfirmQuorum and
//     DecideConfirm, allocation-free for the per-publish path;
//   - sync.go: Backlog.CaughtUp (a manual slave is synchronised once the
//     master's backlog at its join is settled), MarkSynchronised, and Held
//     (what a proxy holds of a queue's messages, its copies from the master
//     included);
//   - drophead.go: DropsHead, BrokerArguments (the copies of a queue that
//     drops its head dead-letter into DeadLetterExchange) and
//     DeadLetterEquivalence (the 406 of a redeclare with other dead-letter
//     arguments).
//
// Carried out against real brokers:
//
//   - store: the metadata Store on a Raft log (single voter by default),
//     surviving restarts, with conditional writes, and the runtime
//     policies, tombstones and voters kept in the same log; serve opens it
//     in state_dir/raft when more than one backend is configured;
//   - controllink: Watcher (each backend's liveness through the proxy's own
//     connection: down at once on reset or clean shutdown, after
//     failover_grace when frozen), Trimmer (a slave copy trimmed by the
//     master's settlements, batched, surviving consumer_timeout; messages
//     without the identity header keyed by their content, so adopted
//     queues are trimmed too; Purge empties the copy with nothing held) and
//     Trimmer.CopyTo (synchronisation);
//   - engine: the replication engine, which serve gives the proxy as its
//     Mirror. It places new queues (locator, then policy), records them,
//     keeps a lock-free snapshot of the log for Lookup on the publish path,
//     adopts queues found on the backends (Resolve: the copy with most
//     messages is master, others unsynchronised slaves), runs a trimmer
//     per slave, carries out Reconcile's plans when policies change or
//     backends come and go (declaring new slaves with the queue's
//     arguments and bindings, never auto-delete; deleting dropped copies
//     last), synchronises (automatic at once, manual on `ctl sync_queue`;
//     a never-synced slave is marked synchronised once the master's ready
//     count at its first look has been settled, or the master is empty),
//     empties slaves on purge, forgets queues whose master deleted itself
//     (auto-delete, x-expires), forwards what queues that drop their head
//     dead-letter, and answers `ctl list_queues`. On a
//     backend's loss it records promotions (Promote; the epoch rises) and
//     slaves lost; a backend that returns rejoins as the youngest slave,
//     purged;
//   - cluster: serf membership driving the Raft voters (sidecar mode).
//
// # Inside the engine: who owns which state
//
// engine.Engine is only the API the proxy, serve and ctl call (under
// forty methods, nearly all delegating), and engine.Member the side a
// sidecar cluster calls (the peers' requests, serf's verdicts,
// pause_minority). Each concern behind them is a type of its own that owns its state behind its own lock, and
// reaches the others through narrow pointers to them, never the Engine:
//
//	part           owns                                  guarded by
//	snapshots      the Lookup snapshot, its routing      atomic pointer;
//	               table                                 mu serialises
//	                                                     replacing it
//	recorder       nothing: conditional writes, shown    -
//	               to Lookup at once
//	operator       nothing: declare, delete, purge,      -
//	               probe on a backend; a sync's dial
//	liveness       serf's failed members, the drained    a lock each,
//	               backends, the pause                   atomics
//	trimmers       a Trimmer per slave copy trimmed      mu (a Trimmer
//	               here, missing copies, backlogs        has its own)
//	syncs          the sync per queue, failed and        mu
//	               half-done copies
//	reconciler     the copies reported short of a        missedCopies.mu
//	               publish; drives the loop's work
//	failover       the events queue; the lost backends   mu (the queue);
//	               and the start check                   the loop's own
//	drainer        nothing (the drained set is           -
//	               liveness's)
//	listing        the functions that ask this proxy's   atomic pointers
//	               clients (unacked, unrecorded)
//	negativeCache  queues no backend had, until when     mu
//	replyNodes     each backend's Erlang node            mu
//
// Lock order: trimmers' lock before a Trimmer's lock and the Store's;
// the snapshot's before the Store's; every other lock is taken alone. No
// part calls another while holding its own lock, and none holds a lock
// across network I/O. The metadata itself has one owner, the Store (the
// Raft log): every part reads it there and writes it through recorder's
// conditional writes, which settle races between parts, goroutines and
// proxies alike.
//
// How a sync copies when no slave is synchronised (the master alone, as
// an adopted queue is): a short-lived consumer of the proxy's own takes
// the master's ready messages, copies each to every new slave at once
// with confirms (two batches of ha-sync-batch-size in flight), and when it
// has them all closes its channel, which gives them back to their places
// in the queue. It has them all when it has seen the master's ready count
// of the start, or the master has nothing ready left; a message a new
// slave already holds is not copied to it again, but does not end the
// copy: after a partition heals, TCP can deliver to a rejoined copy,
// purged meanwhile, publishes sent to it before the cut, which sit
// anywhere in the master's backlog (a copy that ended at the first of
// them would leave the slave short of the rest). A copy that ended half
// way is purged from the slaves before the next one. With a synchronised
// slave, new slaves are copied from it one after another
// (Trimmer.CopyTo), in a sidecar cluster by the proxy beside it. Syncs run on
// connections of their own, never the watcher's: RabbitMQ throttles a
// connection that publishes fast, and probes waiting behind the throttle
// would call the backend down. RabbitMQ sets the redelivered flag on
// every message given back that way, so after such a sync clients see
// those messages with redelivered=true; while it runs, clients are served
// the messages behind them. Messages clients hold unacknowledged at the
// master are not ready and are not copied: one requeued after the sync is
// missing on the slave. That is why a copy from the master is the last
// resort, for a queue with no synchronised slave.
//
// What a manual slave's backlog counts is what the master held when the
// engine first looks at the slave: its ready count and the messages the
// proxies' clients hold unacknowledged (every proxy is asked; without all
// the answers nothing is decided), settled by the settlements the slave's
// trimmer never received a copy of. A copy from the master, run by any
// proxy, holds the master's ready messages while it runs, and an empty
// master then says nothing: each proxy reports the copies it began and
// ended, asked before and after the engine looks at the masters, and a
// queue whose copies ran in between waits for a later look.
//
// In the proxy (package proxy): a link to each backend per client
// connection with the client's credentials; declares, binds, purges and
// deletes on every copy; publishes fanned out with the identity header,
// confirmed once the master and the synchronised slaves confirmed;
// deliveries from the master with the header removed, acks reported to
// the engine for trimming; and failover on the data path: consumers of a
// lost master move to the promoted one with their tags (or get basic.cancel
// with x-cancel-on-ha-failover), delivery tags are scoped by link
// generation so a stale one settles nothing, and a client whose home
// backend died keeps its connection. A promotion is recorded by every
// proxy that sees the loss, conditionally, so one wins.
//
// `ctl drain BACKEND` promotes away from a backend per
// ha-promote-on-shutdown and keeps new copies off it until `ctl undrain`.
//
// Expired messages (x-message-ttl, expiration) leave the slaves too: a
// trimmer gives back, with a requeue, a copy it holds past the message's
// TTL, and the slave's broker expires it and dead-letters it into its own
// copy of the target queue. Messages a client rejects without requeue are
// rejected on the slaves too, and dead-lettered there (see
// "Dead-lettering").
//
// A channel the client never put in confirm mode is put in confirm mode
// towards the backends by the proxy at its first publish to several
// copies; the client sees none of those confirms.
package mirror
