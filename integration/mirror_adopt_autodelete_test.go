package integration

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestSyncKeepsAnAdoptedAutoDeleteQueue: a durable auto-delete queue
// holding messages on one broker before the proxy (as amqp091-go's own
// TestRabbitMQQueueTTLGet leaves one), declared again through the proxy, is
// synchronised to its new slaves without being deleted. A copy from the
// master with a consumer of the proxy's own would delete it when that
// consumer went (RabbitMQ deletes an auto-delete queue at its last
// consumer's cancel): auto-delete queues, and adopted ones, whose flags AMQP
// cannot read, are copied with basic.get.
func TestSyncKeepsAnAdoptedAutoDeleteQueue(t *testing.T) {
	nodes := cluster.Nodes()
	home := nodes[0]
	const queue = "adopted-auto-delete"
	for _, n := range nodes {
		c := dial(t, n)
		deleteQueue(c, queue)
		c.Close()
	}
	direct := dial(t, home)
	dch, err := direct.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dch.QueueDeclare(queue, true, true, false, false, nil); err != nil {
		t.Fatalf("declaring on %s directly: %v", home.Name, err)
	}
	const held = 3
	for i := range held {
		if err := dch.PublishWithContext(testContext(t, 10*time.Second), "", queue, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	direct.Close()

	p := startMirroredProxyWith(t, home, mirroredOptions{
		logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	conn := dialURL(t, p.url)
	t.Cleanup(func() {
		c := dialURL(t, p.url)
		if err := deleteQueue(c, queue); err != nil {
			t.Errorf("deleting %q through the proxy: %v", queue, err)
		}
		c.Close()
		removeLeftovers(t, queue)
	})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, true, false, false, nil); err != nil {
		t.Fatalf("declare through the proxy: %v", err)
	}
	id := mirror.QueueID{VHost: "/", Name: queue}
	testutil.Eventually(t, 30*time.Second, func() error {
		m, ok := p.eng.Lookup(id)
		if !ok || len(m.SynchronisedSlaves()) != len(nodes)-1 {
			return fmt.Errorf("metadata %+v (recorded %v), want %d synchronised slaves", m, ok, len(nodes)-1)
		}
		return nil
	})
	awaitHeld(t, time.Minute, map[string]map[string]int{queue: onEvery(held, home.Name, nodes[1].Name, nodes[2].Name)})
	for i := range held {
		d, ok, err := ch.Get(queue, true)
		if err != nil || !ok {
			t.Fatalf("get %d after the sync: ok %v, err %v; want the message (the queue must still exist)", i, ok, err)
		}
		if want := fmt.Sprintf("m%d", i); string(d.Body) != want {
			t.Errorf("get %d: %q, want %q", i, d.Body, want)
		}
	}
}
