package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// These tests drive the proxy's mirroring data path (declares on every
// copy, publishes fanned out, confirms across copies, deliveries from the
// master with the identity header removed, acks reported for trimming)
// against the three real brokers, with a fixed placement in place of the
// replication engine: every queue is mastered on the first node with the
// other two as synchronised slaves. The engine itself is tested in
// mirror/engine and end to end through the binary in mirror_test.go.

// fixedPlacement is a proxy.Mirror that places every queue on all backends,
// the first as master, and records what the proxy tells it.
type fixedPlacement struct {
	backends []string

	mu       sync.Mutex
	queues   map[mirror.QueueID]mirror.QueueMeta
	settled  map[mirror.QueueID][]mirror.MessageID
	deleted  []mirror.QueueID
	purged   []mirror.QueueID
	bindings map[mirror.QueueID][]mirror.Binding
	// refuseBindings makes every binding record fail, as a metadata log
	// without a leader would.
	refuseBindings bool
}

func newFixedPlacement(backends ...string) *fixedPlacement {
	return &fixedPlacement{
		backends: backends,
		queues:   make(map[mirror.QueueID]mirror.QueueMeta),
		settled:  make(map[mirror.QueueID][]mirror.MessageID),
		bindings: make(map[mirror.QueueID][]mirror.Binding),
	}
}

func (m *fixedPlacement) Lookup(id mirror.QueueID) (mirror.QueueMeta, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q, ok := m.queues[id]
	return q, ok
}

func (m *fixedPlacement) Resolve(_ context.Context, id mirror.QueueID) (mirror.QueueMeta, bool, error) {
	q, ok := m.Lookup(id)
	return q, ok, nil
}

func (m *fixedPlacement) Place(_ context.Context, q mirror.QueueMeta, _ string) (mirror.QueueMeta, error) {
	q.Master = m.backends[0]
	for _, b := range m.backends[1:] {
		q.Slaves = append(q.Slaves, mirror.Slave{Backend: b, Synchronised: true})
	}
	return q, nil
}

func (m *fixedPlacement) Declared(_ context.Context, q mirror.QueueMeta) (mirror.QueueMeta, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	q.Version = 1 // recorded (version 0 is a queue the log does not record)
	m.queues[q.ID] = q
	return q, nil
}

func (m *fixedPlacement) Deleted(_ context.Context, id mirror.QueueID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.queues, id)
	m.deleted = append(m.deleted, id)
}

func (m *fixedPlacement) Purged(_ context.Context, id mirror.QueueID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.purged = append(m.purged, id)
}

func (m *fixedPlacement) Bound(_ context.Context, id mirror.QueueID, b mirror.Binding, bound bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refuseBindings {
		return errNoLeader
	}
	if bound {
		m.bindings[id] = append(m.bindings[id], b)
	}
	return nil
}

func (m *fixedPlacement) Settle(id mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome) {
	if outcome != mirror.Acked && outcome != mirror.Rejected {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settled[id] = append(m.settled[id], ids...)
}

func (m *fixedPlacement) BackendDown(string) bool { return false }

// The placement never changes behind the proxy's back: always current.
func (m *fixedPlacement) Current() bool                      { return true }
func (m *fixedPlacement) AwaitCurrent(context.Context) error { return nil }

// No backend is known to run a direct reply-to name's node: replies are
// dropped.
func (m *fixedPlacement) ReplyBackend(context.Context, string) (string, bool) { return "", false }

// One proxy alone: nobody else delivers.
func (m *fixedPlacement) Clustered() bool { return false }
func (m *fixedPlacement) DeliveredByPeers(context.Context, mirror.QueueID, uint64) ([]mirror.MessageID, error) {
	return nil, nil
}

func (m *fixedPlacement) Missed(string, *mirror.QueueID) {}

// No exchange is recorded: every exchange publish goes to every backend.
func (m *fixedPlacement) LookupExchange(mirror.ExchangeID) (mirror.ExchangeMeta, bool) {
	return mirror.ExchangeMeta{}, false
}
func (m *fixedPlacement) ExchangeAbsent(context.Context, mirror.ExchangeID) []string { return nil }
func (m *fixedPlacement) ExchangeDeclared(context.Context, mirror.ExchangeMeta)      {}
func (m *fixedPlacement) ExchangeDeleted(context.Context, mirror.ExchangeID)         {}
func (m *fixedPlacement) ExchangeBound(context.Context, mirror.ExchangeID, mirror.ExchangeBinding, bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refuseBindings {
		return errNoLeader
	}
	return nil
}

var errNoLeader = fmt.Errorf("recording the binding: %w", store.ErrNotLeader)

func (m *fixedPlacement) BoundUnrecorded(context.Context, mirror.ExchangeID, string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refuseBindings {
		return errNoLeader
	}
	return nil
}
func (m *fixedPlacement) Routing() *mirror.RoutingTable { return nil }

// Holds: every copy of every queue is the master or a synchronised slave,
// for ever (nothing here records a loss).
func (m *fixedPlacement) Holds(_ string, queue *mirror.QueueID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if queue == nil {
		return len(m.queues) > 0
	}
	_, ok := m.queues[*queue]
	return ok
}

func (m *fixedPlacement) settledIDs(id mirror.QueueID) []mirror.MessageID {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]mirror.MessageID(nil), m.settled[id]...)
}

// startFanoutProxy runs a proxy in front of the three shared nodes with a
// fixedPlacement, the first node being home.
func startFanoutProxy(t *testing.T) (string, *fixedPlacement) {
	t.Helper()
	nodes := cluster.Nodes()
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	placement := newFixedPlacement(names...)
	url, _ := startProxy(t, nodes[0], func(o *proxy.Options) {
		for _, n := range nodes[1:] {
			o.Others = append(o.Others, proxy.Backend{Name: n.Name, Addr: nodeAddr(n)})
		}
		o.Mirror = placement
	})
	return url, placement
}

// queueDepth asks node directly how many ready messages queue holds.
func queueDepth(t *testing.T, n *localbroker.Node, queue string) int {
	t.Helper()
	conn := dial(t, n)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel on %s: %v", n.Name, err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare of %q on %s: %v", queue, n.Name, err)
	}
	return q.Messages
}

func TestFanoutDeclarePublishConsume(t *testing.T) {
	url, placement := startFanoutProxy(t)
	conn := dialURL(t, url)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const queue = "fanout-basic"
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	t.Cleanup(func() {
		for _, n := range cluster.Nodes() {
			c := dial(t, n)
			if ch, err := c.Channel(); err == nil {
				ch.QueueDelete(queue, false, false, false)
			}
			c.Close()
		}
	})
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 200))
	const total = 100
	ctx := testContext(t, 30*time.Second)
	for i := 0; i < total; i++ {
		msg := amqp.Publishing{Body: []byte(fmt.Sprintf("m%d", i))}
		if i%2 == 0 {
			msg.Headers = amqp.Table{"n": int32(i)}
		}
		if err := ch.PublishWithContext(ctx, "", queue, false, false, msg); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	for i := 0; i < total; i++ {
		select {
		case c := <-confirms:
			if !c.Ack {
				t.Fatalf("publish %d nacked", c.DeliveryTag)
			}
		case <-ctx.Done():
			t.Fatalf("only %d of %d confirms arrived", i, total)
		}
	}
	for _, n := range cluster.Nodes() {
		if got := queueDepth(t, n, queue); got != total {
			t.Errorf("%s holds %d messages, want %d", n.Name, got, total)
		}
	}

	if err := ch.Qos(60, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	for i := 0; i < 60; i++ {
		select {
		case d := <-deliveries:
			want := fmt.Sprintf("m%d", i)
			if string(d.Body) != want {
				t.Fatalf("delivery %d: body %q, want %q", i, d.Body, want)
			}
			if i%2 == 0 {
				if len(d.Headers) != 1 || d.Headers["n"] != int32(i) {
					t.Errorf("delivery %d: headers %v, want exactly n=%d", i, d.Headers, i)
				}
			} else if d.Headers != nil {
				t.Errorf("delivery %d: published without headers, got %v", i, d.Headers)
			}
			if err := d.Ack(false); err != nil {
				t.Fatalf("ack: %v", err)
			}
		case <-ctx.Done():
			t.Fatalf("delivery %d did not arrive", i)
		}
	}
	id := mirror.QueueID{VHost: "/", Name: queue}
	waitFor(t, func() error {
		if got := len(placement.settledIDs(id)); got != 60 {
			return fmt.Errorf("settled %d identities, want 60", got)
		}
		return nil
	})
	seen := map[mirror.MessageID]bool{}
	for _, m := range placement.settledIDs(id) {
		if seen[m] {
			t.Errorf("identity %s settled twice", m)
		}
		seen[m] = true
	}
}

func waitFor(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestFanoutChannelErrorFromEveryBackend(t *testing.T) {
	url, _ := startFanoutProxy(t)
	conn := dialURL(t, url)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err = ch.PublishWithContext(testContext(t, 5*time.Second), "no-such-exchange-fanout", "k", false, false, amqp.Publishing{Body: []byte("x")})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp.NotFound {
			t.Fatalf("channel closed with %v, want 404 NOT_FOUND", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("channel not closed")
	}
	// The connection serves on: a new channel works on every backend.
	ch2, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel after the error: %v", err)
	}
	if err := ch2.ExchangeDeclare("fanout-ex", "direct", false, true, false, false, nil); err != nil {
		t.Fatalf("exchange declare: %v", err)
	}
	for _, n := range cluster.Nodes() {
		c := dial(t, n)
		xch, _ := c.Channel()
		if err := xch.ExchangeDeclarePassive("fanout-ex", "direct", false, true, false, false, nil); err != nil {
			t.Errorf("exchange missing on %s: %v", n.Name, err)
		}
		c.Close()
	}
	// An inequivalent redeclare fails on every backend: one close reaches the client.
	closed2 := ch2.NotifyClose(make(chan *amqp.Error, 1))
	err = ch2.ExchangeDeclare("fanout-ex", "fanout", false, true, false, false, nil)
	if e, ok := err.(*amqp.Error); !ok || e.Code != amqp.PreconditionFailed {
		t.Fatalf("redeclare: got %v, want 406", err)
	}
	<-closed2
	if conn.IsClosed() {
		t.Fatal("connection closed by a channel error")
	}
}

// A binding the brokers made but the metadata log could not record closes
// the client's channel with 541 instead of answering bind-ok: the proxies
// route publishes by the log, so the client must not take the queue as
// bound. The connection stays, and the bind works again once recorded.
func TestFanoutBindingNotRecordedClosesTheChannel(t *testing.T) {
	url, placement := startFanoutProxy(t)
	conn := dialURL(t, url)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const queue, exchange = "fanout-unrecorded-binding", "fanout-unrecorded-binding-x"
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	if err := ch.ExchangeDeclare(exchange, "direct", false, false, false, false, nil); err != nil {
		t.Fatalf("exchange declare: %v", err)
	}
	t.Cleanup(func() {
		for _, n := range cluster.Nodes() {
			c := dial(t, n)
			if ch, err := c.Channel(); err == nil {
				ch.QueueDelete(queue, false, false, false)
				ch.ExchangeDelete(exchange, false, false)
			}
			c.Close()
		}
	})
	placement.mu.Lock()
	placement.refuseBindings = true
	placement.mu.Unlock()
	for _, bind := range []struct {
		name string
		do   func(ch *amqp.Channel) error
	}{
		{"queue.bind", func(ch *amqp.Channel) error { return ch.QueueBind(queue, "k", exchange, false, nil) }},
		{"queue.bind of an exclusive queue", func(ch *amqp.Channel) error {
			q, err := ch.QueueDeclare("", false, true, true, false, nil)
			if err != nil {
				return fmt.Errorf("declaring the exclusive queue: %w", err)
			}
			return ch.QueueBind(q.Name, "k", exchange, false, nil)
		}},
		{"exchange.bind", func(ch *amqp.Channel) error { return ch.ExchangeBind(exchange, "k", "amq.direct", false, nil) }},
	} {
		err := bind.do(ch)
		var amqpErr *amqp.Error
		if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.InternalError || !strings.Contains(amqpErr.Reason, "could not be recorded") {
			t.Errorf("%s with the log refusing: err = %v, want 541 naming the unrecorded binding", bind.name, err)
		}
		if conn.IsClosed() {
			t.Fatalf("%s closed the connection, want only the channel closed", bind.name)
		}
		if ch, err = conn.Channel(); err != nil {
			t.Fatal(err)
		}
	}
	placement.mu.Lock()
	placement.refuseBindings = false
	placement.mu.Unlock()
	if err := ch.QueueBind(queue, "k", exchange, false, nil); err != nil {
		t.Errorf("queue.bind once the log records it: %v", err)
	}
}
