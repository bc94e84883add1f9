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

// TestUnmirroredQueuesMessagesCarryTheIdentity: a queue the log records
// without slaves (its policy mirrors nothing yet) gets the identity header on
// its broker all the same, so that messages with equal bodies stay apart
// when a policy later copies them to new slaves; its consumers still get
// exactly what was published, without a headers table when there was none.
func TestUnmirroredQueuesMessagesCarryTheIdentity(t *testing.T) {
	nodes := cluster.Nodes()
	home := nodes[0]
	p := startMirroredProxyWith(t, home, mirroredOptions{
		definition: `{"ha-mode":"exactly","ha-params":1}`,
		logger:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	const queue = "identity-unmirrored"
	conn := dialOwnConfirms(t, p.url, queue)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	meta, ok := p.eng.Lookup(mirror.QueueID{VHost: "/", Name: queue})
	if !ok || len(meta.Slaves) != 0 {
		t.Fatalf("metadata %+v (recorded %v), want the queue recorded without slaves", meta, ok)
	}
	ctx := testContext(t, 30*time.Second)
	for range 2 {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte("same body")}); err != nil {
			t.Fatal(err)
		}
	}

	// On the master's broker, directly: both carry an identity, and they differ.
	direct := dial(t, node(t, meta.Master))
	dch, err := direct.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var ids []any
	testutil.Eventually(t, 10*time.Second, func() error {
		for len(ids) < 2 {
			d, ok, err := dch.Get(queue, false)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("got %d messages on %s, want 2", len(ids), meta.Master)
			}
			id, has := d.Headers[mirror.IdentityHeader]
			if !has {
				return fmt.Errorf("message on the broker has headers %v, want %s", d.Headers, mirror.IdentityHeader)
			}
			ids = append(ids, id)
		}
		return nil
	})
	if fmt.Sprint(ids[0]) == fmt.Sprint(ids[1]) {
		t.Fatalf("two messages share the identity %v", ids[0])
	}
	direct.Close() // gives them back

	// Through the proxy: as published.
	for i := range 2 {
		var d amqp.Delivery
		testutil.Eventually(t, 10*time.Second, func() error {
			got, ok, err := ch.Get(queue, true)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("message %d not there yet", i)
			}
			d = got
			return nil
		})
		if d.Headers != nil || string(d.Body) != "same body" {
			t.Fatalf("message %d through the proxy: headers %v body %q, want no headers table and %q", i, d.Headers, d.Body, "same body")
		}
	}
}
