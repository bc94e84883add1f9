package integration

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// TestFailoverAfterDropHead: a mirrored queue under x-max-length with drop-head, whose
// master dropped the oldest messages, loses its master's broker to SIGKILL. The promoted
// slave delivers the messages the master held and none of those it dropped.
func TestFailoverAfterDropHead(t *testing.T) {
	const limit, published = 3, 8
	home := node(t, "rabbit1")
	url, _ := startMirroredProxy(t, home, slog.LevelInfo)
	conn := dialURL(t, url)
	queue := queueName(t)
	ch := openChannel(t, conn)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-max-length": int32(limit)}); err != nil {
		t.Fatalf("declare: %v", err)
	}
	testutil.Eventually(t, 20*time.Second, func() error {
		on, err := queueOnNodes(queue)
		if err != nil || len(on) != 3 {
			return fmt.Errorf("queue on %v (%v), want all three nodes", on, err)
		}
		return nil
	})
	publishConfirmed(t, conn, queue, published, func(i int) amqp.Publishing {
		return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "message %d", i)}
	})
	awaitHeld(t, time.Minute, map[string]map[string]int{queue: onEvery(limit, mirrorBackends()...)})

	if err := home.FlushMetadata(testContext(t, 10*time.Second)); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if err := home.Kill(); err != nil {
		t.Fatalf("kill %s: %v", home.Name, err)
	}
	t.Cleanup(func() { restartNode(t, home) })

	for _, d := range consumeAcked(t, dialURL(t, url), queue, limit) {
		if i := bodyIndex(t, d.Body); i < published-limit {
			t.Errorf("after the failover, consumed message %d, which the master dropped", i)
		}
	}
	getter := openChannel(t, conn)
	if d, ok, err := getter.Get(queue, false); err != nil || ok {
		t.Errorf("basic.get after the %d messages: got %q, %v, %v; want the queue empty", limit, d.Body, ok, err)
	}
	if _, err := getter.QueueDelete(queue, false, false, false); err != nil {
		t.Errorf("deleting %s: %v", queue, err)
	}
}
