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

// Tests against three real RabbitMQ nodes. Each plays the proxy's part
// with direct connections to the brokers: it declares the copies the
// engine placed, publishes to every copy with identities, and tells the
// engine what a client acked at the master.

func slavesOf(m mirror.QueueMeta) []string { return m.Backends()[1:] }

func TestPlaceDeclaredSettleTrimsSlaves(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "ha-all", "^all-", `{"ha-mode": "all"}`)
	ctx := context.Background()
	id := queueID(uniqueName(t, "all-trim"))

	placed, err := h.engine.Place(ctx, mirror.QueueMeta{ID: id, Durable: true}, "")
	if err != nil {
		t.Fatalf("Place: %v", err)
	}
	if len(placed.Slaves) != 2 {
		t.Fatalf("Place under ha-mode all: master %s, slaves %+v; want two slaves", placed.Master, placed.Slaves)
	}
	for _, s := range placed.Slaves {
		if !s.Synchronised {
			t.Errorf("slave on %s of a new queue is not synchronised", s.Backend)
		}
	}
	declareCopies(t, placed)
	recorded, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatalf("Declared: %v", err)
	}
	if got, ok := h.engine.Lookup(id); !ok || got.Master != placed.Master || got.Version != recorded.Version {
		t.Fatalf("Lookup right after Declared = %+v, %v; want the record %+v", got, ok, recorded)
	}
	again, err := h.engine.Declared(ctx, placed)
	if err != nil || again.Version != recorded.Version {
		t.Errorf("Declared of a recorded queue = version %d, %v; want the stored record (version %d)", again.Version, err, recorded.Version)
	}

	publishTo(t, id.Name, 0, 100, recorded.Backends()...)
	expectHeld(t, h.engine, id, 100, slavesOf(recorded)...)
	consumeAndSettle(t, h.engine, recorded, 60)
	expectHeld(t, h.engine, id, 40, slavesOf(recorded)...)

	h.engine.Deleted(ctx, id)
	if _, ok := h.engine.Lookup(id); ok {
		t.Errorf("Lookup finds the queue after Deleted")
	}
	if _, ok := h.store.Get(id); ok {
		t.Errorf("the store keeps the queue after Deleted")
	}
}

func TestPlaceRefusesAnUnknownLocator(t *testing.T) {
	h := newHarness(t, "", nil)
	// A field table {x-queue-master-locator: S"nearest"}, as on the wire.
	args := []byte{0, 0, 0, 0}
	args = append(args, byte(len("x-queue-master-locator")))
	args = append(args, "x-queue-master-locator"...)
	args = append(args, 'S', 0, 0, 0, 7)
	args = append(args, "nearest"...)
	size := len(args) - 4
	args[0], args[1], args[2], args[3] = byte(size>>24), byte(size>>16), byte(size>>8), byte(size)
	_, err := h.engine.Place(context.Background(), mirror.QueueMeta{ID: queueID("q"), Arguments: args}, "")
	if !errors.Is(err, mirror.ErrUnknownLocator) {
		t.Errorf("Place with x-queue-master-locator nearest: err = %v, want ErrUnknownLocator", err)
	}
}

// declareUnmirrored declares a queue that no policy mirrors and records it,
// as the proxy does.
func declareUnmirrored(t *testing.T, h *harness, name string) mirror.QueueMeta {
	t.Helper()
	ctx := context.Background()
	placed, err := h.engine.Place(ctx, mirror.QueueMeta{ID: queueID(name), Durable: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(placed.Slaves) != 0 {
		t.Fatalf("an unmirrored queue was placed with slaves %+v", placed.Slaves)
	}
	declareCopies(t, placed)
	for _, b := range brokers.Nodes() { // the copies the engine adds
		if b.Name != placed.Master {
			t.Cleanup(func() { deleteOn(b.Name, name) })
		}
	}
	m, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func synchronisedSlaves(want int) func(mirror.QueueMeta, bool) error {
	return func(m mirror.QueueMeta, ok bool) error {
		if !ok {
			return errors.New("queue not recorded")
		}
		if len(m.Slaves) != want || len(m.SynchronisedSlaves()) != want {
			return fmt.Errorf("slaves %+v, want %d, all synchronised", m.Slaves, want)
		}
		return nil
	}
}

// TestPolicyAddsSlaves: a policy set on a queue that holds messages adds
// slaves; automatic sync copies the master's messages at once, manual
// waits for SyncQueue; clearing the policy drops the slave copies.
func TestPolicyAddsSlaves(t *testing.T) {
	tests := []struct {
		name       string
		definition string
		slaves     int
		manual     bool
	}{
		{name: "automatic", definition: `{"ha-mode": "all", "ha-sync-mode": "automatic", "ha-sync-batch-size": 64}`, slaves: 2},
		{name: "manual", definition: `{"ha-mode": "exactly", "ha-params": 2}`, slaves: 1, manual: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, "", nil)
			prefix := "sync-" + tt.name
			m := declareUnmirrored(t, h, uniqueName(t, prefix))
			publishTo(t, m.ID.Name, 0, 300, m.Master)
			consumeAndSettle(t, h.engine, m, 20) // some settled before any slave exists

			setPolicy(t, h.policies, "mirror", "^"+prefix, tt.definition)
			if tt.manual {
				unsynced := expectMeta(t, h.store, m.ID, func(m mirror.QueueMeta, ok bool) error {
					if len(m.Slaves) != tt.slaves {
						return fmt.Errorf("slaves %+v, want %d", m.Slaves, tt.slaves)
					}
					return nil
				})
				expectHeld(t, h.engine, m.ID, 0, slavesOf(unsynced)...)
				time.Sleep(time.Second) // several engine rounds: nothing may sync the slave by itself
				if got, _ := h.store.Get(m.ID); len(got.SynchronisedSlaves()) != 0 {
					t.Fatalf("a manual slave became synchronised without sync_queue: %+v", got.Slaves)
				}
				if err := h.engine.SyncQueue(context.Background(), m.ID); err != nil {
					t.Fatalf("SyncQueue: %v", err)
				}
			}
			synced := expectMeta(t, h.store, m.ID, synchronisedSlaves(tt.slaves))
			expectHeld(t, h.engine, m.ID, 280, slavesOf(synced)...)
			// The master's copy-and-requeue left it holding what it held.
			testutil.Eventually(t, time.Minute, func() error {
				if n := readyOn(t, m.Master, m.ID.Name); n != 280 {
					return fmt.Errorf("master has %d ready messages, want 280", n)
				}
				return nil
			})

			// The queue keeps working: settlements trim the new slaves.
			consumeAndSettle(t, h.engine, synced, 80)
			expectHeld(t, h.engine, m.ID, 200, slavesOf(synced)...)

			if err := h.policies.ClearPolicy("/", "mirror"); err != nil {
				t.Fatal(err)
			}
			expectMeta(t, h.store, m.ID, synchronisedSlaves(0))
			testutil.Eventually(t, time.Minute, func() error {
				for _, b := range slavesOf(synced) {
					if n := readyOn(t, b, m.ID.Name); n != -1 {
						return fmt.Errorf("the dropped copy on %s is still there (%d messages)", b, n)
					}
				}
				return nil
			})
			if n := readyOn(t, m.Master, m.ID.Name); n != 200 {
				t.Errorf("after the slaves were dropped the master has %d messages, want 200", n)
			}
		})
	}
}

// TestAdoption: a queue holding messages on one broker before the proxy is
// found by Resolve, mirrored per policy with its messages copied, and
// trimmed by content as its old messages are consumed.
func TestAdoption(t *testing.T) {
	h := newHarness(t, "", nil)
	name := uniqueName(t, "adopt")
	declareOn(t, "rabbit2", name, true)
	for _, b := range []string{"rabbit1", "rabbit3"} {
		t.Cleanup(func() { deleteOn(b, name) })
	}
	publishPlain(t, "rabbit2", name, 1000)

	ctx := context.Background()
	missing := queueID(uniqueName(t, "adopt-missing"))
	if _, ok, err := h.engine.Resolve(ctx, missing); ok || err != nil {
		t.Fatalf("Resolve of a queue no broker has = %v, %v; want false, nil", ok, err)
	}
	m, ok, err := h.engine.Resolve(ctx, queueID(name))
	if err != nil || !ok {
		t.Fatalf("Resolve = %v, %v; want the queue found", ok, err)
	}
	if m.Master != "rabbit2" || len(m.Slaves) != 0 {
		t.Fatalf("adopted as master %s, slaves %+v; want master rabbit2 alone", m.Master, m.Slaves)
	}
	if got, ok := h.engine.Lookup(m.ID); !ok || got.Master != "rabbit2" {
		t.Errorf("Lookup after adoption = %+v, %v", got, ok)
	}

	setPolicy(t, h.policies, "adopt-all", "^adopt-", `{"ha-mode": "all", "ha-sync-mode": "automatic"}`)
	synced := expectMeta(t, h.store, m.ID, synchronisedSlaves(2))
	expectHeld(t, h.engine, m.ID, 1000, slavesOf(synced)...)
	consumeAndSettle(t, h.engine, synced, 1000)
	expectHeld(t, h.engine, m.ID, 0, slavesOf(synced)...)
	if n := readyOn(t, "rabbit2", name); n != 0 {
		t.Errorf("the master has %d messages after all 1000 were consumed, want 0", n)
	}
}

func TestResolveAnExclusiveQueue(t *testing.T) {
	h := newHarness(t, "", nil)
	ch, err := dial(t, "rabbit3").Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, ok, err := h.engine.Resolve(context.Background(), queueID(q.Name))
	if err != nil || !ok || m.Master != "rabbit3" {
		t.Fatalf("Resolve of an exclusive queue on rabbit3 = %+v, %v, %v; want master rabbit3", m, ok, err)
	}
	if _, recorded := h.store.Get(m.ID); recorded {
		t.Errorf("an exclusive queue was recorded")
	}
}

func TestPurgedEmptiesSlaves(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "ha-all", "^purge-", `{"ha-mode": "all"}`)
	ctx := context.Background()
	id := queueID(uniqueName(t, "purge"))
	placed, err := h.engine.Place(ctx, mirror.QueueMeta{ID: id}, "")
	if err != nil {
		t.Fatal(err)
	}
	declareCopies(t, placed)
	m, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	publishTo(t, id.Name, 0, 150, m.Backends()...)
	expectHeld(t, h.engine, id, 150, slavesOf(m)...)
	ch, err := dial(t, m.Master).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueuePurge(id.Name, false); err != nil {
		t.Fatal(err)
	}
	h.engine.Purged(ctx, id)
	for _, b := range slavesOf(m) {
		if n := held(h.engine, id, b); n != 0 {
			t.Errorf("after Purged the slave on %s holds %d messages, want 0", b, n)
		}
		if n := readyOn(t, b, id.Name); n != 0 {
			t.Errorf("after Purged the slave on %s has %d ready messages, want 0", b, n)
		}
	}
	publishTo(t, id.Name, 150, 160, m.Backends()...)
	expectHeld(t, h.engine, id, 10, slavesOf(m)...)
}

// TestRestartKeepsMetadata: a new engine on the same store directory knows
// every queue's master and slaves, and trims the slaves again.
func TestRestartKeepsMetadata(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "ha-two", "^restart-", `{"ha-mode": "exactly", "ha-params": 2}`)
	ctx := context.Background()
	id := queueID(uniqueName(t, "restart"))
	placed, err := h.engine.Place(ctx, mirror.QueueMeta{ID: id, Durable: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	declareCopies(t, placed)
	before, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	publishTo(t, id.Name, 0, 30, before.Backends()...)
	expectHeld(t, h.engine, id, 30, slavesOf(before)...)
	h.close()

	again := newHarness(t, h.dir, h.policies)
	after, ok := again.engine.Lookup(id)
	if !ok || after.Master != before.Master || !slices.Equal(after.Slaves, before.Slaves) {
		t.Fatalf("after a restart Lookup = %+v, %v; want master %s, slaves %+v", after, ok, before.Master, before.Slaves)
	}
	expectHeld(t, again.engine, id, 30, slavesOf(after)...)
	consumeAndSettle(t, again.engine, after, 10)
	expectHeld(t, again.engine, id, 20, slavesOf(after)...)
}

// TestExpiredMasterIsForgotten: a master that deletes itself (x-expires)
// takes its slaves and its record with it; the engine's checks do not keep
// it alive.
func TestExpiredMasterIsForgotten(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "ha-all", "^expires-", `{"ha-mode": "all"}`)
	ctx := context.Background()
	id := queueID(uniqueName(t, "expires"))
	// {x-expires: I 1500}
	args := []byte{0, 0, 0, 0, byte(len("x-expires"))}
	args = append(args, "x-expires"...)
	args = append(args, 'I', 0, 0, 0x05, 0xdc)
	args[3] = byte(len(args) - 4)
	placed, err := h.engine.Place(ctx, mirror.QueueMeta{ID: id, Arguments: args}, "")
	if err != nil {
		t.Fatal(err)
	}
	table, err := amqpTable(args)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range placed.Backends() {
		ch, err := dial(t, b).Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(id.Name, false, false, false, false, table); err != nil {
			t.Fatalf("declaring on %s: %v", b, err)
		}
		t.Cleanup(func() { deleteOn(b, id.Name) })
	}
	m, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	// The slaves' trimmers consume, so only the master expires.
	expectMeta(t, h.store, id, func(_ mirror.QueueMeta, ok bool) error {
		if ok {
			return errors.New("the queue is still recorded")
		}
		return nil
	})
	for _, b := range slavesOf(m) {
		if n := readyOn(t, b, id.Name); n != -1 {
			t.Errorf("the slave copy on %s is still there", b)
		}
	}
}
