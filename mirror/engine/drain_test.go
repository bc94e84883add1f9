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

// TestDrain: draining rabbit3 promotes the oldest synchronised slave of a
// queue mastered there (epoch +1, its trimmer gives the messages back),
// leaves a queue whose only slave is unsynchronised on its master
// (ha-promote-on-shutdown when-synced, the default), drops rabbit3's
// slaves and deletes their copies, and places nothing there until
// undrain, after which ha-mode all mirrors to it again.
func TestDrain(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "drain-all", "^drain-all-", `{"ha-mode": "all", "ha-sync-mode": "automatic"}`)
	setPolicy(t, h.policies, "drain-kept", "^drain-kept-", `{"ha-mode": "exactly", "ha-params": 2}`)
	setPolicy(t, h.policies, "drain-always", "^drain-always-", `{"ha-mode": "exactly", "ha-params": 2, "ha-promote-on-shutdown": "always"}`)
	ctx := context.Background()

	moved := mirror.QueueMeta{ID: queueID(uniqueName(t, "drain-all-moved")), Durable: true, Master: "rabbit3",
		Slaves: []mirror.Slave{{Backend: "rabbit1", Synchronised: true}, {Backend: "rabbit2", Synchronised: true}}}
	slave := mirror.QueueMeta{ID: queueID(uniqueName(t, "drain-all-slave")), Durable: true, Master: "rabbit1",
		Slaves: []mirror.Slave{{Backend: "rabbit2", Synchronised: true}, {Backend: "rabbit3", Synchronised: true}}}
	kept := mirror.QueueMeta{ID: queueID(uniqueName(t, "drain-kept")), Durable: true, Master: "rabbit3",
		Slaves: []mirror.Slave{{Backend: "rabbit1"}}}
	always := mirror.QueueMeta{ID: queueID(uniqueName(t, "drain-always")), Durable: true, Master: "rabbit3",
		Slaves: []mirror.Slave{{Backend: "rabbit2"}}}
	for _, m := range []mirror.QueueMeta{moved, slave, kept, always} {
		declareCopies(t, m)
	}
	publishTo(t, moved.ID.Name, 0, 50, moved.Backends()...)
	publishTo(t, slave.ID.Name, 0, 20, slave.Backends()...)
	publishTo(t, kept.ID.Name, 0, 10, "rabbit3") // the slave misses them: never synchronised
	publishTo(t, always.ID.Name, 0, 10, "rabbit3")
	for _, m := range []mirror.QueueMeta{moved, slave, kept, always} {
		if _, err := h.engine.Declared(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	expectHeld(t, h.engine, moved.ID, 50, "rabbit1", "rabbit2")

	report, err := h.engine.Drain(ctx, "rabbit3")
	if err != nil {
		t.Fatal(err)
	}
	want := map[mirror.QueueID]DrainedQueue{
		moved.ID: {ID: moved.ID, Role: RoleMaster, To: "rabbit1", Synchronised: true, Epoch: 1},
		slave.ID: {ID: slave.ID, Role: RoleSlave},
		kept.ID:  {ID: kept.ID, Role: RoleMaster},
		// ha-promote-on-shutdown always: the unsynchronised slave, knowingly.
		always.ID: {ID: always.ID, Role: RoleMaster, To: "rabbit2", Epoch: 1},
	}
	if report.Backend != "rabbit3" || len(report.Queues) != len(want) {
		t.Fatalf("report %+v, want backend rabbit3 and 4 queues", report)
	}
	for _, got := range report.Queues {
		got.Reason = ""
		if got != want[got.ID] {
			t.Errorf("drain reported %+v, want %+v", got, want[got.ID])
		}
	}

	if m, _ := h.store.Get(moved.ID); m.Master != "rabbit1" || m.Epoch != 1 || m.Holds("rabbit3") || !slices.Equal(m.SynchronisedSlaves(), []string{"rabbit2"}) {
		t.Errorf("moved queue: master %s, epoch %d, slaves %+v; want rabbit1, epoch 1, synchronised rabbit2, no rabbit3", m.Master, m.Epoch, m.Slaves)
	}
	if m, _ := h.store.Get(kept.ID); m.Master != "rabbit3" || m.Epoch != 0 {
		t.Errorf("queue without synchronised slave: master %s, epoch %d; want rabbit3, epoch 0 (when-synced)", m.Master, m.Epoch)
	}
	if m, _ := h.store.Get(always.ID); m.Master != "rabbit2" || m.Epoch != 1 || m.Holds("rabbit3") {
		t.Errorf("queue under ha-promote-on-shutdown always: master %s, epoch %d, slaves %+v; want rabbit2, epoch 1, no rabbit3", m.Master, m.Epoch, m.Slaves)
	}
	if m, _ := h.store.Get(slave.ID); !slices.Equal(m.Backends(), []string{"rabbit1", "rabbit2"}) {
		t.Errorf("queue with a slave on rabbit3: copies %v, want [rabbit1 rabbit2]", m.Backends())
	}
	if n := readyOn(t, "rabbit3", slave.ID.Name); n != -1 {
		t.Errorf("the dropped slave's copy on rabbit3 has %d messages, want it deleted", n)
	}
	testutil.Eventually(t, time.Minute, func() error {
		if n := readyOn(t, "rabbit1", moved.ID.Name); n != 50 {
			return fmt.Errorf("the new master has %d ready messages, want 50 (its trimmer gave them back)", n)
		}
		return nil
	})

	// Nothing goes to rabbit3 while it is drained: not the ha-mode all
	// slaves a reconcile adds, not a new queue's master or slaves.
	h.engine.reconciler.all()
	for _, id := range []mirror.QueueID{moved.ID, slave.ID} {
		if m, _ := h.store.Get(id); m.Holds("rabbit3") {
			t.Errorf("%v: after a reconcile its copies are %v; want none on drained rabbit3", id, m.Backends())
		}
	}
	for range 10 { // min-masters would put some on rabbit3, which masters the fewest
		placed, err := h.engine.Place(ctx, mirror.QueueMeta{ID: queueID(uniqueName(t, "drain-all-new"))}, "")
		if err != nil {
			t.Fatal(err)
		}
		if placed.Holds("rabbit3") {
			t.Fatalf("a new queue is placed on %v; want nothing on drained rabbit3", placed.Backends())
		}
	}
	if got := h.engine.Drained(); !slices.Equal(got, []string{"rabbit3"}) {
		t.Errorf("Drained() = %v, want [rabbit3]", got)
	}

	if err := h.engine.Undrain(ctx, "rabbit3"); err != nil {
		t.Fatal(err)
	}
	back := expectMeta(t, h.store, moved.ID, synchronisedSlaves(2))
	if got := back.Backends(); !slices.Equal(got, []string{"rabbit1", "rabbit2", "rabbit3"}) {
		t.Errorf("after undrain the copies are %v, want [rabbit1 rabbit2 rabbit3] (rabbit3 the youngest slave)", got)
	}
	if len(h.engine.Drained()) != 0 {
		t.Errorf("after undrain Drained() = %v, want none", h.engine.Drained())
	}
}

func TestDrainUnknownBackend(t *testing.T) {
	h := newHarness(t, "", nil)
	ctx := context.Background()
	if _, err := h.engine.Drain(ctx, "rabbit9"); !errors.Is(err, ErrUnknownBackend) {
		t.Errorf("Drain(rabbit9) = %v, want ErrUnknownBackend", err)
	}
	if err := h.engine.Undrain(ctx, "rabbit9"); !errors.Is(err, ErrUnknownBackend) {
		t.Errorf("Undrain(rabbit9) = %v, want ErrUnknownBackend", err)
	}
	if got := h.engine.Drained(); len(got) != 0 {
		t.Errorf("Drained() = %v after refusing an unknown backend, want none", got)
	}
}
