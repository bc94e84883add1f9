package engine

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestMasterLostAndBack: when the master's broker stops, its oldest
// synchronised slave is promoted (the epoch rises) and holds the messages
// ready; when the broker returns, its stale copy rejoins as the youngest
// slave, purged, and ha-mode all with automatic sync synchronises it again.
func TestMasterLostAndBack(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "ha-all", "^failover-", `{"ha-mode": "all", "ha-sync-mode": "automatic"}`)
	ctx := context.Background()
	id := queueID(uniqueName(t, "failover"))
	placed := mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit3",
		Slaves: []mirror.Slave{{Backend: "rabbit1", Synchronised: true}, {Backend: "rabbit2", Synchronised: true}}}
	declareCopies(t, placed)
	m, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	publishTo(t, id.Name, 0, 50, m.Backends()...)
	expectHeld(t, h.engine, id, 50, "rabbit1", "rabbit2")

	rabbit3 := brokers.Node("rabbit3")
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := rabbit3.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	// Whatever happens below, the node is back for the other tests.
	t.Cleanup(func() {
		if !rabbit3.Running() {
			rabbit3.Restart(context.Background())
		}
	})
	promoted := expectMeta(t, h.store, id, func(m mirror.QueueMeta, ok bool) error {
		if m.Master != "rabbit1" || m.Epoch != 1 || m.Holds("rabbit3") {
			return fmt.Errorf("master %s, epoch %d, slaves %+v; want rabbit1, epoch 1, rabbit3 gone", m.Master, m.Epoch, m.Slaves)
		}
		return nil
	})
	if !slices.Equal(promoted.SynchronisedSlaves(), []string{"rabbit2"}) {
		t.Errorf("after the promotion the synchronised slaves are %v, want [rabbit2]", promoted.SynchronisedSlaves())
	}
	// The promotion is in the history the status page shows, with how long it took.
	i := slices.IndexFunc(h.engine.Failovers(), func(f mirror.Failover) bool { return f.Queue == id })
	if i < 0 {
		t.Errorf("Failovers() lacks the promotion of %v: %+v", id, h.engine.Failovers())
	} else if f := h.engine.Failovers()[i]; f.From != "rabbit3" || f.To != "rabbit1" || f.Cause != "shutdown" || f.Epoch != 1 || !f.Synchronised ||
		f.Duration <= 0 || f.Duration > time.Minute || !f.PromotedAt.Equal(f.DetectedAt.Add(f.Duration)) {
		t.Errorf("the promotion recorded: %+v; want from rabbit3 to rabbit1, cause shutdown, epoch 1, synchronised, a duration under a minute", f)
	}
	testutil.Eventually(t, time.Minute, func() error {
		if n := readyOn(t, "rabbit1", id.Name); n != 50 {
			return fmt.Errorf("the new master has %d ready messages, want 50 (its trimmer gave them back)", n)
		}
		return nil
	})

	if err := rabbit3.Restart(stopCtx); err != nil {
		t.Fatal(err)
	}
	rejoined := expectMeta(t, h.store, id, synchronisedSlaves(2))
	if got := rejoined.Backends(); !slices.Equal(got, []string{"rabbit1", "rabbit2", "rabbit3"}) {
		t.Errorf("after the return the copies are %v, want [rabbit1 rabbit2 rabbit3] (rabbit3 the youngest slave)", got)
	}
	expectHeld(t, h.engine, id, 50, "rabbit2", "rabbit3")
}
