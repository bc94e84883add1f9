package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestMirrorDeadLetteringAcrossMasters: messages a client rejects or nacks without requeue
// from a mirrored queue with x-dead-letter-exchange reach the mirrored dead-letter queue
// when its master is on another broker than the source's: every copy of the dead-letter
// queue holds each message once, its consumer sees each once with x-death as RabbitMQ
// writes it, and no copy of either queue keeps anything once it is consumed.
func TestMirrorDeadLetteringAcrossMasters(t *testing.T) {
	t.Parallel()
	const messages = 6
	tests := []struct {
		name string
		// refuse settles the deliveries of the source queue (taken on ch), all at once.
		refuse func(ch *amqp.Channel, deliveries []amqp.Delivery) error
	}{
		{name: "basic.reject", refuse: func(_ *amqp.Channel, deliveries []amqp.Delivery) error {
			for _, d := range deliveries {
				if err := d.Reject(false); err != nil {
					return err
				}
			}
			return nil
		}},
		{name: "basic.nack", refuse: func(_ *amqp.Channel, deliveries []amqp.Delivery) error {
			// One single nack, then one multiple nack for the rest.
			if err := deliveries[0].Nack(false, false); err != nil {
				return err
			}
			return deliveries[len(deliveries)-1].Nack(true, false)
		}},
		{name: "basic.reject in a transaction", refuse: func(ch *amqp.Channel, deliveries []amqp.Delivery) error {
			if err := ch.Tx(); err != nil {
				return err
			}
			for _, d := range deliveries {
				if err := d.Reject(false); err != nil {
					return err
				}
			}
			return ch.TxCommit()
		}},
	}
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	conn := dialURL(t, p.url("guest", "guest"))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := queueName(t)
			source, target, exchange := prefix+"-source", prefix+"-target", prefix+"-dead-letters"
			setPolicy(t, p, prefix, exactly(source, target), `{"ha-mode":"all"}`)
			ch := openChannel(t, conn)
			defer ch.Close()
			declareExchange(t, p, ch, exchange, amqp.ExchangeDirect, nil)
			// min-masters on a proxy of its own: the target's master is the first backend
			// with the fewest masters, and the source's master another one.
			declareMirrored(t, p, conn, target, true, nil)
			if err := ch.QueueBind(target, "dead", exchange, false, nil); err != nil {
				t.Fatalf("queue.bind: %v", err)
			}
			declareMirrored(t, p, conn, source, true, amqp.Table{
				"x-dead-letter-exchange":    exchange,
				"x-dead-letter-routing-key": "dead",
			})
			requireMastersApart(t, p, source, target)

			publishConfirmed(t, conn, source, messages, func(i int) amqp.Publishing {
				return amqp.Publishing{Body: fmt.Appendf(nil, "refused %d", i)}
			})
			awaitHeld(t, 30*time.Second, map[string]map[string]int{source: onEvery(messages, backends...)})
			if err := tt.refuse(takeDeliveries(t, conn, source, messages)); err != nil {
				t.Fatalf("refusing the deliveries: %v", err)
			}
			awaitHeld(t, 30*time.Second, map[string]map[string]int{
				source: onEvery(0, backends...),
				target: onEvery(messages, backends...),
			})

			consumeDeadLettered(t, conn, target, messages, func(d amqp.Delivery) { checkDeath(t, d, source, "rejected") })
			if extra := getAll(t, conn, target); len(extra) != 0 {
				t.Errorf("basic.get on %s after every message was consumed: %q, want nothing", target, bodies(extra))
			}
			awaitHeld(t, 30*time.Second, map[string]map[string]int{
				source: onEvery(0, backends...),
				target: onEvery(0, backends...),
			})
		})
	}
}

// requireMastersApart fails the test unless the two queues have their masters on
// different backends and a slave on every other one.
func requireMastersApart(t testing.TB, p *cliProxy, source, target string) {
	t.Helper()
	var masters [2]string
	for i, q := range []string{source, target} {
		var row queueRow
		awaitCondition(t, 30*time.Second, func() error {
			var err error
			if row, err = queueStatus(t, p, q); err != nil {
				return err
			}
			if got, want := len(row.copies()), len(mirrorBackends()); got != want {
				return fmt.Errorf("%s has %d copies (%s), want %d", q, got, row, want)
			}
			return nil
		})
		masters[i] = row.Master
	}
	if masters[0] == masters[1] {
		t.Fatalf("%s and %s are both mastered on %s; the test needs their masters apart", source, target, masters[0])
	}
}

// takeDeliveries consumes count deliveries of queue with manual acks and returns them
// unsettled, with their channel; the consumer is cancelled first, so that nothing more is
// delivered.
func takeDeliveries(t testing.TB, conn *amqp.Connection, queue string, count int) (*amqp.Channel, []amqp.Delivery) {
	t.Helper()
	ch := openChannel(t, conn)
	t.Cleanup(func() { ch.Close() })
	if err := ch.Qos(count, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	deliveries, err := ch.Consume(queue, "take", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume %s: %v", queue, err)
	}
	got := make([]amqp.Delivery, 0, count)
	for len(got) < count {
		got = append(got, receive(t, deliveries))
	}
	if err := ch.Cancel("take", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	return ch, got
}

// checkDeath checks the headers of a message dead-lettered once from source, published
// to the default exchange, for reason: x-death as RabbitMQ 3.10 writes it, the
// x-first-death-* headers, and nothing else (the proxy's identity header is gone).
func checkDeath(t testing.TB, d amqp.Delivery, source, reason string) {
	t.Helper()
	for key := range d.Headers {
		if key != "x-death" && !strings.HasPrefix(key, "x-first-death-") {
			t.Errorf("dead-lettered %q has header %q = %v, which RabbitMQ does not add", d.Body, key, d.Headers[key])
		}
	}
	want := map[string]any{"x-first-death-queue": source, "x-first-death-reason": reason, "x-first-death-exchange": ""}
	for key, value := range want {
		if d.Headers[key] != value {
			t.Errorf("dead-lettered %q: %s = %v, want %v", d.Body, key, d.Headers[key], value)
		}
	}
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) != 1 {
		t.Errorf("dead-lettered %q: x-death %v, want one entry", d.Body, d.Headers["x-death"])
		return
	}
	death, _ := deaths[0].(amqp.Table)
	keys, _ := death["routing-keys"].([]any)
	checks := []check{
		{name: "x-death count", got: death["count"], want: int64(1)},
		{name: "x-death reason", got: death["reason"], want: reason},
		{name: "x-death queue", got: death["queue"], want: source},
		{name: "x-death exchange", got: death["exchange"], want: ""},
		{name: "x-death routing-keys", got: keys, want: []any{source}},
	}
	if _, ok := death["time"].(time.Time); !ok {
		t.Errorf("dead-lettered %q: x-death time %#v, want a timestamp", d.Body, death["time"])
	}
	verify(t, checks)
}

// consumeDeadLettered consumes and acks count messages from the dead-letter queue target,
// hands each to check, and fails the test unless each message of the source reached it
// exactly once.
func consumeDeadLettered(t *testing.T, conn *amqp.Connection, target string, count int, check func(d amqp.Delivery)) {
	t.Helper()
	seen := make([]int, count)
	for _, d := range consumeAcked(t, conn, target, count) {
		if i := bodyIndex(t, d.Body); i >= 0 && i < count {
			seen[i]++
		}
		check(d)
	}
	for i, n := range seen {
		if n != 1 {
			t.Errorf("message %d dead-lettered into %s %d times, want once", i, target, n)
		}
	}
}

// TestMirrorDeadLetteringAfterTTLWhileDelivered: a message of a mirrored queue with
// x-message-ttl and a dead-letter exchange, delivered by its master before its TTL passed
// (to a consumer or a basic.get) and settled after it, is dead-lettered by no broker when
// the client acks it (a broker never expires a delivery waiting for its ack, and the
// slaves' copies wait for the client too), and by every broker, once, when the client
// requeues it, closes its channel or connection holding it, or recovers it (the master's
// broker expires it as it takes it back, the slaves' brokers when their trimmers give their
// copies back).
func TestMirrorDeadLetteringAfterTTLWhileDelivered(t *testing.T) {
	t.Parallel()
	const (
		messages = 3
		ttl      = 3 * time.Second
	)
	consume := func(t *testing.T, conn *amqp.Connection, queue string) (*amqp.Channel, []amqp.Delivery) {
		return takeDeliveries(t, conn, queue, messages)
	}
	get := func(t *testing.T, conn *amqp.Connection, queue string) (*amqp.Channel, []amqp.Delivery) {
		ch := openChannel(t, conn)
		t.Cleanup(func() { ch.Close() })
		var got []amqp.Delivery
		for len(got) < messages {
			d, ok, err := ch.Get(queue, false)
			if err != nil {
				t.Fatalf("basic.get %s: %v", queue, err)
			}
			if !ok {
				t.Fatalf("basic.get %s: empty after %d of %d messages", queue, len(got), messages)
			}
			got = append(got, d)
		}
		return ch, got
	}
	ack := func(_ *amqp.Channel, deliveries []amqp.Delivery) error {
		return deliveries[len(deliveries)-1].Ack(true)
	}
	requeue := func(_ *amqp.Channel, deliveries []amqp.Delivery) error {
		return deliveries[len(deliveries)-1].Nack(true, true)
	}
	closeChannel := func(ch *amqp.Channel, _ []amqp.Delivery) error { return ch.Close() }
	// A consumer on a connection of its own, which the client closes.
	p := startMirrorProxy(t, "")
	owners := map[*amqp.Channel]*amqp.Connection{}
	consumeAlone := func(t *testing.T, _ *amqp.Connection, queue string) (*amqp.Channel, []amqp.Delivery) {
		own := dialURL(t, p.url("guest", "guest"))
		ch, deliveries := takeDeliveries(t, own, queue, messages)
		owners[ch] = own
		return ch, deliveries
	}
	closeConnection := func(ch *amqp.Channel, _ []amqp.Delivery) error { return owners[ch].Close() }
	recoverAll := func(ch *amqp.Channel, _ []amqp.Delivery) error { return ch.Recover(true) }
	tests := []struct {
		name       string
		take       func(t *testing.T, conn *amqp.Connection, queue string) (*amqp.Channel, []amqp.Delivery)
		settle     func(ch *amqp.Channel, deliveries []amqp.Delivery) error
		deadLetter int // messages on every copy of the target at the end
	}{
		{"consumed, acked after the TTL", consume, ack, 0},
		{"consumed, requeued after the TTL", consume, requeue, messages},
		{"consumed, its channel closed after the TTL", consume, closeChannel, messages},
		{"consumed, its connection closed after the TTL", consumeAlone, closeConnection, messages},
		{"got, acked after the TTL", get, ack, 0},
		{"got, recovered after the TTL", get, recoverAll, messages},
	}
	backends := mirrorBackends()
	conn := dialURL(t, p.url("guest", "guest"))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := queueName(t)
			source, target := prefix+"-source", prefix+"-target"
			setPolicy(t, p, prefix, exactly(source, target), `{"ha-mode":"all"}`)
			declareMirrored(t, p, conn, target, true, nil)
			declareMirrored(t, p, conn, source, true, amqp.Table{
				"x-message-ttl":             int32(ttl.Milliseconds()),
				"x-dead-letter-exchange":    "",
				"x-dead-letter-routing-key": target,
			})
			published := time.Now()
			publishConfirmed(t, conn, source, messages, func(i int) amqp.Publishing {
				return amqp.Publishing{Body: fmt.Appendf(nil, "expiring %d", i)}
			})
			awaitHeld(t, 30*time.Second, map[string]map[string]int{source: onEvery(messages, backends...)})
			ch, deliveries := tt.take(t, conn, source)
			if taken := time.Since(published); taken >= ttl {
				t.Fatalf("the deliveries took %v, past the TTL (%v): the test needs them before it", taken, ttl)
			}
			// Past the TTL, and past the moment the slaves' trimmers would give back what
			// they hold.
			time.Sleep(time.Until(published.Add(ttl + 2*time.Second)))
			if err := tt.settle(ch, deliveries); err != nil {
				t.Fatalf("settling the deliveries: %v", err)
			}
			awaitHeld(t, 30*time.Second, map[string]map[string]int{
				source: onEvery(0, backends...),
				target: onEvery(tt.deadLetter, backends...),
			})
			if tt.deadLetter > 0 {
				consumeDeadLettered(t, conn, target, tt.deadLetter, func(d amqp.Delivery) { checkDeath(t, d, source, "expired") })
				awaitHeld(t, 30*time.Second, map[string]map[string]int{target: onEvery(0, backends...)})
			}
		})
	}
}
