package integration

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestMirrorMaxLengthDropHead: a mirrored queue with x-max-length (overflow drop-head) and
// x-dead-letter-exchange, whose dead-letter queue is mirrored with its master on another
// broker. Publishes beyond the limit drop the oldest ready messages on every copy of the
// source, as RabbitMQ's mirrors all apply the master's drop; every copy of the dead-letter
// queue gets each dropped message once, with x-death reason maxlen; messages a consumer
// holds unacknowledged are not ready, so they are neither counted nor dropped, and stay on
// every copy until acked; and once everything is consumed no copy keeps anything.
//
// This is RabbitMQ's behaviour, which the proxy does not give: the slaves keep what the
// master drops, and the dead-letter queue's copies on other brokers miss it (see
// "Dead-lettering" in mirror/doc.go for why the slaves' brokers are not made to drop).
func TestMirrorMaxLengthDropHead(t *testing.T) {
	t.Skip("x-max-length drop-head is not replicated to the slaves; see mirror/doc.go")
	t.Parallel()
	const (
		limit     = 5
		published = 20
	)
	tests := []struct {
		name string
		held int // deliveries a consumer holds unacknowledged while the publishes overflow
	}{
		{name: "nothing delivered", held: 0},
		{name: "a consumer holds some", held: 3},
	}
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	conn := dialURL(t, p.url("guest", "guest"))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := queueName(t)
			source, target, exchange := prefix+"-source", prefix+"-target", prefix+"-dead-letters"
			setPolicy(t, p, prefix, exactly(source, target), `{"ha-mode":"all","ha-sync-mode":"automatic"}`)
			ch := openChannel(t, conn)
			defer ch.Close()
			declareExchange(t, p, ch, exchange, amqp.ExchangeDirect, nil)
			declareMirrored(t, p, conn, target, true, nil)
			if err := ch.QueueBind(target, "dead", exchange, false, nil); err != nil {
				t.Fatalf("queue.bind: %v", err)
			}
			declareMirrored(t, p, conn, source, true, amqp.Table{
				"x-max-length":              int32(limit),
				"x-dead-letter-exchange":    exchange,
				"x-dead-letter-routing-key": "dead",
			})
			requireMastersApart(t, p, source, target)

			var holder *amqp.Channel
			var held []amqp.Delivery
			if tt.held > 0 {
				holder = openChannel(t, conn)
				defer holder.Close()
				if err := holder.Qos(tt.held, 0, false); err != nil {
					t.Fatalf("basic.qos: %v", err)
				}
				deliveries, err := holder.Consume(source, "holder", false, false, false, false, nil)
				if err != nil {
					t.Fatalf("basic.consume %s: %v", source, err)
				}
				// The consumer takes the first messages as they arrive, and then holds
				// them: the master's broker counts the rest only.
				defer func() {
					for _, d := range held {
						if err := d.Ack(false); err != nil {
							t.Errorf("ack: %v", err)
						}
					}
				}()
				publishConfirmed(t, conn, source, published, func(i int) amqp.Publishing {
					return amqp.Publishing{Body: fmt.Appendf(nil, "overflow %d", i)}
				})
				for len(held) < tt.held {
					held = append(held, receive(t, deliveries))
				}
			} else {
				publishConfirmed(t, conn, source, published, func(i int) amqp.Publishing {
					return amqp.Publishing{Body: fmt.Appendf(nil, "overflow %d", i)}
				})
			}
			dropped := published - tt.held - limit
			awaitHeld(t, time.Minute, map[string]map[string]int{
				source: onEvery(tt.held+limit, backends...),
				target: onEvery(dropped, backends...),
			})
			for i, d := range held {
				if got := bodyIndex(t, d.Body); got != i {
					t.Errorf("the consumer holds message %d as its delivery %d, want message %d", got, i, i)
				}
			}

			// The dead-letter queue gets messages held..held+dropped-1, each once.
			seen := make(map[int]int, dropped)
			for _, d := range consumeAcked(t, conn, target, dropped) {
				seen[bodyIndex(t, d.Body)]++
				checkDeath(t, d, source, "maxlen")
			}
			for i := tt.held; i < tt.held+dropped; i++ {
				if seen[i] != 1 {
					t.Errorf("message %d dead-lettered into %s %d times, want once", i, target, seen[i])
				}
			}
			// What the consumer holds stays on every copy until it acks it.
			awaitHeld(t, time.Minute, map[string]map[string]int{
				source: onEvery(tt.held+limit, backends...),
				target: onEvery(0, backends...),
			})
			for _, d := range held {
				if err := d.Ack(false); err != nil {
					t.Fatalf("ack: %v", err)
				}
			}
			held = nil
			for _, d := range consumeAcked(t, conn, source, limit) {
				if i := bodyIndex(t, d.Body); i < published-limit {
					t.Errorf("consumed message %d from %s, want only the newest %d", i, source, limit)
				}
			}
			awaitHeld(t, time.Minute, map[string]map[string]int{
				source: onEvery(0, backends...),
				target: onEvery(0, backends...),
			})
		})
	}
}

// TestMirrorMaxLengthRejectPublish: a mirrored queue with x-max-length and overflow
// reject-publish or reject-publish-dlx. The master's broker refuses publishes beyond the
// limit, and the client gets a nack for each; no copy keeps a refused message, though the
// slaves' brokers (whose copies the trimmers hold, so that they count no ready message)
// accepted it. Under reject-publish-dlx every copy of the dead-letter queue, mastered on
// another broker, gets each refused message once.
func TestMirrorMaxLengthRejectPublish(t *testing.T) {
	t.Parallel()
	const (
		limit     = 5
		published = 8
	)
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	conn := dialURL(t, p.url("guest", "guest"))
	for _, overflow := range []string{"reject-publish", "reject-publish-dlx"} {
		t.Run(overflow, func(t *testing.T) {
			prefix := queueName(t)
			source, target, exchange := prefix+"-source", prefix+"-target", prefix+"-dead-letters"
			setPolicy(t, p, prefix, exactly(source, target), `{"ha-mode":"all","ha-sync-mode":"automatic"}`)
			ch := openChannel(t, conn)
			defer ch.Close()
			declareExchange(t, p, ch, exchange, amqp.ExchangeDirect, nil)
			declareMirrored(t, p, conn, target, true, nil)
			if err := ch.QueueBind(target, "dead", exchange, false, nil); err != nil {
				t.Fatalf("queue.bind: %v", err)
			}
			declareMirrored(t, p, conn, source, true, amqp.Table{
				"x-max-length":              int32(limit),
				"x-overflow":                overflow,
				"x-dead-letter-exchange":    exchange,
				"x-dead-letter-routing-key": "dead",
			})
			requireMastersApart(t, p, source, target)

			if err := ch.Confirm(false); err != nil {
				t.Fatalf("confirm.select: %v", err)
			}
			confirms := ch.NotifyPublish(make(chan amqp.Confirmation, published))
			for i := range published {
				// One at a time: the master's broker decides each against the ready count
				// the ones before left.
				if err := ch.PublishWithContext(t.Context(), "", source, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "refused %d", i)}); err != nil {
					t.Fatalf("publish %d: %v", i, err)
				}
				select {
				case c := <-confirms:
					if want := i < limit; c.Ack != want {
						t.Errorf("publish %d: ack %v, want %v", i, c.Ack, want)
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("publish %d: no confirm within 30s", i)
				}
			}
			deadLettered := 0
			if overflow == "reject-publish-dlx" {
				deadLettered = published - limit
			}
			awaitHeld(t, time.Minute, map[string]map[string]int{
				source: onEvery(limit, backends...),
				target: onEvery(deadLettered, backends...),
			})
			for _, d := range consumeAcked(t, conn, source, limit) {
				if i := bodyIndex(t, d.Body); i >= limit {
					t.Errorf("consumed message %d, which the master refused", i)
				}
			}
			seen := map[int]int{}
			for _, d := range consumeAcked(t, conn, target, deadLettered) {
				seen[bodyIndex(t, d.Body)]++
			}
			for i := limit; i < limit+deadLettered; i++ {
				if seen[i] != 1 {
					t.Errorf("message %d dead-lettered into %s %d times, want once", i, target, seen[i])
				}
			}
			awaitHeld(t, time.Minute, map[string]map[string]int{
				source: onEvery(0, backends...),
				target: onEvery(0, backends...),
			})
		})
	}
}
