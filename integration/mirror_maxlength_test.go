package integration

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

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
