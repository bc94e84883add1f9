package integration

import (
	"errors"
	"fmt"
	"strings"
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

// TestMirrorMaxLengthDropHead: a mirrored queue with x-max-length under drop-head, the
// default overflow. The master's broker drops the oldest messages beyond the limit, and
// they leave the slaves too. With a dead-letter exchange, every copy of the dead-letter
// queue, mastered on another broker, gets each dropped message once, with x-death as
// RabbitMQ writes it (reason maxlen); a redeclare with other dead-letter arguments is
// refused as RabbitMQ refuses it.
func TestMirrorMaxLengthDropHead(t *testing.T) {
	t.Parallel()
	const (
		limit     = 5
		published = 8
		dropped   = published - limit
	)
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	conn := dialURL(t, p.url("guest", "guest"))
	for _, deadLetters := range []bool{true, false} {
		t.Run(fmt.Sprintf("dead-letters=%v", deadLetters), func(t *testing.T) {
			prefix := queueName(t)
			source, target, exchange := prefix+"-source", prefix+"-target", prefix+"-dead-letters"
			setPolicy(t, p, prefix, exactly(source, target), `{"ha-mode":"all","ha-sync-mode":"automatic"}`)
			ch := openChannel(t, conn)
			defer ch.Close()
			args := amqp.Table{"x-max-length": int32(limit)}
			want := map[string]map[string]int{source: onEvery(limit, backends...)}
			if deadLetters {
				declareExchange(t, p, ch, exchange, amqp.ExchangeDirect, nil)
				declareMirrored(t, p, conn, target, true, nil)
				if err := ch.QueueBind(target, "dead", exchange, false, nil); err != nil {
					t.Fatalf("queue.bind: %v", err)
				}
				args["x-dead-letter-exchange"] = exchange
				args["x-dead-letter-routing-key"] = "dead"
				want[target] = onEvery(dropped, backends...)
			}
			declareMirrored(t, p, conn, source, true, args)
			if deadLetters {
				requireMastersApart(t, p, source, target)
			}

			// One channel: the master's broker takes them in order, and drops the oldest.
			publishConfirmed(t, conn, source, published, func(i int) amqp.Publishing {
				return amqp.Publishing{Body: fmt.Appendf(nil, "message %d", i)}
			})
			awaitHeld(t, time.Minute, want)
			for _, d := range consumeAcked(t, conn, source, limit) {
				if i := bodyIndex(t, d.Body); i < dropped {
					t.Errorf("consumed message %d, which the master dropped", i)
				}
			}
			if !deadLetters {
				return
			}
			consumeDeadLettered(t, conn, target, dropped, func(d amqp.Delivery) { checkDeath(t, d, source, "maxlen") })

			redeclare := openChannel(t, conn)
			if _, err := redeclare.QueueDeclare(source, true, false, false, false, args); err != nil {
				t.Fatalf("redeclare with the same arguments: %v", err)
			}
			other := amqp.Table{"x-max-length": int32(limit), "x-dead-letter-exchange": exchange + "-other", "x-dead-letter-routing-key": "dead"}
			_, err := redeclare.QueueDeclare(source, true, false, false, false, other)
			// The reply text is a short string, cut at 255 bytes as the broker cuts it.
			wantText := fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue '%s' in vhost '/': received the value", source)
			var amqpErr *amqp.Error
			if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.PreconditionFailed || !strings.Contains(amqpErr.Reason, wantText) {
				t.Errorf("redeclare with another dead-letter exchange: got %v, want 406 %q", err, wantText)
			}
		})
	}
}

// TestMirrorMaxLengthBytesDropHead: x-max-length-bytes under drop-head, which RabbitMQ
// counts in body bytes of ready messages: what the master drops leaves the slaves too.
func TestMirrorMaxLengthBytesDropHead(t *testing.T) {
	t.Parallel()
	const kept, published = 3, 7
	body := func(i int) []byte { return fmt.Appendf(nil, "message %d", i) } // 9 bytes each
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	conn := dialURL(t, p.url("guest", "guest"))
	queue := queueName(t)
	setPolicy(t, p, queue, exactly(queue), `{"ha-mode":"all","ha-sync-mode":"automatic"}`)
	declareMirrored(t, p, conn, queue, true, amqp.Table{"x-max-length-bytes": int64(kept * len(body(0)))})
	publishConfirmed(t, conn, queue, published, func(i int) amqp.Publishing { return amqp.Publishing{Body: body(i)} })
	awaitHeld(t, time.Minute, map[string]map[string]int{queue: onEvery(kept, backends...)})
	for _, d := range consumeAcked(t, conn, queue, kept) {
		if i := bodyIndex(t, d.Body); i < published-kept {
			t.Errorf("consumed message %d, which the master dropped", i)
		}
	}
}
