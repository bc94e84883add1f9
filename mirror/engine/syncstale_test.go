package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestSyncFromMasterPastAStaleCopy: a slave that already holds one message
// of the master's backlog when a sync from the master starts still gets the
// whole backlog. After a partition heals, TCP delivers to a rejoined copy
// what a proxy had sent it before the cut (publishes buffered on a link the
// proxy gave up), after the copy was purged: such a message sits in the
// middle of the master's backlog, and the sync ended at it, taking it for
// the first message that reached the new slave by fan-out (issue 9: the
// rejoined slave recorded synchronised with half the master's messages).
func TestSyncFromMasterPastAStaleCopy(t *testing.T) {
	const backlog = 300
	tests := []struct {
		name  string
		stale int // the backlog message the slave holds before the sync
	}{
		{name: "first of the backlog", stale: 0},
		{name: "middle of the backlog", stale: backlog / 2},
		{name: "last of the backlog", stale: backlog - 1},
	}
	h := newHarness(t, "", nil)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := declareUnmirrored(t, h, fmt.Sprintf("stale%d-%d", i, time.Now().UnixNano()))
			publishTo(t, m.ID.Name, 0, backlog, m.Master)
			// A manual slave, so that the stale message is there before the
			// sync starts.
			policy := fmt.Sprintf("stale%d", i)
			setPolicy(t, h.policies, policy, "^"+policy+"-", `{"ha-mode": "exactly", "ha-params": 2}`)
			m = expectMeta(t, h.store, m.ID, func(m mirror.QueueMeta, ok bool) error {
				if len(m.Slaves) != 1 || m.Slaves[0].Synchronised {
					return fmt.Errorf("slaves %+v, want one, unsynchronised", m.Slaves)
				}
				return nil
			})
			slave := m.Slaves[0].Backend
			expectHeld(t, h.engine, m.ID, 0, slave) // added purged, and trimmed
			publishTo(t, m.ID.Name, tt.stale, tt.stale+1, slave)
			expectHeld(t, h.engine, m.ID, 1, slave)

			if err := h.engine.SyncQueue(context.Background(), m.ID); err != nil {
				t.Fatal(err)
			}
			expectMeta(t, h.store, m.ID, synchronisedSlaves(1))
			testutil.Eventually(t, 2*time.Minute, func() error {
				if got, want := held(h.engine, m.ID, slave), readyOn(t, m.Master, m.ID.Name); got != want || want != backlog {
					return fmt.Errorf("the slave, recorded synchronised, holds %d messages; the master %d; want %d on both", got, want, backlog)
				}
				return nil
			})
		})
	}
}
