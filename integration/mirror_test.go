package integration

// Acceptance tests of mirrored queues (issue 7), end to end: `amqp-mirror serve` in front of
// the three shared nodes, real clients through it, and every broker asked directly what it
// holds. This file: placement by policy, the ha-all data path, and a proxy restart.
// mirror_sync_test.go: synchronisation and adoption. mirror_clients_test.go: what clients
// see (multiple acks across masters, properties, priorities, dead-lettering).

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestMirrorAllPublishConsumeTrim: with ha-mode all, every confirmed message is on all three
// brokers, and a message acked through the proxy leaves all three.
func TestMirrorAllPublishConsumeTrim(t *testing.T) {
	const published, consumed = 10_000, 6_000
	queue := queueName(t)
	p := startMirrorProxy(t, "")
	setPolicy(t, p, "ha-all", exactly(queue), `{"ha-mode":"all"}`)
	conn := dialURL(t, p.url("guest", "guest"))
	declareMirrored(t, p, conn, queue, true, nil)

	body := bytes.Repeat([]byte{'m'}, 1024)
	start := time.Now()
	publishConfirmed(t, conn, queue, published, func(int) amqp.Publishing {
		return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body}
	})
	t.Logf("%d persistent 1 KiB messages published with confirms through the proxy in %v (%.0f msg/s)",
		published, time.Since(start).Round(time.Millisecond), published/time.Since(start).Seconds())

	// A confirm promises the master and every synchronised slave hold the message; a new
	// queue's slaves are synchronised from the start.
	backends := mirrorBackends()
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(published, backends...)})
	row, err := queueStatus(t, p, queue)
	if err != nil {
		t.Fatal(err)
	}
	if got := row.copies(); !sameSet(got, backends) || !sameSet(row.SynchronisedSlaves, row.Slaves) {
		t.Errorf("ctl list_queues: got %v, want copies on %v, every slave synchronised", row, backends)
	}

	start = time.Now()
	consumeAcked(t, conn, queue, consumed)
	t.Logf("%d messages consumed and acked through the proxy in %v", consumed, time.Since(start).Round(time.Millisecond))
	// Trimming the slaves is asynchronous and batched.
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(published-consumed, backends...)})
}

// sameSet reports whether a and b hold the same names, ignoring order.
func sameSet(a, b []string) bool {
	return reflect.DeepEqual(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// TestMirrorPolicyPlacement: ha-mode exactly and nodes put copies exactly where they say, on
// the brokers and in ctl list_queues; clearing the policy leaves the master alone.
func TestMirrorPolicyPlacement(t *testing.T) {
	t.Parallel()
	backends := mirrorBackends()
	cases := []struct {
		name       string
		definition string
		copies     int      // how many brokers hold the queue
		within     []string // the brokers it may be on; nil: any
	}{
		{name: "exactly 2", definition: `{"ha-mode":"exactly","ha-params":2}`, copies: 2},
		{name: "exactly above the backend count means all", definition: `{"ha-mode":"exactly","ha-params":5}`, copies: 3},
		{name: "nodes first and third", definition: fmt.Sprintf(`{"ha-mode":"nodes","ha-params":[%q,%q]}`, backends[0], backends[2]),
			copies: 2, within: []string{backends[0], backends[2]}},
		{name: "nodes ignores unknown names", definition: fmt.Sprintf(`{"ha-mode":"nodes","ha-params":[%q,"no-such-backend"]}`, backends[1]),
			copies: 1, within: []string{backends[1]}},
	}
	p := startMirrorProxy(t, "")
	conn := dialURL(t, p.url("guest", "guest"))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const messages = 3
			queue := queueName(t)
			policy := fmt.Sprintf("placement-%d", i)
			setPolicy(t, p, policy, exactly(queue), c.definition)
			declareMirrored(t, p, conn, queue, true, nil)
			publishConfirmed(t, conn, queue, messages, func(i int) amqp.Publishing {
				return amqp.Publishing{Body: fmt.Appendf(nil, "message %d", i)}
			})

			// Where the brokers hold it, and that list_queues says the same.
			var row queueRow
			awaitCondition(t, 30*time.Second, func() error {
				var err error
				if row, err = queueStatus(t, p, queue); err != nil {
					return err
				}
				copies := row.copies()
				switch {
				case len(copies) != c.copies:
					return fmt.Errorf("ctl list_queues: %v; want %d copies", row, c.copies)
				case c.within != nil && !sameSet(copies, c.within):
					return fmt.Errorf("ctl list_queues: %v; want copies on %v", row, c.within)
				case !sameSet(row.SynchronisedSlaves, row.Slaves):
					return fmt.Errorf("ctl list_queues: %v; want every slave of a queue placed empty synchronised", row)
				case row.Policy != policy:
					return fmt.Errorf("ctl list_queues: %v; want policy %q", row, policy)
				}
				return nil
			})
			awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(messages, row.copies()...)})

			// Without a policy a queue lives on one backend: its master.
			p.ctl(t, "clear_policy", policy).check(t, 0, nil, nil, nil)
			awaitCondition(t, 30*time.Second, func() error {
				after, err := queueStatus(t, p, queue)
				if err != nil {
					return err
				}
				if after.Master != row.Master || len(after.Slaves) != 0 || after.Policy != "" {
					return fmt.Errorf("ctl list_queues after clear_policy: %v; want master %s alone, no policy", after, row.Master)
				}
				return nil
			})
			awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(messages, row.Master)})
		})
	}
}

// TestMirrorRestartKeepsQueues: a proxy stopped with SIGTERM and served again with the same
// state_dir lists every queue with the same master, slaves and messages, and the brokers
// hold the same copies.
func TestMirrorRestartKeepsQueues(t *testing.T) {
	t.Parallel()
	prefix := queueName(t)
	queues := []string{prefix + "-all", prefix + "-two", prefix + "-one"}
	policies := fmt.Sprintf(`policies:
  - {name: restart-all, pattern: %q, apply-to: queues, definition: {ha-mode: all}}
  - {name: restart-two, pattern: %q, apply-to: queues, definition: {ha-mode: exactly, ha-params: 2}}
`, exactly(queues[0]), exactly(queues[1]))
	first := startMirrorProxy(t, policies)
	conn := dialURL(t, first.url("guest", "guest"))
	for i, q := range queues {
		declareMirrored(t, first, conn, q, true, nil)
		publishConfirmed(t, conn, q, 10*(i+1), func(i int) amqp.Publishing {
			return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "message %d", i)}
		})
	}
	awaitCondition(t, 30*time.Second, func() error {
		rows, err := listQueues(t, first)
		if err != nil {
			return err
		}
		for i, q := range queues {
			if got, want := len(rows[q].copies()), 3-i; got != want || rows[q].Messages != 10*(i+1) {
				return fmt.Errorf("ctl list_queues: %v; want %d copies, %d messages", rows[q], want, 10*(i+1))
			}
		}
		return nil
	})
	before, err := listQueues(t, first)
	if err != nil {
		t.Fatal(err)
	}
	heldBefore, err := brokerMessages(t.Context(), queues...)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()

	if code, took := first.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("amqp-mirror serve exited with %d after SIGTERM (%v)", code, took)
	}
	second := first.binary.serve(t, first.configPath, nil)
	after, err := listQueues(t, second)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queues {
		if !reflect.DeepEqual(after[q], before[q]) {
			t.Errorf("ctl list_queues after the restart:\n got %v\nwant %v", after[q], before[q])
		}
		deleteThroughProxy(t, second, q)
	}
	// The slaves' trimmers held their messages unacknowledged; the brokers requeued them
	// when the first proxy's connections closed.
	awaitHeld(t, 30*time.Second, heldBefore)

	// The restarted proxy serves the queues: every message of the ha-all queue comes once.
	conn = dialURL(t, second.url("guest", "guest"))
	deliveries := consumeAcked(t, conn, queues[0], 10)
	seen := map[int]bool{}
	for _, d := range deliveries {
		seen[bodyIndex(t, d.Body)] = true
	}
	if len(seen) != 10 {
		t.Errorf("consumed %d distinct messages of 10 after the restart", len(seen))
	}
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queues[0]: onEvery(0, mirrorBackends()...)})
}
