package integration

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// TestFailoverMasterKilled: with a queue mirrored on the three nodes, its
// master's broker is killed with SIGKILL while a publisher with confirms
// and a consumer with manual acks run through the proxy (amqp091-go, no
// reconnect logic). Neither client notices: the consumer goes on with the
// same consumer tag on the new master, every confirmed message is
// delivered, and every message delivered twice carries redelivered.
func TestFailoverMasterKilled(t *testing.T) {
	testFailoverMasterLost(t, func(n *localbroker.Node) error { return n.Kill() })
}

// TestFailoverMasterStoppedCleanly: the same when the master's broker
// shuts down cleanly (connection.close 320 on every connection), which
// ha-promote-on-shutdown governs (when-synced: the slaves are synchronised).
func TestFailoverMasterStoppedCleanly(t *testing.T) {
	testFailoverMasterLost(t, func(n *localbroker.Node) error { return n.Stop(testContext(t, time.Minute)) })
}

func testFailoverMasterLost(t *testing.T, lose func(*localbroker.Node) error) {
	home := node(t, "rabbit1")
	url, _ := startMirroredProxy(t, home, slog.LevelInfo)
	conn := dialURL(t, url)
	queue := queueName(t)
	setup, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	t.Cleanup(func() { setup.QueueDelete(queue, false, false, false) })
	// The master is the home node (min-masters, first in order): wait until
	// both slaves are synchronised, so that the promotion loses nothing.
	testutil.Eventually(t, 20*time.Second, func() error {
		on, err := queueOnNodes(queue)
		if err != nil || len(on) != 3 {
			return fmt.Errorf("queue on %v (%v), want all three nodes", on, err)
		}
		return nil
	})

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		mu          sync.Mutex
		confirmed   = map[string]bool{}
		received    = map[string]int{}
		redeliv     = map[string]bool{}
		publishedAt = map[string]time.Time{}
		deliveredAt = map[string]time.Time{}
	)
	pubErr := make(chan error, 1)
	go func() {
		ch, err := conn.Channel()
		if err != nil {
			pubErr <- err
			return
		}
		if err := ch.Confirm(false); err != nil {
			pubErr <- err
			return
		}
		for i := 0; ctx.Err() == nil; i++ {
			body := fmt.Sprintf("m%d", i)
			mu.Lock()
			publishedAt[body] = time.Now()
			mu.Unlock()
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, false, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
			if err != nil {
				pubErr <- fmt.Errorf("publish %s: %w", body, err)
				return
			}
			ok, err := dc.WaitContext(testContext(t, 20*time.Second))
			if err != nil {
				pubErr <- fmt.Errorf("confirm of %s: %w", body, err)
				return
			}
			if ok {
				mu.Lock()
				confirmed[body] = true
				mu.Unlock()
			}
			time.Sleep(2 * time.Millisecond)
		}
		pubErr <- nil
	}()

	consumerConn := dialURL(t, url)
	cch, err := consumerConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := cch.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := cch.Consume(queue, "failover-consumer", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for d := range deliveries {
			mu.Lock()
			received[string(d.Body)]++
			if d.Redelivered {
				redeliv[string(d.Body)] = true
			}
			if _, seen := deliveredAt[string(d.Body)]; !seen {
				deliveredAt[string(d.Body)] = time.Now()
			}
			mu.Unlock()
			d.Ack(false)
		}
	}()

	count := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return len(confirmed), len(received)
	}
	testutil.Eventually(t, 20*time.Second, func() error {
		if c, r := count(); c < 300 || r < 300 {
			return fmt.Errorf("%d confirmed, %d received; want 300 each before the kill", c, r)
		}
		return nil
	})
	master := home
	if err := master.FlushMetadata(testContext(t, 10*time.Second)); err != nil {
		t.Fatalf("flush: %v", err)
	}
	killedAt := time.Now()
	if err := lose(master); err != nil {
		t.Fatalf("kill %s: %v", master.Name, err)
	}
	t.Cleanup(func() { restartNode(t, master) })
	_, before := count()
	testutil.Eventually(t, 30*time.Second, func() error {
		if _, r := count(); r < before+300 {
			return fmt.Errorf("%d received after the kill; want 300 more", r-before)
		}
		return nil
	})
	// Service resumed when the first message published after the kill
	// reached the consumer.
	mu.Lock()
	var resumed time.Time
	for body, at := range deliveredAt {
		if publishedAt[body].After(killedAt) && (resumed.IsZero() || at.Before(resumed)) {
			resumed = at
		}
	}
	mu.Unlock()
	t.Logf("the first message published after the kill reached the consumer %v after the kill", resumed.Sub(killedAt).Round(time.Millisecond))
	mu.Lock()
	var firstPublish, firstDelivery time.Time
	for _, at := range publishedAt {
		if at.After(killedAt) && (firstPublish.IsZero() || at.Before(firstPublish)) {
			firstPublish = at
		}
	}
	for _, at := range deliveredAt {
		if at.After(killedAt) && (firstDelivery.IsZero() || at.Before(firstDelivery)) {
			firstDelivery = at
		}
	}
	mu.Unlock()
	t.Logf("after the kill: first publish %v, first delivery %v", firstPublish.Sub(killedAt).Round(time.Millisecond), firstDelivery.Sub(killedAt).Round(time.Millisecond))
	stop()
	if err := <-pubErr; err != nil {
		t.Fatalf("publisher: %v", err)
	}
	// Every confirmed message arrives.
	testutil.Eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		missing := 0
		for body := range confirmed {
			if received[body] == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d confirmed messages not received", missing, len(confirmed))
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	duplicates := 0
	for body, n := range received {
		if n > 1 {
			duplicates++
			if !redeliv[body] {
				t.Errorf("%s delivered %d times, never with redelivered set", body, n)
			}
		}
	}
	t.Logf("%d confirmed, %d received, %d delivered more than once", len(confirmed), len(received), duplicates)
	if consumerConn.IsClosed() || conn.IsClosed() {
		t.Errorf("a client connection was closed by the failover")
	}
}

// queueOnNodes reports on which nodes queue exists, asked directly.
func queueOnNodes(queue string) ([]string, error) {
	var on []string
	for _, n := range cluster.Nodes() {
		conn, err := amqp.Dial(n.URL())
		if err != nil {
			continue // a node that is down holds nothing reachable
		}
		ch, err := conn.Channel()
		if err == nil {
			if _, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil); err == nil {
				on = append(on, n.Name)
			}
		}
		conn.Close()
	}
	return on, nil
}

// restartNode brings a killed node back for the tests that follow.
func restartNode(t *testing.T, n *localbroker.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n.Restart(ctx); err != nil {
		t.Errorf("restart %s: %v", n.Name, err)
	}
}
