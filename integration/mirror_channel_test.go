package integration

// Acceptance tests of mirrored queues: one client channel as the broker sees it. A channel
// that publishes to a mirrored queue is open on the links to every copy's broker; what the
// client settles, and the order of what it sends, must be what one broker would see.

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestMirrorRecoverThenSettleEverything: after basic.recover requeue, the redelivered
// messages of a mirrored queue are the channel's outstanding deliveries; ack 0 multiple and
// nack 0 multiple settle every one of them, reject settles each, on the master and (ack, or
// without requeue) the slaves, and the channel stays open.
func TestMirrorRecoverThenSettleEverything(t *testing.T) {
	t.Parallel()
	const messages, rounds = 2, 5
	backends := mirrorBackends()
	cases := []struct {
		name   string
		settle func(t *testing.T, ch *amqp.Channel, redelivered []amqp.Delivery, deliveries <-chan amqp.Delivery) error
	}{
		{"ack 0 multiple", func(_ *testing.T, ch *amqp.Channel, _ []amqp.Delivery, _ <-chan amqp.Delivery) error {
			return ch.Ack(0, true)
		}},
		{"nack 0 multiple without requeue", func(_ *testing.T, ch *amqp.Channel, _ []amqp.Delivery, _ <-chan amqp.Delivery) error {
			return ch.Nack(0, true, false)
		}},
		{"nack 0 multiple with requeue, then ack 0 multiple", func(t *testing.T, ch *amqp.Channel, _ []amqp.Delivery, deliveries <-chan amqp.Delivery) error {
			if err := ch.Nack(0, true, true); err != nil {
				return err
			}
			for range messages {
				if d := receive(t, deliveries); !d.Redelivered {
					return fmt.Errorf("%q came back after nack 0 multiple requeue without the redelivered flag", d.Body)
				}
			}
			return ch.Ack(0, true)
		}},
		{"reject each", func(_ *testing.T, ch *amqp.Channel, redelivered []amqp.Delivery, _ <-chan amqp.Delivery) error {
			for _, d := range redelivered {
				if err := ch.Reject(d.DeliveryTag, false); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	prefix := queueName(t)
	var queues []string
	for i := range cases {
		queues = append(queues, fmt.Sprintf("%s-%d", prefix, i))
	}
	p := startMirrorProxy(t, "")
	setPolicy(t, p, "recover", exactly(queues...), `{"ha-mode":"all"}`)
	conn := dialURL(t, p.url("guest", "guest"))
	for i, c := range cases {
		queue := queues[i]
		t.Run(c.name, func(t *testing.T) {
			declareMirrored(t, p, conn, queue, true, nil)
			ch := openChannel(t, conn)
			closed := ch.NotifyClose(make(chan *amqp.Error, 1))
			deliveries, err := ch.Consume(queue, "recovering", false, false, false, false, nil)
			if err != nil {
				t.Fatalf("basic.consume: %v", err)
			}
			// Each link the channel is open on answers the recover, in its own time; a
			// round settles what one recover redelivered, and several rounds meet the
			// answers in several orders.
			for round := range rounds {
				// Publishing on the consuming channel opens it on every copy's link.
				for i := range messages {
					if err := ch.Publish("", queue, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "round %d message %d", round, i)}); err != nil {
						t.Fatalf("round %d: basic.publish: %v", round, err)
					}
				}
				for range messages {
					receive(t, deliveries)
				}
				awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(messages, backends...)})
				if err := ch.Recover(true); err != nil {
					t.Fatalf("round %d: basic.recover requeue: %v", round, err)
				}
				var redelivered []amqp.Delivery
				for range messages {
					d := receive(t, deliveries)
					if !d.Redelivered {
						t.Errorf("round %d: %q after basic.recover: redelivered flag not set", round, d.Body)
					}
					redelivered = append(redelivered, d)
				}
				if err := c.settle(t, ch, redelivered, deliveries); err != nil {
					t.Fatalf("round %d: %s: %v", round, c.name, err)
				}
				awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(0, backends...)})
				select {
				case err := <-closed:
					t.Fatalf("round %d: the channel closed: %v", round, err)
				default:
				}
			}
			if err := ch.Close(); err != nil {
				t.Errorf("channel.close: %v", err)
			}
		})
	}
}

// TestMirrorNackRequeueThenGet: on one channel, basic.get, basic.nack with requeue and
// basic.get again reach a mirrored queue's master in that order, as on one broker: the
// second get returns the requeued message, redelivered. A passive queue.declare counts the
// master's ready messages (not a slave's, whose trimmer holds every message), whatever other
// flags it carries: RabbitMQ reads none but passive. The channel reads three queues whose
// masters are on three backends, so that its methods go to the home link and to others.
func TestMirrorNackRequeueThenGet(t *testing.T) {
	t.Parallel()
	const messages = 2
	prefix := queueName(t)
	queues := []string{prefix + "-a", prefix + "-b", prefix + "-c"}
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	setPolicy(t, p, "nack-get", exactly(queues...), `{"ha-mode":"all"}`)
	conn := dialURL(t, p.url("guest", "guest"))
	// min-masters puts each master on a backend of its own.
	locator := amqp.Table{"x-queue-master-locator": "min-masters"}
	held := map[string]map[string]int{}
	for _, q := range queues {
		declareMirrored(t, p, conn, q, true, locator)
		publishConfirmed(t, conn, q, messages, func(i int) amqp.Publishing {
			return amqp.Publishing{Body: fmt.Appendf(nil, "%s %d", q, i)}
		})
		held[q] = onEvery(messages, backends...)
	}
	rows, err := listQueues(t, p)
	if err != nil {
		t.Fatal(err)
	}
	masters := map[string]bool{}
	for _, q := range queues {
		masters[rows[q].Master] = true
	}
	if len(masters) != len(queues) {
		t.Fatalf("ctl list_queues: masters %v of %v; want one on each backend (x-queue-master-locator min-masters)", masters, queues)
	}
	awaitHeld(t, 30*time.Second, held)

	ch := openChannel(t, conn)
	for _, q := range queues {
		first, ok, err := ch.Get(q, false)
		if err != nil || !ok {
			t.Fatalf("%s: basic.get: ok %v, error %v; want a message", q, ok, err)
		}
		if err := first.Nack(false, true); err != nil {
			t.Fatalf("%s: basic.nack requeue: %v", q, err)
		}
		again, ok, err := ch.Get(q, false)
		if err != nil || !ok {
			t.Fatalf("%s (master %s): basic.get after basic.nack requeue: ok %v, error %v; want the requeued message", q, rows[q].Master, ok, err)
		}
		if string(again.Body) != string(first.Body) || !again.Redelivered {
			t.Errorf("%s (master %s): basic.get after the nack: %q, redelivered %v; want %q, redelivered", q, rows[q].Master, again.Body, again.Redelivered, first.Body)
		}
		// The master holds one message ready and one on this channel.
		for _, exclusive := range []bool{false, true} {
			declared, err := ch.QueueDeclarePassive(q, true, false, exclusive, false, nil)
			if err != nil {
				t.Fatalf("%s: passive queue.declare (exclusive flag %v): %v", q, exclusive, err)
			}
			if declared.Messages != messages-1 {
				t.Errorf("%s (master %s): passive queue.declare (exclusive flag %v) counts %d messages ready, want the master's %d", q, rows[q].Master, exclusive, declared.Messages, messages-1)
			}
		}
		if err := again.Ack(false); err != nil {
			t.Fatalf("%s: basic.ack: %v", q, err)
		}
		held[q] = onEvery(messages-1, backends...)
	}
	awaitHeld(t, 30*time.Second, held)
}
