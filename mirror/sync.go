package mirror

import "github.com/amqp-mirror/amqp-mirror/config"

// Synchronisation decisions.
//
// A new slave starts empty and receives every message published after it
// joined, and loses every message acked after it joined; so it always holds
// a subset of the master's messages, and it is synchronised exactly when
// the master holds no message older than its join.
//
// "Older than its join" is measured with the proxy's publish sequence of
// the queue: each message published to the queue through the proxy gets
// the next number of one per-queue sequence (the message identity the
// proxy adds at publish carries it). When a slave joins, the shell records
// its join mark: the highest sequence published before the slave was a
// publish target, so every message above the mark reached the slave. The
// slave is then synchronised once the oldest message the master still holds
// has a sequence above the mark, or the master is empty. Messages that were
// on the master before the proxy adopted the queue have no sequence and
// count as 0, older than every mark.
//
// Why not compare queue depths, as RabbitMQ does inside one Erlang
// process? Across independent brokers the two depths are read at
// different instants: a master that has just dropped an acked message
// while the slave's ack is still in flight shows the same depth as a slave
// that lacks an old message, and the slave would be called synchronised
// too early. Sequences do not race that way.
//
// The same rule serves both sync modes: under automatic (and after `ctl
// sync_queue`) the sync copies the messages at or below the mark to the
// slave and then marks it synchronised; under manual the slave waits for
// CaughtUp.

// CaughtUp reports whether a slave whose join mark is joinMark holds every
// message the master holds, given the sequence of the oldest message the
// master still holds (ignored when masterEmpty). An unsynchronised slave of
// an empty master is synchronised at once, as a new RabbitMQ mirror of an
// empty queue is.
func CaughtUp(joinMark, oldestOnMaster uint64, masterEmpty bool) bool {
	return masterEmpty || oldestOnMaster > joinMark
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
