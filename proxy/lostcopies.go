package proxy

import (
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// releaseLostCopies lets go of the lost quorum copies that keep publishes
// waiting (channelConfirms.releaseLostCopies) on every channel of the
// connection: those whose loss the metadata has recorded, and those lost
// longer than FailoverWait ago, whose publishes are nacked. The server's watcher calls
// it every masterCheckInterval.
func (c *clientConn) releaseLostCopies() {
	m := c.srv.opts.Mirror
	held := func(backend int, queue *mirror.QueueID) bool {
		if queue == ledger.AnyQueue {
			queue = nil
		}
		return m.Holds(c.srv.backends[backend].Name, queue)
	}
	expired := time.Now().Add(-c.srv.opts.FailoverWait)
	c.channels.each(func(ch *channelState) {
		if !ch.confirms.holdsLostCopies() {
			return
		}
		ch.outMu.Lock()
		out := ch.confirms.releaseLostCopies(held, expired)
		c.settler.passConfirms(ch, out)
		ch.outMu.Unlock()
		if len(out) > 0 {
			c.out.flush()
		}
	})
}
