package engine

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestWithoutDeath: a copy a slave's broker dropped goes back without what
// that drop added to its headers, and with what earlier dead-letterings
// wrote.
func TestWithoutDeath(t *testing.T) {
	at := time.Unix(1700000000, 0)
	drop := amqp.Table{"queue": "orders", "reason": "maxlen", "count": int64(1), "time": at}
	earlier := amqp.Table{"queue": "inbox", "reason": "rejected", "count": int64(1), "time": at}
	first := amqp.Table{"x-first-death-queue": "orders", "x-first-death-reason": "maxlen", "x-first-death-exchange": ""}
	tests := []struct {
		name          string
		headers, want amqp.Table
	}{
		{name: "its only death", headers: withHeaders(first, amqp.Table{"app": "a", "x-death": []any{drop}}), want: amqp.Table{"app": "a"}},
		{name: "after an earlier death",
			headers: amqp.Table{"x-death": []any{drop, earlier}, "x-first-death-queue": "inbox"},
			want:    amqp.Table{"x-death": []any{earlier}, "x-first-death-queue": "inbox"}},
		{name: "dropped before: one count less",
			headers: amqp.Table{"x-death": []any{withHeaders(drop, amqp.Table{"count": int64(3)})}},
			want:    amqp.Table{"x-death": []any{withHeaders(drop, amqp.Table{"count": int64(2)})}}},
		{name: "another queue's death first: unchanged",
			headers: amqp.Table{"x-death": []any{earlier}}, want: amqp.Table{"x-death": []any{earlier}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := withHeaders(tt.headers, nil)
			if got := withoutDeath(tt.headers, "orders", "maxlen"); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("withoutDeath =\n%v\nwant\n%v", got, tt.want)
			}
			if !reflect.DeepEqual(tt.headers, before) {
				t.Errorf("withoutDeath changed its argument: %v, was %v", tt.headers, before)
			}
			queue, reason, when, ok := firstDeath(tt.headers)
			if !ok || queue == "" || reason == "" || !when.Equal(at) {
				t.Errorf("firstDeath = %q, %q, %v, %v", queue, reason, when, ok)
			}
		})
	}
	if _, _, _, ok := firstDeath(amqp.Table{"app": "a"}); ok {
		t.Error("firstDeath found a death in headers without x-death")
	}
}

// withHeaders returns a copy of a with b's keys set.
func withHeaders(a, b amqp.Table) amqp.Table {
	out := amqp.Table{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// TestDeadLettersForwarded: what the copies of a queue that drops its head
// dead-letter into the proxy's exchange goes where a mirrored queue's
// dead-letters belong. A drop by the master leaves the slave and reaches
// the target on every backend; a drop by a slave's broker goes back into
// the slave; a rejection reaches the target on its own backend only, whose
// other copies are rejected by their own brokers.
func TestDeadLettersForwarded(t *testing.T) {
	h := newHarness(t, "", nil)
	setPolicy(t, h.policies, "forwarded", "^forwarded-", `{"ha-mode": "nodes", "ha-params": ["rabbit1", "rabbit2"]}`)
	name := uniqueName(t, "forwarded")
	target := name + "-target"
	arguments, err := frames.AppendTable(nil, frames.Table{
		{Key: "x-max-length", Value: int32(5)},
		{Key: "x-dead-letter-exchange", Value: ""},
		{Key: "x-dead-letter-routing-key", Value: target},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := mirror.QueueMeta{ID: queueID(name), Durable: true, Arguments: arguments, ForwardsDeadLetters: true, Master: "rabbit1",
		Slaves: []mirror.Slave{{Backend: "rabbit2", Synchronised: true}}}
	for _, b := range m.Backends() {
		if err := h.engine.operator.declareCopy(b, m); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteOn(b, name) })
		declareOn(t, b, target, true)
	}
	if _, err := h.engine.Declared(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	publishTo(t, name, 0, 2, "rabbit2")
	expectHeld(t, h.engine, m.ID, 2, "rabbit2")

	// deadLetterAt puts message n into the dead-letter queue on conn's
	// broker, as the broker dead-letters it from the queue for reason at
	// the time given.
	deadLetterAt := func(conn *amqp.Connection, n int, reason, userID string, at time.Time) {
		t.Helper()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		id := messageID(n)
		death := amqp.Table{"count": int64(1), "reason": reason, "queue": name, "exchange": "", "routing-keys": []any{name}, "time": at}
		err = ch.Publish("", mirror.DeadLetterExchange, false, false, amqp.Publishing{
			Headers: amqp.Table{mirror.IdentityHeader: string(id[:]), "x-death": []any{death},
				"x-first-death-queue": name, "x-first-death-reason": reason, "x-first-death-exchange": ""},
			UserId: userID,
			Body:   fmt.Append(nil, "message ", n),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	deadLetterAs := func(conn *amqp.Connection, n int, reason, userID string) {
		t.Helper()
		deadLetterAt(conn, n, reason, userID, time.Now())
	}
	deadLetter := func(backend string, n int, reason string) {
		t.Helper()
		deadLetterAs(dial(t, backend), n, reason, "")
	}
	expectTarget := func(want map[string]int) {
		t.Helper()
		testutil.Eventually(t, time.Minute, func() error {
			for b, n := range want {
				if got := readyOn(t, b, target); got != n {
					return fmt.Errorf("the target on %s holds %d messages, want %d", b, got, n)
				}
			}
			return nil
		})
	}

	deadLetter("rabbit1", 0, "maxlen")
	expectHeld(t, h.engine, m.ID, 1, "rabbit2")
	expectTarget(map[string]int{"rabbit1": 1, "rabbit2": 1})

	deadLetter("rabbit2", 2, "maxlen")
	expectHeld(t, h.engine, m.ID, 2, "rabbit2")

	// Once the copy on rabbit2 rejoins purged, what its broker dropped
	// before was dropped as the queue's master, before a promotion: it
	// stays out of the copy. What it drops after goes back, as above.
	h.engine.failover.rejoins.note(m.ID, "rabbit2", time.Now())
	deadLetterAt(dial(t, "rabbit2"), 5, "maxlen", "", time.Now().Add(-5*time.Second))
	deadLetterAt(dial(t, "rabbit2"), 6, "maxlen", "", time.Now().Add(2*time.Second))
	expectHeld(t, h.engine, m.ID, 3, "rabbit2")
	if tr := h.engine.trimmers.get(m.ID, "rabbit2"); tr == nil || tr.t.Holds(messageID(5)) || !tr.t.Holds(messageID(6)) {
		t.Errorf("after the rejoin, the copy on rabbit2 holds the stale drop (message 5), or not the later one (message 6)")
	}

	deadLetter("rabbit2", 1, "rejected")
	expectTarget(map[string]int{"rabbit1": 1, "rabbit2": 2})

	// A message published by another user carries its user_id, which the
	// proxy's account (no impersonator tag) may not publish: it goes on
	// without it, and the messages behind it are not held up.
	user := name
	node := brokers.Node("rabbit2")
	for _, args := range [][]string{{"add_user", user, "secret"}, {"set_permissions", "-p", "/", user, ".*", ".*", ".*"}} {
		if out, err := node.Ctl(context.Background(), args...); err != nil {
			t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
		}
	}
	t.Cleanup(func() { node.Ctl(context.Background(), "delete_user", user) })
	as, err := url.Parse(node.URL())
	if err != nil {
		t.Fatal(err)
	}
	as.User = url.UserPassword(user, "secret")
	conn, err := amqp.Dial(as.String())
	if err != nil {
		t.Fatalf("connecting as %s: %v", user, err)
	}
	defer conn.Close()
	deadLetterAs(conn, 3, "rejected", user)
	deadLetter("rabbit2", 4, "rejected")
	expectTarget(map[string]int{"rabbit1": 1, "rabbit2": 4})
	for _, b := range m.Backends() {
		if got := readyOn(t, b, mirror.DeadLetterExchange); got != 0 {
			t.Errorf("the dead-letter queue on %s holds %d messages, want 0", b, got)
		}
	}
}
