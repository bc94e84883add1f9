package proxy

import (
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// channelDeliveries are a channel's delivery tags and what its transaction
// settled of them. The channel holds them by value and they are guarded by
// the channel's mu; their methods are called with it held, by
// channelState's methods only. The link loops assign the tags, the client
// loop settles them and ends transactions, and the views count the unacked
// ones.
type channelDeliveries struct {
	tags ledger.DeliveryTags
	// txSettled holds the deliveries the client settled in the open
	// transaction, restored if it rolls back (the broker never applied
	// those acks).
	txSettled []ledger.TagEntry
	// txTrims says, for each of txSettled, what its commit does to the
	// slave copies.
	txTrims []trimKind
	// acks is scratch for the acknowledgements a settlement sends.
	acks []ledger.BackendAck
}

// endTransaction applies tx.commit or tx.rollback to the deliveries the
// transaction settled: a rollback makes them outstanding again, a commit
// hands them to commit.
func (d *channelDeliveries) endTransaction(rollback bool, commit func([]ledger.TagEntry, []trimKind)) {
	if rollback {
		d.tags.Restore(d.txSettled)
	} else {
		commit(d.txSettled, d.txTrims)
	}
	d.txSettled = d.txSettled[:0]
	d.txTrims = d.txTrims[:0]
}

// countUnacked adds the deliveries awaiting settlement to counts (see
// ledger.DeliveryTags.CountUnacked).
func (d *channelDeliveries) countUnacked(vhost string, live func(backend int, gen uint64) bool, counts map[mirror.QueueID]int) {
	d.tags.CountUnacked(vhost, live, counts)
}

// settle applies the client's ack, nack or reject of tag, in a transaction
// when transactional (see channelState.settleDeliveries).
func (d *channelDeliveries) settle(transactional bool, tag uint64, multiple bool, kind trimKind, trims *[]ledger.Trimmed) ([]ledger.BackendAck, *[]ledger.Trimmed, int, bool) {
	if transactional {
		trims = nil // trimmed at tx.commit, from txSettled
	}
	outstanding := d.tags.Outstanding()
	acks, settled, ok := d.tags.Settle(tag, multiple, d.acks[:0], transactional, d.txSettled, trims)
	if transactional {
		for range settled[len(d.txSettled):] {
			d.txTrims = append(d.txTrims, kind)
		}
	}
	d.acks, d.txSettled = acks, settled
	return acks, trims, outstanding - d.tags.Outstanding(), ok
}
