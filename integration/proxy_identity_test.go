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

// TestRepeatedIdentityArrivesRedelivered: a message whose copy reaches a
// consumer a second time arrives with redelivered set, even when the
// broker delivers that copy as new. After a promotion that is what a slave
// does with a message its trimmer had not taken yet, though the old master
// had delivered it (the window is milliseconds wide and cannot be timed
// from a test: TestCtlDrain met it in CI); here the repeat is made
// directly: two copies carrying one identity, published on the master's
// broker past the proxy. A message with an identity of its own still
// arrives unflagged, and one delivered again through basic.get too. A
// dead-lettered one is not flagged: back in its queue through a dead-letter
// loop it is a new message to RabbitMQ.
func TestRepeatedIdentityArrivesRedelivered(t *testing.T) {
	queue, ch, direct := mirroredQueueBesideItsMaster(t)
	dch := openChannel(t, direct)
	ctx := testContext(t, 30*time.Second)
	withIdentity := func(id byte, body string) amqp.Publishing {
		var mid mirror.MessageID
		mid[0], mid[15] = id, id
		return amqp.Publishing{Headers: amqp.Table{mirror.IdentityHeader: string(mid[:])}, Body: []byte(body)}
	}
	deadLettered := func(body string) amqp.Publishing {
		m := withIdentity(3, body)
		m.Headers["x-death"] = []any{amqp.Table{"count": int64(1), "reason": "expired", "queue": queue}}
		return m
	}
	for _, m := range []amqp.Publishing{
		withIdentity(1, "first"), withIdentity(1, "first again"),
		withIdentity(2, "second"), withIdentity(2, "second again"),
		deadLettered("dead-lettered"), deadLettered("dead-lettered again"),
	} {
		if err := dch.PublishWithContext(ctx, "", queue, false, false, m); err != nil {
			t.Fatal(err)
		}
	}

	check := func(d amqp.Delivery, body string, redelivered bool) {
		t.Helper()
		if string(d.Body) != body || d.Redelivered != redelivered {
			t.Fatalf("got %q redelivered=%v, want %q redelivered=%v", d.Body, d.Redelivered, body, redelivered)
		}
		if _, has := d.Headers[mirror.IdentityHeader]; has {
			t.Fatalf("%q reached the consumer with the identity header", d.Body)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	// The first two by basic.get, the last two by a consumer.
	for _, want := range []struct {
		body        string
		redelivered bool
	}{{"first", false}, {"first again", true}} {
		var d amqp.Delivery
		testutil.Eventually(t, 10*time.Second, func() error {
			got, ok, err := ch.Get(queue, false)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%q not there yet", want.body)
			}
			d = got
			return nil
		})
		check(d, want.body, want.redelivered)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume: %v", err)
	}
	for _, want := range []struct {
		body        string
		redelivered bool
	}{{"second", false}, {"second again", true}, {"dead-lettered", false}, {"dead-lettered again", false}} {
		select {
		case d := <-deliveries:
			check(d, want.body, want.redelivered)
		case <-ctx.Done():
			t.Fatalf("waiting for %q: %v", want.body, ctx.Err())
		}
	}
}

// TestRedeliveryRemembersBrokerFlaggedDeliveries: a message whose first
// delivery through the proxy already carries the broker's redelivered flag
// is remembered like any other, so that a later copy of it that the broker
// delivers as new (a promoted slave's copy its trimmer never took) arrives
// flagged too. Staged as in TestRepeatedIdentityArrivesRedelivered: the
// copies are published on the master's broker past the proxy, the first
// one requeued there once so that the broker flags it.
func TestRedeliveryRemembersBrokerFlaggedDeliveries(t *testing.T) {
	queue, ch, direct := mirroredQueueBesideItsMaster(t)
	ctx := testContext(t, 30*time.Second)
	var id mirror.MessageID
	id[0], id[15] = 4, 4
	publish := func(body string) {
		t.Helper()
		dch := openChannel(t, direct)
		defer dch.Close()
		m := amqp.Publishing{Headers: amqp.Table{mirror.IdentityHeader: string(id[:])}, Body: []byte(body)}
		if err := dch.PublishWithContext(ctx, "", queue, false, false, m); err != nil {
			t.Fatal(err)
		}
	}
	getThroughProxy := func(body string) amqp.Delivery {
		t.Helper()
		var d amqp.Delivery
		testutil.Eventually(t, 10*time.Second, func() error {
			got, ok, err := ch.Get(queue, false)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%q not there yet", body)
			}
			d = got
			return nil
		})
		if string(d.Body) != body {
			t.Fatalf("got %q, want %q", d.Body, body)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
		return d
	}

	publish("first")
	// Taken on the broker and given back unacknowledged: from now on the
	// broker flags it.
	requeue := openChannel(t, direct)
	testutil.Eventually(t, 10*time.Second, func() error {
		if _, ok, err := requeue.Get(queue, false); err != nil || !ok {
			return fmt.Errorf("the first copy is not on the master yet (%v)", err)
		}
		return nil
	})
	requeue.Close()
	if d := getThroughProxy("first"); !d.Redelivered {
		t.Fatalf("%q: redelivered=false, want the broker's flag", d.Body)
	}
	publish("first again")
	if d := getThroughProxy("first again"); !d.Redelivered {
		t.Fatalf("%q: redelivered=false, want true: the proxy delivered this message before, flagged by the broker", d.Body)
	}
}

// mirroredQueueBesideItsMaster declares a mirrored queue through a proxy
// of its own and returns its name, a channel through the proxy, and a
// connection to the master's broker, past the proxy.
func mirroredQueueBesideItsMaster(t *testing.T) (queue string, ch *amqp.Channel, direct *amqp.Connection) {
	t.Helper()
	nodes := cluster.Nodes()
	p := startMirroredProxyWith(t, nodes[0], mirroredOptions{
		logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	queue = queueName(t)
	conn, err := amqp.Dial(p.url)
	if err != nil {
		t.Fatalf("dial through the proxy: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch = openChannel(t, conn)
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			c.QueueDelete(queue, false, false, false)
		}
	})
	meta, ok := p.eng.Lookup(mirror.QueueID{VHost: "/", Name: queue})
	if !ok || len(meta.Slaves) == 0 {
		t.Fatalf("metadata %+v (recorded %v), want the queue mirrored", meta, ok)
	}
	return queue, ch, dial(t, node(t, meta.Master))
}
