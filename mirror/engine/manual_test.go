package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// addManualSlave declares an unmirrored queue holding backlog messages and
// gives it one manual slave by policy; it returns the record with the
// slave, unsynchronised.
func addManualSlave(t *testing.T, h *harness, prefix string, backlog int) mirror.QueueMeta {
	t.Helper()
	m := declareUnmirrored(t, h, uniqueName(t, prefix))
	publishTo(t, m.ID.Name, 0, backlog, m.Master)
	setPolicy(t, h.policies, prefix, "^"+prefix, `{"ha-mode": "exactly", "ha-params": 2}`)
	return expectMeta(t, h.store, m.ID, func(m mirror.QueueMeta, ok bool) error {
		if len(m.Slaves) != 1 || m.Slaves[0].Synchronised {
			return fmt.Errorf("slaves %+v, want one, unsynchronised", m.Slaves)
		}
		return nil
	})
}

// TestManualSlaveCatchesUp: a manual slave that never synced becomes
// synchronised once the master settled the backlog it held at the join,
// although newer messages are still there.
func TestManualSlaveCatchesUp(t *testing.T) {
	h := newHarness(t, "", nil)
	m := addManualSlave(t, h, "catchup", 100)
	slave := m.Slaves[0].Backend
	// Engine rounds see the slave and count its backlog.
	time.Sleep(500 * time.Millisecond)
	publishTo(t, m.ID.Name, 100, 150, m.Backends()...) // reach the slave too
	expectHeld(t, h.engine, m.ID, 50, slave)

	consumeAndSettle(t, h.engine, m, 99)
	time.Sleep(500 * time.Millisecond) // several rounds: one backlog message is left
	if got, _ := h.store.Get(m.ID); len(got.SynchronisedSlaves()) != 0 {
		t.Fatalf("the slave is synchronised with one backlog message left on the master: %+v", got.Slaves)
	}
	consumeAndSettle(t, h.engine, m, 1)
	expectMeta(t, h.store, m.ID, synchronisedSlaves(1))
	if n := readyOn(t, m.Master, m.ID.Name); n != 50 {
		t.Errorf("the master holds %d messages, want the 50 newer ones", n)
	}
	expectHeld(t, h.engine, m.ID, 50, slave)
}

// TestManualSlaveWaitsForWhatClientsHold: a manual slave that joins while a
// client holds every message of the queue unacknowledged is not synchronised
// by the master's empty-looking count (the broker counts only ready
// messages): it lacks those messages, and a promotion would lose them once
// the client gave them back. It is once the client acked them.
func TestManualSlaveWaitsForWhatClientsHold(t *testing.T) {
	h := newHarness(t, "", nil)
	const prefix, count = "clientsheld", 10
	m := declareUnmirrored(t, h, uniqueName(t, prefix))
	publishTo(t, m.ID.Name, 0, count, m.Master)
	ch, err := dial(t, m.Master).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(count, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(m.ID.Name, "holder", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var held []amqp.Delivery
	for range count {
		select {
		case d := <-deliveries:
			held = append(held, d)
		case <-time.After(10 * time.Second):
			t.Fatalf("the consumer received %d of %d messages", len(held), count)
		}
	}
	// What the proxy's clients hold, as the proxy counts it.
	var holding atomic.Int64
	holding.Store(count)
	h.engine.CountUnackedWith(func(string) map[mirror.QueueID]int {
		return map[mirror.QueueID]int{m.ID: int(holding.Load())}
	})

	setPolicy(t, h.policies, prefix, "^"+prefix, `{"ha-mode": "exactly", "ha-params": 2}`)
	expectMeta(t, h.store, m.ID, func(m mirror.QueueMeta, ok bool) error {
		if len(m.Slaves) != 1 || m.Slaves[0].Synchronised {
			return fmt.Errorf("slaves %+v, want one, unsynchronised", m.Slaves)
		}
		return nil
	})
	time.Sleep(time.Second) // five rounds of the background loop
	if got, _ := h.store.Get(m.ID); len(got.SynchronisedSlaves()) != 0 {
		t.Fatalf("the slave is synchronised while a client holds the %d messages it lacks: %+v", count, got.Slaves)
	}

	var ids []mirror.MessageID
	for _, d := range held {
		value, _ := d.Headers[mirror.IdentityHeader].(string)
		id, _ := mirror.ParseMessageID(value)
		ids = append(ids, id)
	}
	if err := held[len(held)-1].Ack(true); err != nil {
		t.Fatal(err)
	}
	holding.Store(0)
	h.engine.Settle(m.ID, ids, mirror.Acked)
	expectMeta(t, h.store, m.ID, synchronisedSlaves(1))
}

// peersCopying are the other proxies of a cluster, one of which copies
// from a queue's master (a sync): Held says the copies it began and ended.
// With churn set, a copy begins and ends between every two questions.
type peersCopying struct {
	noPeers
	name  string
	mu    sync.Mutex
	runs  mirror.CopyRuns
	churn bool
}

func (p *peersCopying) set(runs mirror.CopyRuns, churn bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runs, p.churn = runs, churn
}

func (p *peersCopying) Held(_ context.Context, vhost string) (map[mirror.QueueID]mirror.Held, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.churn {
		p.runs.Began++
		p.runs.Ended++
	}
	return map[mirror.QueueID]mirror.Held{p.queue(vhost): {Copies: p.runs}}, nil
}

func (p *peersCopying) queue(vhost string) mirror.QueueID {
	return mirror.QueueID{VHost: vhost, Name: p.name}
}

// TestManualSlaveWaitsForACopyFromTheMaster: another proxy's copy from the
// master holds the master's messages, so the master looks empty; the
// manual slave beside this proxy lacks them all, and must not be recorded
// synchronised while the copy runs, nor when a copy began or ended while
// this proxy looked at the master. Once the master is empty indeed, it is.
func TestManualSlaveWaitsForACopyFromTheMaster(t *testing.T) {
	const prefix, count = "masterscopy", 10
	name := uniqueName(t, prefix)
	peers := &peersCopying{name: name}
	h := newHarnessWith(t, "", nil, func(o *Options) { o.Node, o.Peers = "rabbit2", peers })
	setPolicy(t, h.policies, prefix, "^"+prefix, `{"ha-mode": "exactly", "ha-params": 2}`)
	placed := mirror.QueueMeta{ID: queueID(name), Durable: true, Master: "rabbit1", Slaves: []mirror.Slave{{Backend: "rabbit2"}}}
	declareCopies(t, placed)
	publishTo(t, name, 0, count, "rabbit1")

	// The copy, as the master sees it: a consumer that holds every message.
	copier, err := dial(t, "rabbit1").Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := copier.Consume(name, "copier", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for n := range count {
		select {
		case <-deliveries:
		case <-time.After(10 * time.Second):
			t.Fatalf("the copy received %d of %d messages", n, count)
		}
	}
	peers.set(mirror.CopyRuns{Began: 1}, false)
	if _, err := h.engine.Declared(context.Background(), placed); err != nil {
		t.Fatal(err)
	}
	stillUnsynchronised := func(while string) {
		t.Helper()
		time.Sleep(time.Second) // five rounds of the background loop
		if got, _ := h.store.Get(placed.ID); len(got.Slaves) != 1 || got.Slaves[0].Synchronised {
			t.Fatalf("%s: slaves %+v; want rabbit2 unsynchronised, lacking the %d messages", while, got.Slaves, count)
		}
	}
	stillUnsynchronised("while another proxy's copy holds the master's messages")

	peers.set(mirror.CopyRuns{Began: 1, Ended: 1}, true)
	stillUnsynchronised("while copies begin and end as the master is looked at")

	// The copy gives the messages back and ends.
	if err := copier.Close(); err != nil {
		t.Fatal(err)
	}
	peers.set(mirror.CopyRuns{Began: 1, Ended: 1}, false)
	stillUnsynchronised("while the master holds the backlog")

	consumeAndSettle(t, h.engine, placed, count)
	expectMeta(t, h.store, placed.ID, synchronisedSlaves(1))
}

// TestCancelSyncQueue: a cancelled sync leaves the slave unsynchronised,
// and list_queues shows the sync while it runs.
func TestCancelSyncQueue(t *testing.T) {
	h := newHarness(t, "", nil)
	const backlog = 20000
	m := addManualSlave(t, h, "cancel", backlog)
	ctx := context.Background()
	if err := h.engine.SyncQueue(ctx, m.ID); err != nil {
		t.Fatalf("SyncQueue: %v", err)
	}
	rows, err := h.engine.ListQueues(ctx, "/", true)
	if err != nil {
		t.Fatal(err)
	}
	var row *mirror.QueueStatus
	for i := range rows {
		if rows[i].Meta.ID == m.ID {
			row = &rows[i]
		}
	}
	if row == nil || len(row.Syncing) != 1 || row.Policy != "cancel" {
		t.Fatalf("list_queues row during the sync = %+v; want the slave syncing under policy cancel", row)
	}
	if err := h.engine.CancelSyncQueue(ctx, m.ID); err != nil {
		t.Fatalf("CancelSyncQueue: %v", err)
	}
	if got, _ := h.engine.syncs.targets(m.ID); len(got) != 0 {
		t.Errorf("after CancelSyncQueue the queue still syncs to %v", got)
	}
	if got, _ := h.store.Get(m.ID); len(got.SynchronisedSlaves()) != 0 {
		t.Errorf("a cancelled sync left the slave synchronised: %+v", got.Slaves)
	}
	// The master gets back what the cancelled copy held.
	testutil.Eventually(t, time.Minute, func() error {
		if n := readyOn(t, m.Master, m.ID.Name); n != backlog {
			return fmt.Errorf("the master has %d ready messages, want %d", n, backlog)
		}
		return nil
	})
	// A sync after the cancelled one starts afresh: what the first copied
	// is not taken for the end of the backlog, nor kept twice.
	if err := h.engine.SyncQueue(ctx, m.ID); err != nil {
		t.Fatalf("SyncQueue after the cancel: %v", err)
	}
	synced := expectMeta(t, h.store, m.ID, synchronisedSlaves(1))
	expectHeld(t, h.engine, m.ID, backlog, slavesOf(synced)...)

	if err := h.engine.SyncQueue(ctx, queueID("no-such-queue")); !errors.Is(err, mirror.ErrQueueNotFound) {
		t.Errorf("SyncQueue of an unknown queue: err = %v, want ErrQueueNotFound", err)
	}
}

// TestBindingsReachNewSlaves: bindings recorded through Bound are made on
// a slave the engine adds later.
func TestBindingsReachNewSlaves(t *testing.T) {
	h := newHarness(t, "", nil)
	ctx := context.Background()
	m := declareUnmirrored(t, h, uniqueName(t, "bound"))
	kept := mirror.Binding{Exchange: "amq.direct", RoutingKey: m.ID.Name}
	gone := mirror.Binding{Exchange: "amq.direct", RoutingKey: m.ID.Name + "-unbound"}
	h.engine.Bound(ctx, m.ID, kept, true)
	h.engine.Bound(ctx, m.ID, gone, true)
	h.engine.Bound(ctx, m.ID, kept, true) // twice is once
	h.engine.Bound(ctx, m.ID, gone, false)
	if got, _ := h.store.Get(m.ID); len(got.Bindings) != 1 || got.Bindings[0].RoutingKey != kept.RoutingKey {
		t.Fatalf("recorded bindings %+v, want only %+v", got.Bindings, kept)
	}

	setPolicy(t, h.policies, "bound", "^bound-", `{"ha-mode": "all"}`)
	withSlaves := expectMeta(t, h.store, m.ID, func(m mirror.QueueMeta, ok bool) error {
		if len(m.Slaves) != 2 {
			return fmt.Errorf("slaves %+v, want 2", m.Slaves)
		}
		return nil
	})
	for _, slave := range slavesOf(withSlaves) {
		ch, err := dial(t, slave).Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{kept.RoutingKey, gone.RoutingKey} {
			c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "amq.direct", key, false, false, publishingWithID(1))
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := c.WaitContext(ctx); !ok || err != nil {
				t.Fatalf("publish to amq.direct on %s not confirmed: %v %v", slave, ok, err)
			}
		}
	}
	// Only the kept binding routes: one message on each slave.
	expectHeld(t, h.engine, m.ID, 1, slavesOf(withSlaves)...)
}

// TestNodesHandOver: ha-mode nodes without the master's backend moves the
// master to its synchronised slave on a named backend (the epoch rises),
// adds the other named backend, and deletes the old master's copy last.
func TestNodesHandOver(t *testing.T) {
	h := newHarness(t, "", nil)
	ctx := context.Background()
	id := queueID(uniqueName(t, "nodes"))
	placed := mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit1", Slaves: []mirror.Slave{{Backend: "rabbit2", Synchronised: true}}}
	declareCopies(t, placed)
	t.Cleanup(func() { deleteOn("rabbit3", id.Name) })
	m, err := h.engine.Declared(ctx, placed)
	if err != nil {
		t.Fatal(err)
	}
	publishTo(t, id.Name, 0, 40, m.Backends()...)
	expectHeld(t, h.engine, id, 40, "rabbit2")

	setPolicy(t, h.policies, "nodes", "^nodes-", `{"ha-mode": "nodes", "ha-params": ["rabbit2", "rabbit3"]}`)
	expectMeta(t, h.store, id, func(m mirror.QueueMeta, ok bool) error {
		if m.Master != "rabbit2" || m.Epoch != 1 || m.Holds("rabbit1") || !m.Holds("rabbit3") {
			return fmt.Errorf("master %s, epoch %d, slaves %+v; want master rabbit2, epoch 1, a slave on rabbit3 and none on rabbit1", m.Master, m.Epoch, m.Slaves)
		}
		return nil
	})
	testutil.Eventually(t, time.Minute, func() error {
		if n := readyOn(t, "rabbit1", id.Name); n != -1 {
			return fmt.Errorf("the old master's copy is still on rabbit1 (%d messages)", n)
		}
		if n := readyOn(t, "rabbit2", id.Name); n != 40 {
			return fmt.Errorf("the new master on rabbit2 has %d ready messages, want 40", n)
		}
		return nil
	})
}
