package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestSettlesWaitForTheTrimmer: settles that come while a slave copy has
// no trimmer running (a new queue's record not seen yet by the loop, or a
// trimmer replaced on a new connection) wait for the trimmer that starts
// next, which trims those messages as soon as it holds them; without
// that, acked messages stayed on the slave and came back after a
// promotion.
func TestSettlesWaitForTheTrimmer(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "ha-all", "^early-", `{"ha-mode": "all"}`)
	id := queueID(uniqueName(t, "early"))
	placed := mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit1",
		Slaves: []mirror.Slave{{Backend: "rabbit2", Synchronised: true}, {Backend: "rabbit3", Synchronised: true}}}
	declareCopies(t, placed)
	m, err := h.engine.Declared(context.Background(), placed)
	if err != nil {
		t.Fatal(err)
	}
	const count = 20
	publishTo(t, id.Name, 0, count, m.Backends()...)
	expectHeld(t, h.engine, id, count, "rabbit2", "rabbit3")

	// The clients' acks at the master, collected before the engine hears
	// of any.
	ch, err := dial(t, m.Master).Channel()
	if err != nil {
		t.Fatal(err)
	}
	var ids []mirror.MessageID
	for range count {
		d, ok, err := ch.Get(id.Name, false)
		if err != nil || !ok {
			t.Fatalf("basic.get from the master: ok %v, err %v", ok, err)
		}
		value, _ := d.Headers[mirror.IdentityHeader].(string)
		mid, _ := mirror.ParseMessageID(value)
		ids = append(ids, mid)
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}

	h.engine.trimmers.stop(id, "rabbit3")
	h.engine.Settle(id, ids, mirror.Acked)
	if n := held(h.engine, id, "rabbit3"); n != -1 {
		t.Logf("rabbit3's trimmer restarted before the settles (holds %d): this run does not test the wait", n)
	}
	expectHeld(t, h.engine, id, 0, "rabbit2", "rabbit3")
	for _, b := range m.Backends() {
		if n := readyOn(t, b, id.Name); n != 0 {
			t.Errorf("%s's copy holds %d ready messages after every message was acked, want 0", b, n)
		}
	}
}

// TestTrimmerStartsWithTheRecord: a slave copy recorded by another proxy (a write
// this proxy's metadata log applies) gets its trimmer at once, not at the loop's
// next round: the master's clients settle from the first message on, and a
// promotion before the trimmer starts drops the settles that wait for it, so that
// acked messages come back. The loop's Interval here is an hour.
func TestTrimmerStartsWithTheRecord(t *testing.T) {
	h := newHarnessWith(t, "", nil, func(o *Options) {
		o.Node, o.Peers, o.Interval = "rabbit2", noPeers{}, time.Hour
	})
	setPolicy(t, h.policies, "ha-all", "^recorded-", `{"ha-mode": "all"}`)
	id := queueID(uniqueName(t, "recorded"))
	placed := mirror.QueueMeta{ID: id, Durable: true, Master: "rabbit1",
		Slaves: []mirror.Slave{{Backend: "rabbit2", Synchronised: true}, {Backend: "rabbit3", Synchronised: true}}}
	declareCopies(t, placed)
	if _, err := h.store.Put(context.Background(), placed, 0); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if held(h.engine, id, "rabbit2") < 0 {
			return fmt.Errorf("no trimmer for this proxy's slave copy on rabbit2")
		}
		return nil
	})
}
