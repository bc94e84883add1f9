package engine

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
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

	rabbit3 := stopBroker(t, "rabbit3")
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

	if err := rabbit3.Restart(restartCtx(t)); err != nil {
		t.Fatal(err)
	}
	rejoined := expectMeta(t, h.store, id, synchronisedSlaves(2))
	if got := rejoined.Backends(); !slices.Equal(got, []string{"rabbit1", "rabbit2", "rabbit3"}) {
		t.Errorf("after the return the copies are %v, want [rabbit1 rabbit2 rabbit3] (rabbit3 the youngest slave)", got)
	}
	expectHeld(t, h.engine, id, 50, "rabbit2", "rabbit3")
}

// peersCountingDown are the other proxies of a cluster of three, of which
// down count every backend down.
type peersCountingDown struct {
	noPeers
	down atomic.Int32
}

func (p *peersCountingDown) CountDown(context.Context, string) (int, int, error) {
	return int(p.down.Load()), 3, nil
}

// TestMasterStaysWhileMostProxiesReachIt: in a cluster of three, a proxy whose
// own probe loses the master's broker while the other two still reach it (a
// partial partition) leaves the master where it is; once another proxy counts
// the broker down too, a majority, it promotes.
func TestMasterStaysWhileMostProxiesReachIt(t *testing.T) {
	peers := &peersCountingDown{}
	h := newHarnessWith(t, "", nil, func(o *Options) { o.Node, o.Peers = "rabbit1", peers })
	setPolicy(t, h.policies, "outvoted", "^outvoted-", `{"ha-mode": "all"}`)
	ctx := context.Background()
	id := queueID(uniqueName(t, "outvoted"))
	placed := mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit3",
		Slaves: []mirror.Slave{{Backend: "rabbit1", Synchronised: true}, {Backend: "rabbit2", Synchronised: true}}}
	declareCopies(t, placed)
	if _, err := h.engine.Declared(ctx, placed); err != nil {
		t.Fatal(err)
	}

	rabbit3 := stopBroker(t, "rabbit3")
	testutil.Eventually(t, time.Minute, func() error {
		if !h.engine.BackendDown("rabbit3") {
			return fmt.Errorf("the engine does not count rabbit3 down yet")
		}
		return nil
	})
	// The loss and two retries of it, a second apart.
	time.Sleep(2500 * time.Millisecond)
	if m, _ := h.store.Get(id); m.Master != "rabbit3" || m.Epoch != 0 {
		t.Fatalf("master %s, epoch %d while the other proxies reach rabbit3; want rabbit3, epoch 0", m.Master, m.Epoch)
	}

	peers.down.Store(1)
	expectMeta(t, h.store, id, func(m mirror.QueueMeta, ok bool) error {
		if m.Master != "rabbit1" || m.Epoch != 1 {
			return fmt.Errorf("master %s, epoch %d; want rabbit1, epoch 1, once two of three count rabbit3 down", m.Master, m.Epoch)
		}
		return nil
	})
	if err := rabbit3.Restart(restartCtx(t)); err != nil {
		t.Fatal(err)
	}
}

// stopBroker stops the broker named name cleanly; whatever the test does
// after, the broker runs again for the other tests.
func stopBroker(t *testing.T, name string) *localbroker.Node {
	t.Helper()
	node := brokers.Node(name)
	if err := node.Stop(restartCtx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !node.Running() {
			node.Restart(context.Background())
		}
	})
	return node
}

// restartCtx bounds a broker's stop or restart to a minute.
func restartCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
