package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestMemberFailedCountsBackendDown: serf's verdict that the proxy beside
// a backend failed counts the backend down at once, although the watcher
// still sees its broker up: the master there is replaced by its oldest
// synchronised slave, and the proxy is told to drop its links
// (BackendDown). When serf sees the proxy alive again, the backend counts
// up and its copy rejoins as the youngest slave, purged.
func TestMemberFailedCountsBackendDown(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "ha-all", "^member-", `{"ha-mode": "all", "ha-sync-mode": "automatic"}`)
	ctx := context.Background()
	id := queueID(uniqueName(t, "member"))
	placed := mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit2",
		Slaves: []mirror.Slave{{Backend: "rabbit3", Synchronised: true}, {Backend: "rabbit1", Synchronised: true}}}
	declareCopies(t, placed)
	m, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	publishTo(t, id.Name, 0, 20, m.Backends()...)
	expectHeld(t, h.engine, id, 20, "rabbit3", "rabbit1")

	failed := time.Now()
	h.engine.Member().MemberFailed("rabbit2")
	if !h.engine.BackendDown("rabbit2") {
		t.Error("BackendDown(rabbit2) = false right after MemberFailed, want true")
	}
	expectMeta(t, h.store, id, func(m mirror.QueueMeta, ok bool) error {
		if m.Master != "rabbit3" || m.Epoch != 1 || m.Holds("rabbit2") {
			return fmt.Errorf("master %s, epoch %d, slaves %+v; want rabbit3, epoch 1, rabbit2 gone", m.Master, m.Epoch, m.Slaves)
		}
		return nil
	})
	t.Logf("promoted %v after MemberFailed", time.Since(failed))
	if h.engine.liveness.live().Has("rabbit2") {
		t.Error("rabbit2 still counts as live while its proxy is failed")
	}

	h.engine.Member().MemberAlive("rabbit2")
	// MemberFailed closed the watcher's connection, as a reset would; it
	// counts up again once the watcher has reconnected.
	testutil.Eventually(t, time.Minute, func() error {
		if h.engine.BackendDown("rabbit2") {
			return errors.New("BackendDown(rabbit2) = true after MemberAlive with its broker up, want false")
		}
		return nil
	})
	rejoined := expectMeta(t, h.store, id, synchronisedSlaves(2))
	if got := rejoined.Backends(); !slices.Equal(got, []string{"rabbit3", "rabbit1", "rabbit2"}) {
		t.Errorf("after the return the copies are %v, want [rabbit3 rabbit1 rabbit2] (rabbit2 the youngest slave)", got)
	}
	testutil.Eventually(t, time.Minute, func() error {
		if n := readyOn(t, "rabbit3", id.Name); n != 20 {
			return fmt.Errorf("the new master has %d ready messages, want 20", n)
		}
		return nil
	})
}

// TestDeletedQueueCopyIsNotAdopted: a copy that a broker kept of a queue
// deleted while it was down (the log keeps the queue's tombstone) is
// deleted when a client names the queue, not adopted as a new queue (an
// empty copy is left alone: it may be one being declared again); the
// queue declared again loses its tombstone. A queue the log never knew is
// still adopted (TestAdoption).
func TestDeletedQueueCopyIsNotAdopted(t *testing.T) {
	h := newHarness(t, "", nil)
	ctx := context.Background()
	id := queueID(uniqueName(t, "tombstone"))
	placed := mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit1", Slaves: []mirror.Slave{{Backend: "rabbit3"}}}
	declareCopies(t, placed)
	if _, err := h.engine.Declared(ctx, placed); err != nil {
		t.Fatal(err)
	}
	// Deleted while rabbit3 was down: the master's copy went, rabbit3's
	// stayed, holding messages from before. The record goes first: a
	// master's copy gone while the queue is recorded is a queue that
	// deleted itself, whose slaves the engine deletes too.
	publishPlain(t, "rabbit3", id.Name, 5)
	// The engine may change the record meanwhile (a conditional write
	// then fails): delete whatever version is current.
	testutil.Eventually(t, 2*time.Minute, func() error {
		cur, ok := h.store.Get(id)
		if !ok {
			return fmt.Errorf("%v is not recorded", id)
		}
		return h.store.Delete(ctx, id, cur.Version)
	})
	if _, ok := h.store.Tombstone(id); !ok {
		t.Fatal("no tombstone after the delete")
	}
	deleteOn("rabbit1", id.Name)

	// The slave's trimmer, stopped by the delete, gives back what it held:
	// the copy holds its messages ready, as a broker that was down would.
	// A watcher that counted rabbit3 down and up again on a busy machine
	// buries the copy on its own (backendBack): the state this test wants
	// at its end, reached early.
	testutil.Eventually(t, time.Minute, func() error {
		if n := readyOn(t, "rabbit3", id.Name); n != 5 && n != -1 {
			return fmt.Errorf("rabbit3's copy has %d ready, want the 5 its trimmer held given back", n)
		}
		return nil
	})

	// An empty copy too (it may be one a client is declaring again).
	declareOn(t, "rabbit2", id.Name, true)

	got, ok, err := h.engine.Resolve(ctx, id)
	if err != nil || ok {
		t.Fatalf("Resolve of a deleted queue = %+v, %v, %v; want not found", got, ok, err)
	}
	if n := readyOn(t, "rabbit3", id.Name); n != -1 {
		t.Errorf("rabbit3 still has the deleted queue's copy (%d ready), want it deleted", n)
	}
	if n := readyOn(t, "rabbit2", id.Name); n != 0 {
		t.Errorf("rabbit2's empty copy: %d ready (-1: gone), want it left as it was", n)
	}
	if _, ok := h.store.Get(id); ok {
		t.Error("the deleted queue is recorded again")
	}

	again, err := h.engine.Declared(ctx, mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit2"})
	if err != nil {
		t.Fatal(err)
	}
	if ts, ok := h.store.Tombstone(id); ok {
		t.Errorf("tombstone %+v kept after the queue was declared again (%+v)", ts, again)
	}
}

// TestPausedEngineRecordsNoLoss: while its proxy is paused in a partition's
// minority, the engine records no backend loss, serf's verdict included:
// the master stays where it is, and for ResumeSettle (5 s) after the proxy
// serves again too. Then a backend still down is recorded lost.
func TestPausedEngineRecordsNoLoss(t *testing.T) {
	h := newHarness(t, "", nil)
	ctx := context.Background()
	id := queueID(uniqueName(t, "paused"))
	placed := mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit2",
		Slaves: []mirror.Slave{{Backend: "rabbit3", Synchronised: true}, {Backend: "rabbit1", Synchronised: true}}}
	declareCopies(t, placed)
	if _, err := h.engine.Declared(ctx, placed); err != nil {
		t.Fatal(err)
	}

	unchanged := func(step string, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			if m, ok := h.store.Get(id); !ok || m.Master != "rabbit2" || m.Epoch != 0 || !m.Holds("rabbit2") {
				t.Fatalf("%s, the loss of rabbit2 was recorded: master %s, epoch %d, slaves %+v; want it left to the majority", step, m.Master, m.Epoch, m.Slaves)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	h.engine.Member().SetPaused(true)
	h.engine.Member().MemberFailed("rabbit2")
	// Long enough for the event and a retry of it (one second later).
	unchanged("paused", 2500*time.Millisecond)

	resumed := time.Now()
	h.engine.Member().SetPaused(false)
	unchanged("just after serving again", 3*time.Second)
	expectMeta(t, h.store, id, func(m mirror.QueueMeta, ok bool) error {
		if m.Master != "rabbit3" || m.Epoch != 1 {
			return fmt.Errorf("master %s, epoch %d; want rabbit3, epoch 1, once serving again", m.Master, m.Epoch)
		}
		return nil
	})
	if after := time.Since(resumed); after < 5*time.Second {
		t.Errorf("promoted %v after serving again, want no sooner than ResumeSettle (5s)", after)
	}
}

// TestMissedWhileCountedDownWaitsForTheBackend: a publish the proxy could not
// send to a slave because it counted the slave's backend down is reported
// (Missed) while the backend is down; the report waits for the backend, and
// once it is up again with its slave still synchronised in the log (a loss
// this proxy did not record: it was paused in a minority, as in the
// partition test in CI), the slave rejoins unsynchronised instead of
// staying synchronised without those publishes. The engine is rabbit1's
// proxy in a cluster: the slave on rabbit3 is another proxy's to trim, so
// rabbit3's coming back does not make it rejoin here.
func TestMissedWhileCountedDownWaitsForTheBackend(t *testing.T) {
	h := newHarnessWith(t, "", nil, func(o *Options) { o.Node, o.Peers = "rabbit1", noPeers{} })
	// Manual sync, so that the rejoined slave stays unsynchronised.
	setPolicy(t, h.policies, "missed-down", "^missed-down-", `{"ha-mode": "all"}`)
	ctx := context.Background()
	id := queueID(uniqueName(t, "missed-down"))
	placed := mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit1",
		Slaves: []mirror.Slave{{Backend: "rabbit3", Synchronised: true}, {Backend: "rabbit2", Synchronised: true}}}
	declareCopies(t, placed)
	if _, err := h.engine.Declared(ctx, placed); err != nil {
		t.Fatal(err)
	}
	synchronised := func(m mirror.QueueMeta) bool {
		i := m.SlaveIndex("rabbit3")
		return i >= 0 && m.Slaves[i].Synchronised
	}

	h.engine.Member().SetPaused(true)
	h.engine.Member().MemberFailed("rabbit3")
	h.engine.Missed("rabbit3", &id)
	time.Sleep(time.Second) // five rounds of the background loop
	if m, _ := h.store.Get(id); !synchronised(m) {
		t.Fatalf("slaves %+v while rabbit3 is down and the engine paused; want rabbit3 still a synchronised slave", m.Slaves)
	}

	h.engine.Member().MemberAlive("rabbit3")
	h.engine.Member().SetPaused(false)
	expectMeta(t, h.store, id, func(m mirror.QueueMeta, ok bool) error {
		if !ok || m.SlaveIndex("rabbit3") < 0 || synchronised(m) {
			return fmt.Errorf("slaves %+v; want rabbit3 an unsynchronised slave once it is up again", m.Slaves)
		}
		return nil
	})
}
