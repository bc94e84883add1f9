package proxy

import (
	"time"

	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// channelConfirms are a channel's publisher confirms: the numbering of its
// publishes and the backends' confirms counted towards the client's, the
// returns of mandatory publishes sent to several backends, and the scratch
// for what a lost link settles. The channel holds them by value and they
// are guarded by the channel's mu; their methods are called with it held,
// by channelState's methods only. The client loop numbers publishes, the
// link loops apply the backends' confirms and returns, and failover and
// whoever loses a link release what lost copies hold.
type channelConfirms struct {
	publishes ledger.PublisherConfirms
	// returns counts, for mandatory publishes sent to several backends,
	// the backends that returned each (see returnArrived).
	returns returnCounts
	// confirmedLost is scratch for the confirms a lost link settles, missed
	// for the slave copies it leaves short of publishes.
	confirmedLost []ledger.ClientConfirm
	missed        []ledger.MissedCopy
}

// lostLink settles the publishes link owed confirms for, lost at now: the
// confirms that settles and the slave copies it leaves short, in the
// scratch.
func (c *channelConfirms) lostLink(link int, now time.Time) ([]ledger.ClientConfirm, []ledger.MissedCopy) {
	missed := c.missed[:0]
	confirms := c.publishes.BackendLost(link, now, c.confirmedLost[:0], &missed)
	c.confirmedLost, c.missed = confirms, missed
	return confirms, missed
}
