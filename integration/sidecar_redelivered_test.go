package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// TestSidecarRedeliveredAcrossProxies: a message a client received through one proxy
// of a sidecar cluster comes back with redelivered set when, after a promotion, the
// new master delivers it through another proxy, as RabbitMQ flags everything a
// promoted mirror gives again. A promoted slave's broker flags only what its trimmer
// held; here a client of the slaves' brokers themselves holds an exclusive consumer
// on each slave copy, so that no trimmer holds anything, as when a promotion comes
// before a new slave's trimmer has started. A consumer through proxy 2 receives every
// message and goes away; rabbit1's broker, the master's, dies; a client through proxy
// 3 then gets them from the new master: every one must be flagged, and a message
// published after the promotion must not be.
func TestSidecarRedeliveredAcrossProxies(t *testing.T) {
	const messages, fresh = 200, 10
	restoreClusterOnCleanup(t)
	nodes := startKillSidecars(t, "^flag_across_")
	rabbit1, rabbit2, rabbit3 := nodes.brokers[0], nodes.brokers[1], nodes.brokers[2]

	// A new queue's slaves are synchronised from the start, and their trimmers start
	// once the proxies' metadata logs record them, tens of milliseconds after the
	// copies exist; a client of rabbit2 and rabbit3 themselves takes an exclusive
	// consumer on each copy the moment it exists. Should a trimmer come first, a new
	// queue is tried.
	var queue string
	var blockers []*amqp.Connection
	for attempt := 1; blockers == nil; attempt++ {
		if attempt > 10 {
			t.Fatal("the trimmers consumed first ten times")
		}
		queue = fmt.Sprintf("flag_across_%d", attempt)
		name := queue
		t.Cleanup(func() { removeLeftovers(t, name) })
		pending := []<-chan blocked{blockAtBirth(t, rabbit2, queue), blockAtBirth(t, rabbit3, queue)}
		declareSidecarQueues(t, nodes, []string{queue}) // through proxy 1: mastered on rabbit1
		var got []*amqp.Connection
		for _, p := range pending {
			b := <-p
			if b.err != nil {
				t.Logf("%s: %v", queue, b.err)
				continue
			}
			got = append(got, b.conn)
		}
		if len(got) == len(pending) {
			blockers = got
		}
	}

	first, err := nodes.connect(0)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	publishConfirmed(t, first, queue, messages, named("held"))

	holder, err := nodes.connect(1)
	if err != nil {
		t.Fatal(err)
	}
	ch := openChannel(t, holder)
	if err := ch.Qos(messages, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "holder", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range messages {
		select {
		case <-deliveries:
		case <-time.After(30 * time.Second):
			t.Fatalf("the consumer through proxy 2 received %d of the %d messages", i, messages)
		}
	}
	holder.Close() // the messages go back to the master, delivered once

	killNode(t, rabbit1)
	var promoted string
	awaitCondition(t, 60*time.Second, func() error {
		row, err := queueStatus(t, nodes.proxy(2), queue)
		if err != nil {
			return err
		}
		if row.Master == rabbit1.Name || row.Master == "" {
			return fmt.Errorf("%v: want it mastered on a slave", row)
		}
		promoted = row.Master
		return nil
	})
	// The test's premise: the new master handed none of the queue to its trimmer.
	for _, n := range []*localbroker.Node{rabbit2, rabbit3} {
		if n.Name != promoted {
			continue
		}
		ready, err := readyOn(n, queue)
		if err != nil {
			t.Fatal(err)
		}
		if ready < messages-1 {
			t.Fatalf("%s holds %d of the %d messages ready: its trimmer held the rest, and nothing tests the proxies' flags", n.Name, ready, messages)
		}
	}
	for _, c := range blockers {
		c.Close()
	}

	// Proxy 3 never delivered these messages: what it flags it learns from proxy 2.
	second, err := nodes.connect(2)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	getter := openChannel(t, second)
	taken := 0
	var unflagged, freshSeen []string
	take := func() (bool, error) {
		d, ok, err := getter.Get(queue, true)
		if err != nil || !ok {
			return false, err
		}
		switch body := string(d.Body); {
		case strings.HasPrefix(body, "fresh-") && d.Redelivered:
			freshSeen = append(freshSeen, body+" (flagged)")
		case strings.HasPrefix(body, "fresh-"):
			freshSeen = append(freshSeen, body)
		default:
			taken++
			if !d.Redelivered {
				unflagged = append(unflagged, body)
			}
		}
		return true, nil
	}
	awaitCondition(t, 30*time.Second, func() error {
		if ok, err := take(); err != nil || !ok {
			return fmt.Errorf("a get from the new master on %s: %v, %v", promoted, ok, err)
		}
		return nil
	})
	// The rest come after proxy 3 had time to ask the other proxies.
	time.Sleep(3 * time.Second)
	publishConfirmed(t, second, queue, fresh, named("fresh"))
	awaitCondition(t, 60*time.Second, func() error {
		for {
			ok, err := take()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
		}
		if taken < messages || len(freshSeen) < fresh {
			return fmt.Errorf("got %d of the %d old messages and %d of the %d fresh ones", taken, messages, len(freshSeen), fresh)
		}
		return nil
	})
	if len(unflagged) > 0 {
		t.Errorf("%d of the %d messages delivered through proxy 2 came back through proxy 3 without redelivered, e.g. %v",
			len(unflagged), messages, unflagged[:min(5, len(unflagged))])
	}
	for _, f := range freshSeen {
		if strings.HasSuffix(f, "(flagged)") {
			t.Errorf("a message published after the promotion and never delivered came flagged redelivered: %s", f)
		}
	}

	restartNode(t, rabbit1)
	nodes.awaitSynchronised(t, 0, []string{queue})
	if err := nodes.deleteQueue(0, queue); err != nil {
		t.Fatal(err)
	}
}

// blocked is how blockAtBirth ended: the connection that holds the exclusive consumer,
// or why there is none.
type blocked struct {
	conn *amqp.Connection
	err  error
}

// blockAtBirth waits, for up to a minute, until queue exists on n, and holds an
// exclusive consumer on it there with a prefetch of one, so that no trimmer can consume
// it: the copy keeps every message ready but one. Closing the connection ends the block
// (a cleanup closes it too). It fails when another consumer came first.
func blockAtBirth(t *testing.T, n *localbroker.Node, queue string) <-chan blocked {
	t.Helper()
	conn, err := amqp.Dial(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	out := make(chan blocked, 1)
	go func() {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			ch, err := conn.Channel()
			if err != nil {
				out <- blocked{err: err}
				return
			}
			if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
				time.Sleep(2 * time.Millisecond) // not there yet: the channel is closed
				continue
			}
			if err := ch.Qos(1, 0, false); err != nil {
				out <- blocked{err: err}
				return
			}
			if _, err := ch.Consume(queue, "blocker", false, true, false, false, nil); err != nil {
				out <- blocked{err: fmt.Errorf("an exclusive consumer on %s: %w", n.Name, err)}
				return
			}
			out <- blocked{conn: conn}
			return
		}
		out <- blocked{err: fmt.Errorf("%s never had the queue", n.Name)}
	}()
	return out
}

// readyOn asks n directly how many messages of queue are ready.
func readyOn(n *localbroker.Node, queue string) (int, error) {
	conn, err := amqp.Dial(n.URL())
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// named returns persistent messages with bodies prefix-0, prefix-1, ...
func named(prefix string) func(i int) amqp.Publishing {
	return func(i int) amqp.Publishing {
		return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "%s-%d", prefix, i)}
	}
}
