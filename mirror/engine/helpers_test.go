package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// brokers are three independent RabbitMQ nodes, started once for the
// package: rabbit1, rabbit2, rabbit3.
var brokers *localbroker.Cluster

func TestMain(m *testing.M) {
	os.Exit(testutil.Main(m, localbroker.Options{Nodes: 3}, func(c *localbroker.Cluster) { brokers = c }))
}

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// failureLogger is quietLogger, except that what the engine and the
// watcher logged is shown when the test fails: a failure on a loaded
// machine is then read from its log rather than guessed at.
func failureLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return quietLogger()
	}
	log := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the engine's and the watcher's log:\n%s", log.String())
		}
	})
	return slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// lockedBuffer is a log that goroutines write while a cleanup reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// harness is an engine on the three brokers, as serve builds it.
type harness struct {
	engine   *Engine
	store    *store.Store
	policies *config.PolicyStore
	watcher  *controllink.Watcher
	dir      string // the store's directory
}

func backendsOf(c *localbroker.Cluster) []controllink.Backend {
	var out []controllink.Backend
	for _, n := range c.Nodes() {
		out = append(out, controllink.Backend{Name: n.Name, URL: n.URL()})
	}
	return out
}

// newHarness starts an engine with its own store in dir ("" for a new
// one) and policies.
func newHarness(t *testing.T, dir string, policies *config.PolicyStore) *harness {
	t.Helper()
	return newHarnessWith(t, dir, policies, nil)
}

// newHarnessWith is newHarness with the engine's options changed by change
// (a cluster's Node and Peers, say) before it starts.
func newHarnessWith(t *testing.T, dir string, policies *config.PolicyStore, change func(*Options)) *harness {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	if policies == nil {
		var err error
		if policies, err = config.OpenPolicyStore("", nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	h := &harness{policies: policies, dir: dir}
	logger := failureLogger(t)
	var err error
	h.store, err = store.Open(store.Config{Dir: dir, NodeID: "test", Logger: quietLogger(), ElectionTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.store.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	h.watcher = controllink.NewWatcher(backendsOf(brokers), controllink.WatcherOptions{Logger: logger})
	options := Options{
		Backends: backendsOf(brokers),
		Store:    h.store,
		Policies: policies,
		Watcher:  h.watcher,
		Logger:   logger,
		Interval: 200 * time.Millisecond,
	}
	if change != nil {
		change(&options)
	}
	h.engine = New(options)
	if err := h.engine.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.close)
	return h
}

func (h *harness) close() {
	h.engine.Close()
	h.store.Close()
	h.watcher.Close()
}

// dial connects to a broker directly (not through any proxy).
func dial(t *testing.T, backend string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(brokers.Node(backend).URL())
	if err != nil {
		t.Fatalf("dial %s: %v", backend, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func queueID(name string) mirror.QueueID { return mirror.QueueID{VHost: "/", Name: name} }

// uniqueName returns a queue name for this test, under prefix.
func uniqueName(t *testing.T, prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}

// declareCopies declares the queue on every backend of m, as the proxy
// does for a client's queue.declare, and removes them at the end of the
// test.
func declareCopies(t *testing.T, m mirror.QueueMeta) {
	t.Helper()
	for _, b := range m.Backends() {
		declareOn(t, b, m.ID.Name, m.Durable)
	}
}

func declareOn(t *testing.T, backend, name string, durable bool) {
	t.Helper()
	conn := dial(t, backend)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, durable, false, false, false, nil); err != nil {
		t.Fatalf("declaring %s on %s: %v", name, backend, err)
	}
	t.Cleanup(func() { deleteOn(backend, name) })
}

func deleteOn(backend, name string) {
	conn, err := amqp.Dial(brokers.Node(backend).URL())
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		ch.QueueDelete(name, false, false, false)
	}
}

func messageID(n int) mirror.MessageID {
	var id mirror.MessageID
	binary.BigEndian.PutUint64(id[8:], uint64(n))
	return id
}

// publishTo publishes messages from..to-1 with their identities to queue
// on each backend, with confirms, as the proxy's fan-out does.
func publishTo(t *testing.T, queue string, from, to int, backends ...string) {
	t.Helper()
	for _, b := range backends {
		ch, err := dial(t, b).Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var last *amqp.DeferredConfirmation
		for n := from; n < to; n++ {
			id := messageID(n)
			last, err = ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
				Headers: amqp.Table{mirror.IdentityHeader: string(id[:])},
				Body:    []byte(fmt.Sprint("message ", n)),
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if last != nil {
			if ok, err := last.WaitContext(ctx); !ok || err != nil {
				t.Fatalf("publishes to %s not confirmed: %v %v", b, ok, err)
			}
		}
		cancel()
		ch.Close()
	}
}

// publishingWithID is message n as the proxy publishes it.
func publishingWithID(n int) amqp.Publishing {
	id := messageID(n)
	return amqp.Publishing{
		Headers: amqp.Table{mirror.IdentityHeader: string(id[:])},
		Body:    []byte(fmt.Sprint("message ", n)),
	}
}

// publishPlain publishes count messages without identity to queue on
// backend, as a client writing to the broker directly does.
func publishPlain(t *testing.T, backend, queue string, count int) {
	t.Helper()
	ch, err := dial(t, backend).Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last *amqp.DeferredConfirmation
	for n := range count {
		last, err = ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			Body:         []byte(fmt.Sprint("old message ", n)),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := last.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publishes not confirmed: %v %v", ok, err)
	}
}

// consumeAndSettle takes count messages from the master with basic.get,
// acks them, and tells the engine, as the proxy does for a client's ack.
// It returns the identities it settled.
func consumeAndSettle(t *testing.T, e *Engine, m mirror.QueueMeta, count int) []mirror.MessageID {
	t.Helper()
	ch, err := dial(t, m.Master).Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	var ids, pending []mirror.MessageID
	for len(ids) < count {
		d, ok, err := ch.Get(m.ID.Name, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("the master has only %d messages, want %d", len(ids), count)
		}
		value, _ := d.Headers[mirror.IdentityHeader].(string)
		id, identified := mirror.ParseMessageID(value)
		if !identified {
			id = mirror.ContentID(d.Body)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		pending = append(pending, id)
		if len(pending) == 50 || len(ids) == count {
			e.Settle(m.ID, pending, mirror.Acked)
			pending = nil
		}
	}
	return ids
}

// held returns what the trimmer of the slave on backend holds, -1 without
// one.
func held(e *Engine, id mirror.QueueID, backend string) int {
	tr := e.trimmers.get(id, backend)
	if tr == nil {
		return -1
	}
	n, _ := tr.t.Stats()
	return n
}

// expectHeld waits until every slave's trimmer holds want messages.
func expectHeld(t *testing.T, e *Engine, id mirror.QueueID, want int, slaves ...string) {
	t.Helper()
	testutil.Eventually(t, 2*time.Minute, func() error {
		for _, b := range slaves {
			if got := held(e, id, b); got != want {
				return fmt.Errorf("the slave on %s holds %d messages, want %d", b, got, want)
			}
		}
		return nil
	})
}

// readyOn is the number of ready messages of queue on backend; -1 when the
// queue does not exist there.
func readyOn(t *testing.T, backend, queue string) int {
	t.Helper()
	ch, err := dial(t, backend).Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if replyCode(err) == amqp.NotFound {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// expectMeta waits until the store's record of id satisfies check.
func expectMeta(t *testing.T, s *store.Store, id mirror.QueueID, check func(m mirror.QueueMeta, ok bool) error) mirror.QueueMeta {
	t.Helper()
	var got mirror.QueueMeta
	testutil.Eventually(t, 2*time.Minute, func() error {
		m, ok := s.Get(id)
		got = m
		return check(m, ok)
	})
	return got
}

func setPolicy(t *testing.T, ps *config.PolicyStore, name, pattern, definition string) {
	t.Helper()
	def, err := config.ParseDefinition([]byte(definition))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.SetPolicy(config.Policy{Name: name, Pattern: pattern, Definition: def}); err != nil {
		t.Fatal(err)
	}
}
