package controllink

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

func TestExpiresIn(t *testing.T) {
	tests := []struct {
		name       string
		queueTTL   time.Duration
		expiration string
		want       time.Duration
		wantOK     bool
	}{
		{name: "neither", wantOK: false},
		{name: "queue TTL only", queueTTL: 200 * time.Millisecond, want: 200 * time.Millisecond, wantOK: true},
		{name: "expiration only", expiration: "1500", want: 1500 * time.Millisecond, wantOK: true},
		{name: "expiration shorter", queueTTL: time.Second, expiration: "300", want: 300 * time.Millisecond, wantOK: true},
		{name: "queue TTL shorter", queueTTL: 100 * time.Millisecond, expiration: "300", want: 100 * time.Millisecond, wantOK: true},
		{name: "expiration zero expires at once", queueTTL: time.Second, expiration: "0", want: 0, wantOK: true},
		{name: "malformed expiration ignored", queueTTL: time.Second, expiration: "soon", want: time.Second, wantOK: true},
		{name: "negative expiration ignored", expiration: "-5", wantOK: false},
		{name: "expiration beyond RabbitMQ's range ignored", expiration: "4294967296", wantOK: false},
		{name: "largest expiration", expiration: "4294967295", want: maxTTL, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := expiresIn(tt.queueTTL, tt.expiration)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("expiresIn(%v, %q) = %v, %v; want %v, %v", tt.queueTTL, tt.expiration, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestQueueTTL(t *testing.T) {
	tests := []struct {
		name string
		args amqp.Table
		want time.Duration
	}{
		{name: "no arguments", args: nil, want: 0},
		{name: "no TTL", args: amqp.Table{"x-max-length": int32(5)}, want: 0},
		{name: "int32 (signed 32-bit, as clients send it)", args: amqp.Table{"x-message-ttl": int32(200)}, want: 200 * time.Millisecond},
		{name: "int64", args: amqp.Table{"x-message-ttl": int64(60000)}, want: time.Minute},
		{name: "int16", args: amqp.Table{"x-message-ttl": int16(10)}, want: 10 * time.Millisecond},
		{name: "int8", args: amqp.Table{"x-message-ttl": int8(7)}, want: 7 * time.Millisecond},
		{name: "uint32", args: amqp.Table{"x-message-ttl": uint32(5)}, want: 5 * time.Millisecond},
		{name: "zero is none", args: amqp.Table{"x-message-ttl": int32(0)}, want: 0},
		{name: "negative is none", args: amqp.Table{"x-message-ttl": int32(-1)}, want: 0},
		{name: "beyond RabbitMQ's range is none", args: amqp.Table{"x-message-ttl": int64(1 << 32)}, want: 0},
		{name: "a string is none", args: amqp.Table{"x-message-ttl": "200"}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := QueueTTL(tt.args); got != tt.want {
				t.Errorf("QueueTTL(%v) = %v, want %v", tt.args, got, tt.want)
			}
		})
	}
}

func TestExpiryQueueOrder(t *testing.T) {
	base := time.Unix(1000, 0)
	var q expiryQueue
	for i, ms := range []int{50, 10, 30, 10, 40, 20} {
		q.add(expiring{at: base.Add(time.Duration(ms) * time.Millisecond), tag: uint64(i + 1)})
	}
	if next, _ := q.next(); !next.Equal(base.Add(10 * time.Millisecond)) {
		t.Errorf("next() = %v, want %v", next, base.Add(10*time.Millisecond))
	}
	var got []uint64
	for _, e := range q.due(base.Add(30 * time.Millisecond)) {
		got = append(got, e.tag)
	}
	if want := []uint64{2, 4, 6, 3}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("due at +30ms: tags %v, want %v (earliest first, ties by tag)", got, want)
	}
	if q.Len() != 2 {
		t.Errorf("%d left after due, want 2", q.Len())
	}
}

// TestScheduleExpiryKeepsTheFirstExpiry: a message that comes again after
// it was given back (its broker had not expired it yet) is not given a
// fresh TTL but retried soon.
func TestScheduleExpiryKeepsTheFirstExpiry(t *testing.T) {
	tr := &Trimmer{
		opts:      TrimmerOptions{MessageTTL: time.Second, Retry: 50 * time.Millisecond},
		held:      make(map[mirror.MessageID]uint64),
		byContent: make(map[mirror.MessageID][]uint64),
		deadlines: make(map[mirror.MessageID]time.Time),
	}
	now := time.Unix(1000, 0)
	id := messageID(1)
	tr.held[id] = 1
	tr.scheduleExpiry(1, id, false, time.Second, now)
	first := now.Add(time.Second + expirySlack)
	if next, _ := tr.nextExpiry(); !next.Equal(first) {
		t.Fatalf("first expiry %v, want %v", next, first)
	}
	if n := tr.expireDue(first.Add(-time.Millisecond)); n != 0 {
		t.Errorf("gave back %d before the expiry, want 0", n)
	}
	later := first
	if n := tr.expireDue(later); n != 1 || len(tr.toNack) != 1 || tr.toNack[0] != 1 {
		t.Fatalf("at the expiry gave back %d (nacks %v), want tag 1", n, tr.toNack)
	}
	if tr.Holds(id) {
		t.Errorf("still holds the message it gave back")
	}
	// The broker delivers it again: its clock says it has not expired.
	tr.held[id] = 2
	tr.scheduleExpiry(2, id, false, time.Second, later.Add(time.Millisecond))
	if next, want := func() time.Time { n, _ := tr.nextExpiry(); return n }(), later.Add(time.Millisecond+50*time.Millisecond); !next.Equal(want) {
		t.Errorf("redelivered expiry %v, want %v (after Retry, not a new TTL)", next, want)
	}
	// Settled at the master: the stale entry is skipped, nothing given back.
	tr.Settle(id)
	if n := tr.expireDue(later.Add(time.Minute)); n != 0 {
		t.Errorf("gave back %d settled messages, want 0", n)
	}
	if len(tr.deadlines) != 0 {
		t.Errorf("deadlines %v remembered after settlement, want none", tr.deadlines)
	}
}

// publishExpiring publishes messages with identities from..to-1; expiration
// gives each one's expiration property ("" for none).
func publishExpiring(t *testing.T, conn *amqp.Connection, queue string, from, to int, expiration func(n int) string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for n := from; n < to; n++ {
		id := messageID(n)
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			Headers:    amqp.Table{mirror.IdentityHeader: string(id[:])},
			Body:       []byte(fmt.Sprint(n)),
			Expiration: expiration(n),
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish %d not confirmed: %v %v", n, ok, err)
		}
	}
}

// deadLettered takes every message from queue and counts them by identity,
// checking that each was dead-lettered from source for reason ("expired",
// "rejected").
func deadLettered(t *testing.T, conn *amqp.Connection, queue, source, reason string) map[int]int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	got := make(map[int]int)
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return got
		}
		value, _ := d.Headers[mirror.IdentityHeader].(string)
		id, _ := mirror.ParseMessageID(value)
		got[int(binary.BigEndian.Uint64(id[8:]))]++
		if d.Headers["x-first-death-queue"] != source || d.Headers["x-first-death-reason"] != reason {
			t.Errorf("message %s: x-first-death-queue %v, x-first-death-reason %v; want %s, %s",
				d.Body, d.Headers["x-first-death-queue"], d.Headers["x-first-death-reason"], source, reason)
		}
	}
}

// TestTrimmerGivesBackExpiredMessages: on a real broker, held messages
// whose TTL passed leave the slave copy and are dead-lettered there, once
// each; messages settled at the master first, or not expiring, are not.
func TestTrimmerGivesBackExpiredMessages(t *testing.T) {
	const total = 10
	tests := []struct {
		name       string
		queueTTL   int32         // the slave copy's x-message-ttl, ms; 0 for none
		trimmerTTL time.Duration // what the trimmer is told
		expiration func(n int) string
		settle     []int // settled at the master before they expire
		// delivered are delivered by the master to a client before they
		// expire; the client acks lateAcked and requeues lateRequeued
		// after they expired.
		delivered, lateAcked, lateRequeued []int
		want                               map[int]int // dead-lettered, by identity
		wantHeld                           int
		retried                            bool // some are given back more than once
	}{
		{
			name:     "queue TTL",
			queueTTL: 300, trimmerTTL: 300 * time.Millisecond,
			expiration: func(int) string { return "" },
			settle:     []int{0, 1, 2},
			want:       map[int]int{3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1},
		},
		{
			name:       "per-message expiration",
			expiration: func(n int) string { return map[bool]string{true: "300", false: ""}[n%2 == 0] },
			want:       map[int]int{0: 1, 2: 1, 4: 1, 6: 1, 8: 1},
			wantHeld:   total / 2,
		},
		{
			// The trimmer gives them back before the broker's clock says
			// they expired: it delivers them again, and the trimmer holds
			// them and retries until the broker expires them, once.
			name:     "given back early",
			queueTTL: 1000, trimmerTTL: 100 * time.Millisecond,
			expiration: func(int) string { return "" },
			want:       map[int]int{0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1},
			retried:    true,
		},
		{
			// The master's broker never expires what it delivered: acked
			// after its TTL, a message is dead-lettered nowhere.
			name:     "delivered before the TTL, acked after it",
			queueTTL: 300, trimmerTTL: 300 * time.Millisecond,
			expiration: func(int) string { return "" },
			delivered:  []int{0, 1, 2, 3, 4},
			lateAcked:  []int{0, 1, 2, 3, 4},
			want:       map[int]int{5: 1, 6: 1, 7: 1, 8: 1, 9: 1},
		},
		{
			// Requeued after its TTL, the master's copy expires at once:
			// so do the slaves'.
			name:     "delivered before the TTL, requeued after it",
			queueTTL: 300, trimmerTTL: 300 * time.Millisecond,
			expiration:   func(int) string { return "" },
			delivered:    []int{0, 1, 2, 3, 4},
			lateRequeued: []int{0, 1, 2, 3, 4},
			want:         map[int]int{0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t)
			target := declare(t, conn)
			args := amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target}
			if tt.queueTTL > 0 {
				args["x-message-ttl"] = tt.queueTTL
			}
			source := declareWith(t, conn, args)
			tr, err := startTapped(t, source, TrimmerOptions{MessageTTL: tt.trimmerTTL, Retry: 50 * time.Millisecond, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			publishExpiring(t, conn, source, 0, total, tt.expiration)
			for _, n := range tt.settle {
				tr.Settle(messageID(n))
			}
			for _, n := range tt.delivered {
				tr.Delivered(messageID(n))
			}
			if len(tt.lateAcked)+len(tt.lateRequeued) > 0 {
				// Past the TTL: the rest are given back and dead-lettered,
				// the delivered ones held.
				testutil.Eventually(t, 20*time.Second, func() error {
					ready, err := readyCount(conn, target)
					if err != nil {
						return err
					}
					if held, _ := tr.Stats(); held != len(tt.delivered) || ready != total-len(tt.delivered) {
						return fmt.Errorf("trimmer holds %d, %d dead-lettered; want %d, %d", held, ready, len(tt.delivered), total-len(tt.delivered))
					}
					return nil
				})
				time.Sleep(2 * tt.trimmerTTL) // nothing more is given back
				for _, n := range tt.lateAcked {
					tr.Settle(messageID(n))
				}
				for _, n := range tt.lateRequeued {
					tr.Requeued(messageID(n))
				}
			}
			testutil.Eventually(t, 20*time.Second, func() error {
				ready, err := readyCount(conn, target)
				if err != nil {
					return err
				}
				if held, waiting := tr.Stats(); held != tt.wantHeld || waiting != 0 || ready != len(tt.want) {
					return fmt.Errorf("trimmer holds %d, %d waiting, %d dead-lettered; want %d, 0, %d", held, waiting, ready, tt.wantHeld, len(tt.want))
				}
				return nil
			})
			given := tr.GivenBack()
			if tt.retried && given <= int64(len(tt.want)) {
				t.Errorf("gave back %d deliveries, want more than %d (the broker delivers them again until they expire by its clock)", given, len(tt.want))
			}
			if given < int64(len(tt.want)) {
				t.Errorf("gave back %d deliveries, want at least %d", given, len(tt.want))
			}
			if got := tr.ChannelsLost(); got != 0 {
				t.Errorf("the broker closed %d trimmer channels, want 0", got)
			}
			tr.Close()
			if left := remaining(t, conn, source); len(left) != tt.wantHeld {
				t.Errorf("%d messages left on the slave (%v), want %d", len(left), left, tt.wantHeld)
			}
			if got := deadLettered(t, conn, target, source, "expired"); !maps.Equal(got, tt.want) {
				t.Errorf("dead-lettered %v, want %v", got, tt.want)
			}
		})
	}
}

func declareWith(t *testing.T, conn *amqp.Connection, args amqp.Table) string {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclare("", false, false, false, false, args)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			c.QueueDelete(q.Name, false, false, false)
			c.Close()
		}
	})
	return q.Name
}
