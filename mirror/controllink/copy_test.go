package controllink

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// publishRange publishes the messages with identities from..to-1 to each
// queue, as fan-out does to a master and its slaves.
func publishRange(t *testing.T, conn *amqp.Connection, from, to int, queues ...string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Error(err)
		return
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Error(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last *amqp.DeferredConfirmation
	for n := from; n < to; n++ {
		id := messageID(n)
		for _, q := range queues {
			last, err = ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
				Headers:      amqp.Table{mirror.IdentityHeader: string(id[:])},
				DeliveryMode: amqp.Persistent,
				Priority:     uint8(n % 3),
				Body:         []byte(fmt.Sprint(n)),
			})
			if err != nil {
				t.Error(err)
				return
			}
		}
	}
	if ok, err := last.WaitContext(ctx); !ok || err != nil {
		t.Errorf("publishes %d..%d not confirmed: %v %v", from, to, ok, err)
	}
}

func settleRange(from, to int, trimmers ...*Trimmer) {
	for n := from; n < to; n++ {
		for _, tr := range trimmers {
			tr.Settle(messageID(n))
		}
	}
}

// TestCopySynchronisesANewSlave runs a copy from a synchronised slave copy
// to a new, empty one while publishes and settlements go on, and checks the
// two end up holding exactly the same messages: the ones the master still
// holds.
func TestCopySynchronisesANewSlave(t *testing.T) {
	conn := dial(t)
	source, target := declare(t, conn), declare(t, conn)
	publishRange(t, conn, 0, 500, source) // the backlog before the new slave joined

	trimSource, err := startTapped(t, source, TrimmerOptions{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer trimSource.Close()
	// The settlements of messages the copy no longer brings are forgotten
	// after ForgetAfter; the test makes it short.
	trimTarget, err := startTapped(t, target, TrimmerOptions{ForgetAfter: time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer trimTarget.Close()
	settleRange(0, 100, trimSource, trimTarget) // the master settled these before the copy

	trimTarget.ExpectCopies(true)
	var during sync.WaitGroup
	during.Add(1)
	go func() {
		// The queue keeps serving while it is copied: new publishes reach
		// both copies, and the master settles old and new messages.
		defer during.Done()
		publishRange(t, conn, 500, 600, source, target)
		settleRange(100, 150, trimSource, trimTarget)
		settleRange(500, 520, trimSource, trimTarget)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	copied, err := trimSource.CopyTo(ctx, dial(t), target, 64)
	if err != nil {
		t.Fatalf("CopyTo: %v", err)
	}
	during.Wait()
	trimTarget.ExpectCopies(false)
	t.Logf("copied %d messages", copied)
	if copied < 350 {
		t.Errorf("copied %d messages, want at least the 350 the master settled at no point", copied)
	}

	want := make(map[int]bool)
	for n := 150; n < 600; n++ {
		if n < 500 || n >= 520 {
			want[n] = true
		}
	}
	for name, tr := range map[string]*Trimmer{"source": trimSource, "target": trimTarget} {
		testutil.Eventually(t, 20*time.Second, func() error {
			if held, waiting := tr.Stats(); held != len(want) || waiting != 0 {
				return fmt.Errorf("%s trimmer holds %d (want %d), %d settlements wait (want 0)", name, held, len(want), waiting)
			}
			return nil
		})
	}
	trimSource.Close()
	trimTarget.Close()
	for name, queue := range map[string]string{"source": source, "target": target} {
		got := remaining(t, conn, queue)
		if !maps.Equal(got, want) {
			t.Errorf("%s holds %d messages, want %d; extra %v, missing %v", name, len(got), len(want),
				difference(got, want), difference(want, got))
		}
	}
}

func TestCopyEndsWithItsContext(t *testing.T) {
	conn := dial(t)
	source := declare(t, conn)
	tr, err := startTapped(t, source, TrimmerOptions{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tr.CopyTo(ctx, dial(t), declare(t, conn), 10); err == nil {
		t.Fatal("a copy with a cancelled context succeeded")
	}
	// The trimmer still works after a failed copy.
	publishRange(t, conn, 0, 10, source)
	settleRange(0, 10, tr)
	testutil.Eventually(t, 10*time.Second, func() error {
		if held, waiting := tr.Stats(); held != 0 || waiting != 0 {
			return fmt.Errorf("trimmer holds %d, %d waiting; want 0, 0", held, waiting)
		}
		return nil
	})
}

// TestCopyEndsWhenItsSourceIsGone: a copy whose source queue disappears
// while it reads (deleted, or its broker lost) ends with an error, so that
// its sync can be tried again, instead of waiting for a marker that will
// never come.
func TestCopyEndsWhenItsSourceIsGone(t *testing.T) {
	conn := dial(t)
	source := declareWithMessages(t, conn, 20000)
	tr, err := startTapped(t, source, TrimmerOptions{Logger: quietLogger(), Retry: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	target := declare(t, conn)
	copied := make(chan error, 1)
	go func() {
		_, err := tr.CopyTo(context.Background(), dial(t), target, 10)
		copied <- err
	}()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	testutil.Eventually(t, 30*time.Second, func() error {
		q, err := ch.QueueDeclarePassive(target, false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == 0 {
			return errors.New("the copy has not begun")
		}
		return nil
	})
	if _, err := ch.QueueDelete(source, false, false, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-copied:
		if err == nil {
			t.Fatal("the copy succeeded although its source was deleted half way")
		}
		t.Logf("the copy ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the copy still waits 30s after its source was deleted")
	}
}

func difference(a, b map[int]bool) []int {
	var out []int
	for n := range a {
		if !b[n] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	if len(out) > 10 {
		out = out[:10]
	}
	return out
}

// TestLeftoverMarkerIsRemoved: a copy that ended before its marker arrived
// leaves the marker in the queue; it must never stay there as a message
// (a promoted slave would deliver it to a client).
func TestLeftoverMarkerIsRemoved(t *testing.T) {
	conn := dial(t)
	queue := declare(t, conn)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	stale := messageID(999999)
	if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{
		Headers: amqp.Table{mirror.IdentityHeader: string(stale[:]), SyncMarkerHeader: true},
	}); err != nil {
		t.Fatal(err)
	}
	publishRange(t, conn, 0, 5, queue)
	tr, err := startTapped(t, queue, TrimmerOptions{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if held, _ := tr.Stats(); held != 5 {
			return fmt.Errorf("trimmer holds %d, want the 5 messages and not the marker", held)
		}
		return nil
	})
	tr.Close()
	if left := remaining(t, conn, queue); len(left) != 5 || left[999999] {
		t.Errorf("queue holds %v after the trimmer, want messages 0-4 only", left)
	}
}

// TestTrimmerSpreadsDeliveriesOverChannels: a trimmer takes at most
// ChannelDeliveries deliveries on one channel and then consumes on a fresh
// one, so that a block it holds for long (a new slave's copied backlog)
// never sits in front of many deliveries acked early on the same channel
// (RabbitMQ walks the unacknowledged deliveries ahead of each ack). Acks
// reach the right channel: what is settled leaves the queue, what is held
// stays, and closing gives the held messages back.
func TestTrimmerSpreadsDeliveriesOverChannels(t *testing.T) {
	const total, block = 1000, 300 // the first block messages are held
	tests := []struct {
		name        string
		perChannel  int
		settleFirst bool // half the later ones are settled before they arrive
	}{
		{name: "a channel per 64 deliveries", perChannel: 64},
		{name: "a channel per delivery", perChannel: 1},
		{name: "settled before arriving", perChannel: 64, settleFirst: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t)
			queue := declare(t, conn)
			later := make([]mirror.MessageID, 0, total-block)
			for n := block; n < total; n++ {
				later = append(later, messageID(n))
			}
			rand.Shuffle(len(later), func(i, j int) { later[i], later[j] = later[j], later[i] })
			tr, err := startTapped(t, queue, TrimmerOptions{ChannelDeliveries: tt.perChannel, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			if tt.settleFirst {
				tr.Settle(later[:len(later)/2]...)
				later = later[len(later)/2:]
			}
			publish(t, conn, queue, total)
			tr.Settle(later...)
			testutil.Eventually(t, 20*time.Second, func() error {
				if held, waiting := tr.Stats(); held != block || waiting != 0 {
					return fmt.Errorf("trimmer holds %d (want %d), %d settled identities not seen yet (want 0)", held, block, waiting)
				}
				return nil
			})
			tr.Close()
			left := remaining(t, conn, queue)
			if len(left) != block {
				t.Errorf("%d messages left on the slave, want the %d held", len(left), block)
			}
			for n := range left {
				if n >= block {
					t.Errorf("message %d was settled but is still on the slave", n)
				}
			}
		})
	}
}
