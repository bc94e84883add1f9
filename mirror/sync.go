package mirror

import "github.com/amqp-mirror/amqp-mirror/config"

// Synchronisation decisions.
//
// A new slave starts empty, receives every message published after it
// joined, and loses every message acked after it joined; so it always holds
// a subset of the master's messages, and it is synchronised exactly when
// the master holds none of the messages it held when the slave joined (its
// backlog). Under ha-sync-mode automatic, and after `ctl sync_queue`, a sync
// copies the backlog and then marks the slave synchronised; under manual, a
// slave that never synced waits until the backlog is gone (CaughtUp).
//
// The backlog is counted, not named: when the slave becomes a publish
// target the shell records how many messages the master holds (ready plus
// delivered and not yet acknowledged), then counts those of them that the
// master settles (acked, or rejected without requeue). It can tell them
// apart without a queue-wide sequence, which publishes through several
// proxies do not have: the master delivers in queue order and every
// message published after the join queues behind the backlog, so the
// backlog is what was delivered and unacknowledged at the join plus the
// first Held-minus-that distinct messages delivered after it (a requeued
// message keeps its place and is the same message when redelivered).
// Priority queues (x-max-priority) break that order: for them the shell
// counts nothing and waits for the master to be empty, which is always
// enough; so does a slave whose backlog the broker shrinks by itself
// (message TTL, max-length), which the proxy does not see.
//
// Why not compare queue depths, as RabbitMQ does inside one Erlang
// process? Across independent brokers the two depths are read at different
// instants: a master that has just dropped an acked message while the
// slave's ack is still in flight shows the same depth as a slave that lacks
// an old message, and the slave would be called synchronised too early.

// Backlog is what a slave that waits to catch up is waiting for.
type Backlog struct {
	// Held is how many messages the master held when the slave joined.
	Held int
	// Settled is how many of them the master has settled since.
	Settled int
}

// Settle returns the backlog with n more of its messages settled.
func (b Backlog) Settle(n int) Backlog {
	b.Settled += n
	return b
}

// CaughtUp reports whether a slave with this backlog holds every message
// the master holds: every message of the backlog was settled, or the master
// is empty now. A slave that joins an empty queue (Held 0) is synchronised
// at once, as a new RabbitMQ mirror of an empty queue is.
func (b Backlog) CaughtUp(masterEmpty bool) bool {
	return masterEmpty || b.Settled >= b.Held
}

// MarkSynchronised returns the metadata with the slave on backend marked
// synchronised; changed is false when backend is no unsynchronised slave of
// the queue. It never changes m.
func MarkSynchronised(m QueueMeta, backend string) (out QueueMeta, changed bool) {
	out = m.Clone()
	if i := out.SlaveIndex(backend); i >= 0 && !out.Slaves[i].Synchronised {
		out.Slaves[i].Synchronised = true
		changed = true
	}
	return out, changed
}

// AutomaticSync reports whether new slaves of a queue with this effective
// definition are synchronised at once (ha-sync-mode automatic), rather than
// on `ctl sync_queue` or when they catch up (manual, RabbitMQ's default).
func AutomaticSync(def config.Definition) bool {
	return def.Mirrored() && def.WithDefaults().SyncMode == config.SyncAutomatic
}

// SyncBatches returns how many batches a sync of messages messages takes
// with the definition's ha-sync-batch-size (default 4096).
func SyncBatches(messages int, def config.Definition) int {
	size := def.SyncBatchSize
	if size <= 0 {
		size = config.DefaultSyncBatchSize
	}
	if messages <= 0 {
		return 0
	}
	return (messages + size - 1) / size
}

// CopyJob asks the proxy beside a synchronised slave to copy that slave's copy of
// Queue into the copy on Target, a slave that synchronises. In a sidecar cluster only
// that proxy's trimmer holds the slave's messages, and a synchronised slave holds every
// message the master does, those clients hold unacknowledged included, which a copy from
// the master cannot see.
type CopyJob struct {
	// ID names the job in the asker's questions about it; the asker chooses it.
	ID     string
	Queue  QueueID
	Target string
	// Batch is the sync's ha-sync-batch-size: how many copies the target's broker
	// confirms at a time.
	Batch int
}

// CopyState is how a CopyJob stands.
type CopyState struct {
	Done   bool
	Copied int
	// Err says why a job that is done failed; "" when it copied everything.
	Err string
}

// Held is what a proxy, or every proxy added up, holds of a queue's
// messages apart from its master's ready count: the deliveries its clients
// have not settled, and the copies from the master (syncs) it ran. A copy
// from the master takes the master's ready messages while it runs, so a
// master that looks empty then may still hold its whole backlog; Copies
// tells whether a copy overlapped a look at the master.
type Held struct {
	Unacked int
	Copies  CopyRuns
}

// Add returns h with o added.
func (h Held) Add(o Held) Held {
	return Held{Unacked: h.Unacked + o.Unacked, Copies: CopyRuns{Began: h.Copies.Began + o.Copies.Began, Ended: h.Copies.Ended + o.Copies.Ended}}
}

// CopyRuns counts the copies from a queue's master that began and that
// ended. Two equal counts, neither running, taken before and after a look
// at the master, say that no copy held the master's messages during it.
type CopyRuns struct {
	Began, Ended uint64
}

// Running reports whether a copy runs.
func (c CopyRuns) Running() bool { return c.Began != c.Ended }
