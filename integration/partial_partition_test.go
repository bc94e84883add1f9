package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestSidecarPartialPartitionKeepsTheMaster cuts proxy 1 off from rabbit2, the master of a
// queue mirrored on all three nodes, while proxies 2 and 3 still reach it (a partial
// partition). It checks:
//   - proxy 1 counts rabbit2 down (past failover_grace) and logs that most proxies still
//     reach it, but the master stays rabbit2, as every proxy lists it: a promotion away
//     from a broker the others still deliver from lets two masters deliver the same
//     messages;
//   - a consumer through proxy 1, started before the cut, is neither cancelled nor
//     disconnected, and after the healing receives every message confirmed through
//     proxy 3, during the cut and after.
func TestSidecarPartialPartitionKeepsTheMaster(t *testing.T) {
	const queue = "partition_partial_q"
	t.Cleanup(func() { removeLeftovers(t, queue) })
	network := newPartitionNetwork(t)
	proxies := network.startProxies(t)

	// The queue through proxy 2, client-local: mastered on rabbit2, mirrored on all three.
	network.declareMirrored(t, proxies, 1, queue, "rabbit2", "rabbit3", "rabbit1")

	consumer := startPartialPartitionConsumer(t, network, 0, queue)
	ctx, stopPublishing := context.WithCancel(t.Context())
	defer stopPublishing()
	publisher := startPartitionPublisher(ctx, t, network, 2, queue, "through-3")
	awaitCondition(t, 30*time.Second, func() error {
		if n := consumer.count(); n < 100 {
			return fmt.Errorf("proxy 1's consumer has %d messages; want 100 before the cut", n)
		}
		return nil
	})

	network.blockBroker(t, true, 0, 1)
	healed := false
	heal := func() {
		if !healed {
			network.blockBroker(t, false, 0, 1)
			healed = true
		}
	}
	t.Cleanup(heal)
	cut := time.Now()
	var downAt time.Time
	awaitCondition(t, 90*time.Second, func() error {
		r := proxies[0].ctl(t, "cluster_status", "--formatter", "json")
		var status sidecarStatus
		if err := json.Unmarshal([]byte(r.stdout), &status); err != nil {
			return fmt.Errorf("ctl cluster_status --formatter json through proxy 1: %v (exit %d)\n%s%s", err, r.code, r.stdout, r.stderr)
		}
		for _, b := range status.Backends {
			if b.Name == "rabbit2" && b.State == "down" {
				downAt = time.Now()
				return nil
			}
		}
		return fmt.Errorf("proxy 1, cut off from rabbit2, does not count it down: %v", status.Backends)
	})
	t.Logf("proxy 1 counts rabbit2 down %v after the cut", downAt.Sub(cut).Round(time.Millisecond))
	// The loss, and retries of it a second apart.
	time.Sleep(4 * time.Second)
	for i, p := range proxies {
		row, err := queueStatus(t, p, queue)
		if err != nil {
			t.Fatal(err)
		}
		if row.Master != "rabbit2" {
			t.Errorf("proxy %d lists %v while proxies 2 and 3 reach rabbit2; want the master rabbit2 still", i+1, row)
		}
	}
	if !strings.Contains(proxies[0].stderr.String(), "most proxies still reach") {
		t.Errorf("proxy 1 did not log that most proxies still reach rabbit2")
	}

	heal()
	awaitCondition(t, 30*time.Second, func() error {
		if n := publisher.confirmedSince(time.Now().Add(-time.Second)); n == 0 {
			return fmt.Errorf("no confirms through proxy 3 in the last second")
		}
		return nil
	})
	stopPublishing()
	publisher.wait()
	confirmed := publisher.confirmedBodies()
	// What proxy 1's consumer held unacknowledged at the cut returns when rabbit2 sees
	// the old link close, which the healing lets through.
	awaitCondition(t, 3*time.Minute, func() error {
		if missing := consumer.missing(confirmed); len(missing) > 0 {
			return fmt.Errorf("proxy 1's consumer lacks %d of %d confirmed messages, e.g. %v", len(missing), len(confirmed), missing[:min(len(missing), 5)])
		}
		return nil
	})
	if reason := consumer.ended(); reason != "" {
		t.Errorf("proxy 1's consumer ended: %s", reason)
	}
	t.Logf("%d confirmed through proxy 3, all received through proxy 1", len(confirmed))
}

// partialPartitionConsumer consumes a queue with manual acks through one proxy and
// records the bodies it receives, and whether its connection closed or its consumer was
// cancelled.
type partialPartitionConsumer struct {
	mu       sync.Mutex
	received map[string]bool
	end      string
}

func startPartialPartitionConsumer(t *testing.T, network *partitionNetwork, proxy int, queue string) *partialPartitionConsumer {
	t.Helper()
	conn, err := network.dial(proxy)
	if err != nil {
		t.Fatalf("connecting a consumer to proxy %d: %v", proxy+1, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch := openChannel(t, conn)
	if err := ch.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "partial-partition", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &partialPartitionConsumer{received: map[string]bool{}}
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	cancels := ch.NotifyCancel(make(chan string, 1))
	done := make(chan struct{})
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	go func() {
		defer close(done)
		for d := range deliveries {
			c.mu.Lock()
			c.received[string(d.Body)] = true
			c.mu.Unlock()
			d.Ack(false)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		select {
		case tag := <-cancels:
			c.end = "consumer " + tag + " cancelled"
		case err := <-closes:
			if err != nil {
				c.end = "connection closed: " + err.Error()
			}
		default:
		}
	}()
	return c
}

func (c *partialPartitionConsumer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.received)
}

// missing returns the bodies of want not received, sorted.
func (c *partialPartitionConsumer) missing(want map[string]bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for body := range want {
		if !c.received[body] {
			out = append(out, body)
		}
	}
	slices.Sort(out)
	return out
}

// ended says how the consumer ended, "" while it runs.
func (c *partialPartitionConsumer) ended() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.end
}
