package controllink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// broker is one real RabbitMQ node, started once for the package. Its
// consumer_timeout is short, so that a trimmer holding messages meets it
// within the test.
var broker *localbroker.Node

const consumerTimeout = 2 * time.Second

func TestMain(m *testing.M) {
	os.Exit(testutil.Main(m, localbroker.Options{
		Names:       []string{"controllink"},
		ExtraConfig: fmt.Sprintf("consumer_timeout = %d\n", consumerTimeout.Milliseconds()),
	}, func(c *localbroker.Cluster) { broker = c.Nodes()[0] }))
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(broker.URL())
	if err != nil {
		t.Fatalf("dial %s: %v", broker.URL(), err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// dialTapped dials the test broker as the watcher dials a backend, and
// returns the connection with its delivery tap (tap.go).
func dialTapped(t *testing.T) (*amqp.Connection, *Tap) {
	t.Helper()
	w := &Watcher{}
	conn, _, err := w.dial(Backend{Name: "test", URL: broker.URL()}, "trimmer test")
	if err != nil {
		t.Fatalf("dial %s: %v", broker.URL(), err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, w.Tap(conn)
}

// startTapped starts a trimmer as the engine does: on a connection the
// watcher dialled, its deliveries taken by the connection's tap.
func startTapped(t *testing.T, queue string, opts TrimmerOptions) (*Trimmer, error) {
	t.Helper()
	conn, tap := dialTapped(t)
	opts.Tap = tap
	return StartTrimmer(conn, queue, opts)
}

func messageID(n int) mirror.MessageID {
	var id mirror.MessageID
	binary.BigEndian.PutUint64(id[8:], uint64(n))
	return id
}

// declareWithMessages declares a fresh queue holding count messages with
// identities 0..count-1.
func declareWithMessages(t *testing.T, conn *amqp.Connection, count int) string {
	t.Helper()
	queue := declare(t, conn)
	publish(t, conn, queue, count)
	return queue
}

func declare(t *testing.T, conn *amqp.Connection) string {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclare("", false, false, false, false, nil)
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

// publish publishes count messages with identities 0..count-1, with
// confirms, so that all are in the queue when it returns.
func publish(t *testing.T, conn *amqp.Connection, queue string, count int) {
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
	for n := range count {
		id := messageID(n)
		confirmation, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			Headers: amqp.Table{mirror.IdentityHeader: string(id[:])},
			Body:    []byte(fmt.Sprint(n)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if n == count-1 {
			if ok, err := confirmation.WaitContext(ctx); !ok || err != nil {
				t.Fatalf("last publish not confirmed: %v %v", ok, err)
			}
		}
	}
}

// remaining returns the identities left in the queue once nothing holds
// them: it consumes everything with a fresh channel and requeues it.
func remaining(t *testing.T, conn *amqp.Connection, queue string) map[int]bool {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	left := make(map[int]bool)
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return left
		}
		value, _ := d.Headers[mirror.IdentityHeader].(string)
		id, _ := mirror.ParseMessageID(value)
		left[int(binary.BigEndian.Uint64(id[8:]))] = true
	}
}

// readyCount is the number of ready messages in the queue (those a trimmer
// holds are not ready).
func readyCount(conn *amqp.Connection, queue string) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	return q.Messages, err
}

func TestTrimmerRemovesSettledMessages(t *testing.T) {
	const total = 1000
	tests := []struct {
		name string
		// settleFirst settles half the identities before their copies
		// reach the slave (the master's ack overtook the slave's copy).
		settleFirst bool
		shuffle     bool // settle out of order: single acks, not one multiple
		recycle     time.Duration
		// untapped reads the deliveries through amqp091-go, as a trimmer
		// on a connection without a tap does.
		untapped bool
	}{
		{name: "in order"},
		{name: "out of order", shuffle: true},
		{name: "settled before the slave copy arrived", settleFirst: true, shuffle: true},
		{name: "recycling while settling", shuffle: true, recycle: 20 * time.Millisecond},
		{name: "in order, through amqp091-go", untapped: true},
		{name: "settled before the slave copy arrived, through amqp091-go", settleFirst: true, shuffle: true, untapped: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t)
			queue := declare(t, conn)
			if !tt.settleFirst {
				publish(t, conn, queue, total)
			}
			settle := make([]int, 0, total)
			for n := range total {
				if n%5 != 0 { // keep every fifth message
					settle = append(settle, n)
				}
			}
			if tt.shuffle {
				rand.Shuffle(len(settle), func(i, j int) { settle[i], settle[j] = settle[j], settle[i] })
			}
			settleAll := func(tr *Trimmer, ns []int) {
				for i := 0; i < len(ns); i += 50 {
					batch := make([]mirror.MessageID, 0, 50)
					for _, n := range ns[i:min(i+50, len(ns))] {
						batch = append(batch, messageID(n))
					}
					tr.Settle(batch...)
				}
			}

			start := startTapped
			if tt.untapped {
				start = func(t *testing.T, queue string, opts TrimmerOptions) (*Trimmer, error) {
					return startTapped(t, queue, opts)
				}
			}
			tr, err := start(t, queue, TrimmerOptions{Recycle: tt.recycle, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			if tt.settleFirst {
				early := settle[:len(settle)/2]
				settle = settle[len(settle)/2:]
				settleAll(tr, early)
				if _, waiting := tr.Stats(); waiting != len(early) {
					t.Errorf("%d identities wait for their copies, want %d", waiting, len(early))
				}
				publish(t, conn, queue, total)
			}
			settleAll(tr, settle)
			want := total / 5
			testutil.Eventually(t, 20*time.Second, func() error {
				held, waiting := tr.Stats()
				if held != want || waiting != 0 {
					return fmt.Errorf("trimmer holds %d (want %d), %d settled identities not seen yet (want 0)", held, want, waiting)
				}
				return nil
			})
			tr.Close()

			left := remaining(t, conn, queue)
			if len(left) != want {
				t.Errorf("%d messages left on the slave, want %d", len(left), want)
			}
			for n := range left {
				if n%5 != 0 {
					t.Errorf("message %d was settled at the master but is still on the slave", n)
				}
			}
		})
	}
}

// TestTrimmerRejectsWhatTheMasterRejected: on a real broker, the copies
// of messages rejected at the master are rejected without requeue, so
// that the slave's broker dead-letters each once; acked ones are not
// dead-lettered, even when one multiple ack covers the rejected tags.
func TestTrimmerRejectsWhatTheMasterRejected(t *testing.T) {
	const total = 20
	tests := []struct {
		name        string
		rejectFirst bool // the rejections reach the trimmer before the copies
	}{
		{name: "rejected after the copies arrived"},
		{name: "rejected before the copies arrived", rejectFirst: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t)
			target := declare(t, conn)
			source := declareWith(t, conn, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target})
			tr, err := startTapped(t, source, TrimmerOptions{Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			var acked, rejected []mirror.MessageID
			want := map[int]int{}
			for n := range total - 2 { // the last two stay held
				if n%3 == 1 {
					rejected = append(rejected, messageID(n))
					want[n] = 1
				} else {
					acked = append(acked, messageID(n))
				}
			}
			settle := func() {
				tr.Reject(rejected...)
				tr.Settle(acked...)
			}
			if tt.rejectFirst {
				settle()
			}
			publish(t, conn, source, total)
			if !tt.rejectFirst {
				testutil.Eventually(t, 10*time.Second, func() error {
					if held, _ := tr.Stats(); held != total {
						return fmt.Errorf("trimmer holds %d, want %d", held, total)
					}
					return nil
				})
				settle()
			}
			testutil.Eventually(t, 20*time.Second, func() error {
				ready, err := readyCount(conn, target)
				if err != nil {
					return err
				}
				if held, waiting := tr.Stats(); held != 2 || waiting != 0 || ready != len(want) {
					return fmt.Errorf("trimmer holds %d, %d waiting, %d dead-lettered; want 2, 0, %d", held, waiting, ready, len(want))
				}
				return nil
			})
			tr.Close()
			if left := remaining(t, conn, source); !maps.Equal(left, map[int]bool{total - 2: true, total - 1: true}) {
				t.Errorf("left on the slave: %v, want the last two", left)
			}
			if got := deadLettered(t, conn, target, source, "rejected"); !maps.Equal(got, want) {
				t.Errorf("dead-lettered %v, want %v", got, want)
			}
		})
	}
}

func TestTrimmerSurvivesConsumerTimeout(t *testing.T) {
	if err := shortenChannelTick(); err != nil {
		t.Fatalf("making the broker check consumer_timeout often: %v", err)
	}
	conn := dial(t)
	queue := declareWithMessages(t, conn, 100)
	trimmerConn := dial(t)

	// Without recycling, the broker closes the trimmer's channel once it
	// held the messages for consumer_timeout; the trimmer consumes again and
	// still trims what is settled afterwards.
	tr, err := StartTrimmer(trimmerConn, queue, TrimmerOptions{Recycle: time.Hour, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	// Let the broker's timeout fire: that is the condition under test. A
	// busy broker checks late, so wait for it rather than a fixed time.
	testutil.Eventually(t, time.Minute, func() error {
		if tr.ChannelsLost() == 0 {
			return errors.New("the broker never closed the trimmer's channel: consumer_timeout was not exercised")
		}
		return nil
	})
	if trimmerConn.IsClosed() {
		t.Fatal("the consumer timeout closed the whole connection")
	}
	for n := range 50 {
		tr.Settle(messageID(n))
	}
	testutil.Eventually(t, 20*time.Second, func() error {
		if held, waiting := tr.Stats(); held != 50 || waiting != 0 {
			return fmt.Errorf("trimmer holds %d, %d waiting; want 50, 0", held, waiting)
		}
		return nil
	})
	tr.Close()
	if n, err := readyCount(conn, queue); err != nil || n != 50 {
		t.Errorf("after close the queue has %d ready messages (%v), want 50", n, err)
	}
}

// shortenChannelTick makes the broker's channels check consumer_timeout
// every 200ms instead of every minute, for channels opened from now on.
func shortenChannelTick() error {
	out, err := exec.Command("/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", broker.ErlangName, "eval",
		"application:set_env(rabbit, channel_tick_interval, 200).").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// TestTrimmerKeysMessagesWithoutIdentityByContent: messages that were on
// the slave before the proxy (no identity header) are trimmed by their
// content identity, and two messages with one body are two messages.
func TestTrimmerKeysMessagesWithoutIdentityByContent(t *testing.T) {
	conn := dial(t)
	queue := declare(t, conn)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	bodies := []string{"a", "b", "b", "c", "d"}
	for _, b := range bodies {
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := startTapped(t, queue, TrimmerOptions{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	testutil.Eventually(t, 10*time.Second, func() error {
		if held, _ := tr.Stats(); held != len(bodies) {
			return fmt.Errorf("trimmer holds %d, want %d", held, len(bodies))
		}
		return nil
	})
	// One "b" and the "c" leave the master; "x" was never on this slave.
	tr.Settle(mirror.ContentID([]byte("b")), mirror.ContentID([]byte("c")), mirror.ContentID([]byte("x")))
	testutil.Eventually(t, 10*time.Second, func() error {
		if held, waiting := tr.Stats(); held != 3 || waiting != 1 {
			return fmt.Errorf("trimmer holds %d, %d waiting; want 3, 1", held, waiting)
		}
		return nil
	})
	if got := tr.Missed(); got != 1 {
		t.Errorf("Missed() = %d, want 1 (the settlement of x)", got)
	}
	tr.Close()
	got := map[string]int{}
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got[string(d.Body)]++
	}
	want := map[string]int{"a": 1, "b": 1, "d": 1}
	if !maps.Equal(got, want) {
		t.Errorf("slave holds %v, want %v", got, want)
	}
}

// TestTrimmerPurge: a purge empties the slave copy although the trimmer
// holds its messages unacknowledged, and trimming goes on afterwards.
func TestTrimmerPurge(t *testing.T) {
	conn := dial(t)
	queue := declareWithMessages(t, conn, 200)
	tr, err := startTapped(t, queue, TrimmerOptions{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	testutil.Eventually(t, 10*time.Second, func() error {
		if held, _ := tr.Stats(); held != 200 {
			return fmt.Errorf("trimmer holds %d, want 200", held)
		}
		return nil
	})
	tr.Settle(messageID(1000)) // waits for a copy the purge makes moot
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	purged, err := tr.Purge(ctx)
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if purged != 200 {
		t.Errorf("purged %d messages, want 200", purged)
	}
	if held, waiting := tr.Stats(); held != 0 || waiting != 0 {
		t.Errorf("after the purge the trimmer holds %d, %d waiting; want 0, 0", held, waiting)
	}
	publish(t, conn, queue, 10)
	tr.Settle(messageID(3))
	testutil.Eventually(t, 10*time.Second, func() error {
		if held, _ := tr.Stats(); held != 9 {
			return fmt.Errorf("trimmer holds %d after new publishes, want 9", held)
		}
		return nil
	})
}

// ackCounter counts the basic.ack frames written on a connection.
// amqp091-go writes each frame it sends with a Write of its own.
type ackCounter struct {
	net.Conn
	acks *atomic.Int64
}

func (c ackCounter) Write(p []byte) (int, error) {
	// A method frame: type 1, channel, size, then class 60 method 80.
	if len(p) >= 11 && p[0] == 1 && binary.BigEndian.Uint16(p[7:]) == 60 && binary.BigEndian.Uint16(p[9:]) == 80 {
		c.acks.Add(1)
	}
	return c.Conn.Write(p)
}

// dialCountingAcks dials the broker with every basic.ack counted in acks.
func dialCountingAcks(t *testing.T, acks *atomic.Int64) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(broker.URL(), amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, 10*time.Second)
			if err != nil {
				return nil, err
			}
			return ackCounter{Conn: c, acks: acks}, nil
		},
	})
	if err != nil {
		t.Fatalf("dial %s: %v", broker.URL(), err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestTrimmerBatchesAcks: settlements that come one by one, as client acks
// do, reach the slave's broker as a few multiple acks, not one ack each.
// (The package's broker has a 2 s consumer_timeout: the delays stay well
// inside it.)
func TestTrimmerBatchesAcks(t *testing.T) {
	const total = 1000
	tests := []struct {
		name    string
		opts    TrimmerOptions
		settle  int
		spread  bool // a 1ms pause after every 20 settlements, as a consumer's acks come
		minAcks int64
		maxAcks int64
	}{
		// Settled over tens of milliseconds, inside one AckDelay: the
		// first AckBatch (512) at once, the rest when AckDelay has passed
		// (one more if a slow machine straddles it). One ack each would be
		// 50 frames: one per pause.
		{name: "within one AckDelay", opts: TrimmerOptions{AckDelay: 500 * time.Millisecond}, settle: total, spread: true, minAcks: 1, maxAcks: 3},
		// An AckDelay that never passes within the test: a full batch
		// goes at once, in one frame.
		{name: "a full batch goes at once", opts: TrimmerOptions{AckDelay: time.Hour, AckBatch: 100}, settle: 100, minAcks: 1, maxAcks: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t)
			queue := declareWithMessages(t, conn, total)
			var acks atomic.Int64
			opts := tt.opts
			opts.Logger = quietLogger()
			tr, err := StartTrimmer(dialCountingAcks(t, &acks), queue, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			testutil.Eventually(t, 10*time.Second, func() error {
				if held, _ := tr.Stats(); held != total {
					return fmt.Errorf("trimmer holds %d, want %d", held, total)
				}
				return nil
			})
			for n := range tt.settle {
				tr.Settle(messageID(n))
				if tt.spread && n%20 == 19 {
					time.Sleep(time.Millisecond) // settlements spread over time: the condition under test
				}
			}
			testutil.Eventually(t, 10*time.Second, func() error {
				if n := tr.decided(); n != 0 {
					return fmt.Errorf("%d acks not sent yet", n)
				}
				// flush takes the decided acks before it writes their
				// frames: the count lags decided by that much.
				if got := acks.Load(); got < tt.minAcks {
					return fmt.Errorf("%d basic.ack frames written, want at least %d", got, tt.minAcks)
				}
				return nil
			})
			if got := acks.Load(); got < tt.minAcks || got > tt.maxAcks {
				t.Errorf("the trimmer sent %d basic.ack frames for %d settlements, want %d to %d", got, tt.settle, tt.minAcks, tt.maxAcks)
			}
			tr.Close()
			if left := remaining(t, conn, queue); len(left) != total-tt.settle {
				t.Errorf("%d messages left on the slave, want %d", len(left), total-tt.settle)
			}
		})
	}
}
