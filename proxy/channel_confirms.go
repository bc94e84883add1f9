package proxy

import (
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// channelConfirms are a channel's publisher confirms: the numbering of its
// publishes and the backends' confirms counted towards the client's, the
// returns of mandatory publishes sent to several backends, and the scratch
// for what a lost link settles. The channel holds them by value and they
// are guarded by the channel's mu (mu points at it): one lock for the
// channel, since a lost link drops its consumers and settles its confirms
// in one step. channelState's methods that change the confirms together
// with the channel's other state (lostLink, which calls lostLinkLocked,
// selectConfirms, and a kept transaction's commit) hold mu while they do;
// its other methods take it themselves. The client loop numbers
// publishes, the link loops apply the backends' confirms and returns, the
// server's watcher releases what lost copies hold, and the views and
// metrics count what is unconfirmed.
type channelConfirms struct {
	// mu is the channel's mu (channelState.mu), set once by
	// newChannelState.
	mu        *sync.Mutex
	publishes ledger.PublisherConfirms
	// returns counts, for mandatory publishes sent to several backends,
	// the backends that returned each (see returnArrived).
	returns returnCounts
	// confirmedLost is scratch for the confirms a lost link settles, missed
	// for the slave copies it leaves short of publishes.
	confirmedLost []ledger.ClientConfirm
	missed        []ledger.MissedCopy
}

// lostLinkLocked settles the publishes link owed confirms for, lost at
// now: the confirms that settles and the slave copies it leaves short, in
// the scratch. The caller holds mu.
func (c *channelConfirms) lostLinkLocked(link int, now time.Time) ([]ledger.ClientConfirm, []ledger.MissedCopy) {
	missed := c.missed[:0]
	confirms := c.publishes.BackendLost(link, now, c.confirmedLost[:0], &missed)
	c.confirmedLost, c.missed = confirms, missed
	return confirms, missed
}

// numberPublish numbers a publish to the home backend alone, which
// arrived at arrived (zero: not timed).
func (c *channelConfirms) numberPublish(arrived time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.publishes.Publish(0)
	if !arrived.IsZero() {
		c.publishes.Arrived(arrived)
	}
}

// numberCopies numbers a publish to the copies of cs, after prune took out
// the copies on links lost since the route was decided: prune runs under
// the lock, since such a link has settled its confirms under it already,
// and numbering the publish on it would wait for a confirm nobody sends.
// prune returns the time of the loss of unreached copies (zero for none).
// A publish left with no copy to wait for is confirmed at once: its
// confirms are returned. arrived is when the publish arrived (zero: not
// timed).
func (c *channelConfirms) numberCopies(cs ledger.CopySet, arrived time.Time, prune func(*ledger.CopySet) time.Time) (uint64, []ledger.ClientConfirm) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := prune(&cs)
	p := &c.publishes
	seq := p.PublishTo(cs, now)
	if !arrived.IsZero() {
		p.Arrived(arrived)
	}
	var out []ledger.ClientConfirm
	if len(cs.Quorum) == 0 && len(cs.Unreached) == 0 {
		out = p.ConfirmWithoutCopies(nil)
	}
	return seq, out
}

// identifyPublish records the identity the proxy gave the message of the
// publish whose content is passing (publishing): for its returns from
// several backends and for its confirm.
func (c *channelConfirms) identifyPublish(id mirror.MessageID, pub *publishing) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pub.returns > 1 {
		c.returns.expect(id, pub.returns)
	}
	if pub.seq != 0 {
		c.publishes.Identify(pub.seq, id)
	}
}

// returnArrived counts a backend's return of the message id, and reports
// whether it is the one the client gets.
func (c *channelConfirms) returnArrived(id mirror.MessageID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.returns.arrived(id)
}

// applyConfirm applies a backend's confirm of its publish seq (see
// ledger.PublisherConfirms.Confirm), with the caller's scratch: the
// client's confirms are appended to out, the slave copies a nack leaves
// short to missed, and on a nack the publishes their master refused to
// refused.
func (c *channelConfirms) applyConfirm(backend int, seq uint64, multiple, nack bool, out []ledger.ClientConfirm, missed []ledger.MissedCopy, refused []ledger.RefusedPublish) ([]ledger.ClientConfirm, []ledger.MissedCopy, []ledger.RefusedPublish) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out = c.publishes.Confirm(backend, seq, multiple, nack, out, &missed)
	if nack {
		refused = c.publishes.TakeRefused(refused)
	}
	return out, missed, refused
}

// unconfirmed returns the number of publishes still unconfirmed and, per
// backend, the confirms it owes.
func (c *channelConfirms) unconfirmed() (int, map[int]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.publishes.Unconfirmed(), c.publishes.Owed()
}

// unconfirmedCount is the number of publishes still unconfirmed.
func (c *channelConfirms) unconfirmedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.publishes.Unconfirmed()
}

// holdsLostCopies reports whether lost copies keep publishes waiting.
func (c *channelConfirms) holdsLostCopies() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.publishes.HoldsLost()
}

// releaseLostCopies lets go of lost copies (see
// ledger.PublisherConfirms.Release) and returns the confirms that answers,
// in the confirms' scratch; the caller holds the channel's outMu.
func (c *channelConfirms) releaseLostCopies(held func(backend int, queue *mirror.QueueID) bool, expired time.Time) []ledger.ClientConfirm {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.confirmedLost = c.publishes.Release(held, expired, c.confirmedLost[:0])
	return c.confirmedLost
}
