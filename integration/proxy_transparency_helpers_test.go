package integration

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// Helpers of the transparency scenarios: connections, queues, error texts and a
// tap that reads confirms off the wire.

// Helpers.

func dialWithConfig(t *testing.T, url string, config amqp.Config) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(url, config)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// declareSessionQueue declares an exclusive queue: it lives as long as its connection.
func declareSessionQueue(t *testing.T, ch *amqp.Channel, args amqp.Table) string {
	t.Helper()
	q, err := ch.QueueDeclare(fmt.Sprintf("%s-%d", queueName(t), rand.Uint32()), false, false, true, false, args)
	if err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	return q.Name
}

func publishTo(t *testing.T, ch *amqp.Channel, queue string, p amqp.Publishing) {
	t.Helper()
	if err := ch.Publish("", queue, false, false, p); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// readyCount is the queue's count of messages not yet delivered.
func readyCount(t *testing.T, ch *amqp.Channel, queue string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, false, true, true, false, nil)
	if err != nil {
		t.Fatalf("passive queue.declare %s: %v", queue, err)
	}
	return q.Messages
}

func awaitCloseNotice(t *testing.T, closed <-chan *amqp.Error) *amqp.Error {
	t.Helper()
	select {
	case err := <-closed:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("not closed within 10s")
	}
	return nil
}

func errorOnly[T any](_ T, err error) error { return err }

// describeError renders an error as a client sees it: for an AMQP error its code, text and who
// raised it, nothing that changes between runs.
func describeError(err error) string {
	var amqpErr *amqp.Error
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &amqpErr):
		return fmt.Sprintf("error %d %q server %v recover %v", amqpErr.Code, amqpErr.Reason, amqpErr.Server, amqpErr.Recover)
	default:
		return fmt.Sprintf("error %T %v", err, err)
	}
}

// flattenTable lists a table's fields as "prefix.key = type value", nested tables expanded,
// sorted by key.
func flattenTable(prefix string, table amqp.Table) []string {
	keys := make([]string, 0, len(table))
	for k := range table {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var lines []string
	for _, k := range keys {
		if nested, ok := table[k].(amqp.Table); ok {
			lines = append(lines, flattenTable(prefix+k+".", nested)...)
			continue
		}
		lines = append(lines, fmt.Sprintf("%s%s = %T %v", prefix, k, table[k], table[k]))
	}
	return lines
}

// wireTap keeps every byte a server sent to one client, for what the client library hides:
// amqp091-go puts confirms in order and drops duplicates.
type wireTap struct {
	mu       sync.Mutex
	received bytes.Buffer
}

type tappedConn struct {
	net.Conn
	tap *wireTap
}

func (c tappedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.tap.mu.Lock()
	c.tap.received.Write(p[:n])
	c.tap.mu.Unlock()
	return n, err
}

func dialTapped(t *testing.T, url string) (*amqp.Connection, *wireTap) {
	t.Helper()
	tap := &wireTap{}
	conn := dialWithConfig(t, url, amqp.Config{
		Heartbeat: 10 * time.Second,
		Locale:    "en_US",
		Dial: func(network, address string) (net.Conn, error) {
			c, err := net.DialTimeout(network, address, 10*time.Second)
			if err != nil {
				return nil, err
			}
			return tappedConn{Conn: c, tap: tap}, nil
		},
	})
	return conn, tap
}

// confirmCoverage reads the basic.ack and basic.nack frames the server sent and says how
// often each of the publishes 1..count was confirmed: exactly once is right.
func (w *wireTap) confirmCoverage(count int) string {
	w.mu.Lock()
	received := bytes.Clone(w.received.Bytes())
	w.mu.Unlock()
	times := make([]int, count+1)
	nacked := 0
	confirm := func(tag uint64, multiple, nack bool) {
		from := tag
		if multiple {
			from = 1
		}
		for seq := from; seq <= tag && seq <= uint64(count); seq++ {
			if multiple && times[seq] > 0 {
				continue // a multiple confirm covers only what was still open
			}
			times[seq]++
			if nack {
				nacked++
			}
		}
	}
	reader := frames.NewReader(bytes.NewReader(received), 64<<10)
	for {
		f, err := reader.ReadFrame()
		if err != nil {
			break
		}
		if f.Type != frames.FrameMethod || f.Channel == 0 {
			continue
		}
		m, err := frames.DecodeMethod(f.Payload)
		if err != nil {
			continue
		}
		switch m := m.(type) {
		case *frames.BasicAck:
			confirm(m.DeliveryTag, m.Multiple, false)
		case *frames.BasicNack:
			confirm(m.DeliveryTag, m.Multiple, true)
		}
	}
	histogram := map[int]int{}
	for _, n := range times[1:] {
		histogram[n]++
	}
	return fmt.Sprintf("on the wire: %d confirmed once, %d never, %d more than once; %d nacks",
		histogram[1], histogram[0], count-histogram[1]-histogram[0], nacked)
}

// recordChannelEnd closes ch unless the broker already closed it (as closed
// reports), and records how it ended and how many messages queue still has.
func recordChannelEnd(t *testing.T, j *journal, conn *amqp.Connection, ch *amqp.Channel, closed <-chan *amqp.Error, queue string) {
	t.Helper()
	select {
	case err := <-closed:
		j.add("channel closed with %s", describeError(err))
	default:
		j.add("channel close: %s", describeError(ch.Close()))
	}
	j.add("%d ready after the channel closed", readyCount(t, openChannel(t, conn), queue))
}
