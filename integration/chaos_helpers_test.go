package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
)

// The chaos tests kill, restart and freeze the shared nodes under load
// through a mirrored proxy in this process. Unlike startMirroredProxy's
// callers they need the engine (to ask where a queue's master is now and
// whether its slaves are synchronised), other policies, a shorter
// failover_grace, and the engine's log (to see a decision not to promote).

// chaosOptions configure startChaosProxy.
type chaosOptions struct {
	// definition is the policy applied to every queue, as JSON.
	definition string
	// grace is the watcher's Grace (failover_grace); 0 for its default.
	grace time.Duration
}

// chaosProxy is a mirrored proxy with its engine and a copy of its log.
type chaosProxy struct {
	url string
	eng *engine.Engine
	log *syncBuffer
}

// startChaosProxy is startMirroredProxy with opts' policy and grace, and
// the engine and log kept for the test.
func startChaosProxy(t *testing.T, home *localbroker.Node, opts chaosOptions) *chaosProxy {
	t.Helper()
	captured := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), captured), &slog.HandlerOptions{Level: slog.LevelInfo}))
	p := startMirroredProxyWith(t, home, mirroredOptions{definition: opts.definition, grace: opts.grace, logger: logger})
	return &chaosProxy{url: p.url, eng: p.eng, log: captured}
}

// syncBuffer is a log destination the test reads while the proxy writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the log lines that contain every one of parts.
func (b *syncBuffer) lines(parts ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for line := range strings.Lines(b.buf.String()) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// meta is what the engine's metadata says about queue now.
func (p *chaosProxy) meta(t *testing.T, queue string) mirror.QueueMeta {
	t.Helper()
	m, ok := p.eng.Lookup(mirror.QueueID{VHost: "/", Name: queue})
	if !ok {
		t.Fatalf("the metadata does not hold queue %s", queue)
	}
	return m
}

// waitSynchronised waits until queue has a running master and copies-1
// slaves, all on running nodes and all synchronised, and returns its
// metadata then.
func (p *chaosProxy) waitSynchronised(t *testing.T, queue string, copies int) mirror.QueueMeta {
	t.Helper()
	var m mirror.QueueMeta
	testutil.Eventually(t, 60*time.Second, func() error {
		m = p.meta(t, queue)
		if !node(t, m.Master).Running() {
			return fmt.Errorf("master %s is not running", m.Master)
		}
		if len(m.Slaves) != copies-1 {
			return fmt.Errorf("master %s, slaves %+v; want %d synchronised slaves", m.Master, m.Slaves, copies-1)
		}
		for _, s := range m.Slaves {
			if !s.Synchronised || !node(t, s.Backend).Running() {
				return fmt.Errorf("master %s, slaves %+v; want %d synchronised slaves on running nodes", m.Master, m.Slaves, copies-1)
			}
		}
		return nil
	})
	return m
}

// waitMasterMoved waits until queue's master is no longer from, and
// returns the metadata then.
func (p *chaosProxy) waitMasterMoved(t *testing.T, queue, from string) mirror.QueueMeta {
	t.Helper()
	var m mirror.QueueMeta
	testutil.Eventually(t, 30*time.Second, func() error {
		if m = p.meta(t, queue); m.Master == from {
			return fmt.Errorf("master still %s (epoch %d)", m.Master, m.Epoch)
		}
		return nil
	})
	return m
}

// declareChaosQueue declares a durable queue through the proxy, waits
// until it has copies copies, and makes every node write its metadata to
// disk: a kill -9 shortly after a declare could otherwise lose the queue
// on the killed node (see localbroker.Node.FlushMetadata), which is
// RabbitMQ's behaviour and not what these tests look at.
func declareChaosQueue(t *testing.T, p *chaosProxy, copies int) string {
	t.Helper()
	conn := dialURL(t, p.url)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := queueName(t)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare %s: %v", queue, err)
	}
	// Registered after the proxy's own cleanups, so it runs before them.
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			t.Logf("delete %s: %v", queue, err)
		}
	})
	m := p.waitSynchronised(t, queue, copies)
	for _, b := range m.Backends() {
		if err := node(t, b).FlushMetadata(testContext(t, 20*time.Second)); err != nil {
			t.Fatalf("flush %s: %v", b, err)
		}
	}
	return queue
}

// restoreClusterOnCleanup wakes every frozen node and restarts every
// stopped one when the test ends, pass or fail, so that the tests after it
// find three running nodes.
func restoreClusterOnCleanup(t *testing.T) {
	t.Cleanup(func() {
		for _, n := range cluster.Nodes() {
			if pid := n.PID(); pid != 0 {
				// A node that was never frozen ignores SIGCONT.
				if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
					t.Errorf("SIGCONT %s: %v", n.Name, err)
				}
			}
			if !n.Running() {
				restartNode(t, n)
			}
		}
	})
}

// killNode kills n with SIGKILL and returns when it happened.
func killNode(t *testing.T, n *localbroker.Node) time.Time {
	t.Helper()
	at := time.Now()
	if err := n.Kill(); err != nil {
		t.Fatalf("kill %s: %v", n.Name, err)
	}
	return at
}

// signalNode sends sig to n's Erlang VM.
func signalNode(t *testing.T, n *localbroker.Node, sig syscall.Signal) {
	t.Helper()
	pid := n.PID()
	if pid == 0 {
		t.Fatalf("%s is not running", n.Name)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("%v to %s (pid %d): %v", sig, n.Name, pid, err)
	}
	if sig == syscall.SIGSTOP {
		waitStopped(t, n.Name, pid)
	}
}

// freezeProcess stops a process with SIGSTOP and returns once all its
// threads have stopped.
func freezeProcess(t *testing.T, name string, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP to %s (pid %d): %v", name, pid, err)
	}
	waitStopped(t, name, pid)
}

// waitStopped returns once every thread of a process sent SIGSTOP has
// stopped, so that nothing sent to it afterwards is answered.
func waitStopped(t *testing.T, name string, pid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := localbroker.WaitStopped(ctx, pid); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// chaosDelivery is one message as a consumer saw it.
type chaosDelivery struct {
	body        string
	consumer    string
	at          time.Time
	redelivered bool
}

// workload runs publishers with confirms and consumers with manual acks on
// one queue through the proxy, each on a connection of its own, with
// amqp091-go and no reconnect logic: a client that notices a failover
// fails the test. It records what each message went through.
type workload struct {
	t     *testing.T
	url   string
	queue string

	ctx        context.Context // ends the publishers
	stop       context.CancelFunc
	publishers sync.WaitGroup
	conns      []*amqp.Connection

	mu          sync.Mutex
	publishedAt map[string]time.Time // just before the publish was sent
	confirmed   map[string]time.Time // when the confirm came
	nacked      map[string]bool
	received    map[string]int
	ackedAt     map[string]time.Time // when the client first acked it
	deliveries  []chaosDelivery
	problems    []string // what a client should never see
}

func newWorkload(t *testing.T, url, queue string) *workload {
	ctx, stop := context.WithCancel(context.Background())
	w := &workload{
		t: t, url: url, queue: queue, ctx: ctx, stop: stop,
		publishedAt: map[string]time.Time{},
		confirmed:   map[string]time.Time{},
		nacked:      map[string]bool{},
		received:    map[string]int{},
		ackedAt:     map[string]time.Time{},
	}
	// Publishers end before the connections close (cleanups run last
	// first), so that a closing connection is not mistaken for a failure.
	t.Cleanup(func() {
		stop()
		w.publishers.Wait()
	})
	return w
}

// problem records something a client should never see.
func (w *workload) problem(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.problems = append(w.problems, fmt.Sprintf(format, args...))
}

// addPublisher starts a publisher that sends one persistent message at a
// time and waits for its confirm, so that a publish that ends neither
// confirmed nor nacked shows as a hanging wait.
func (w *workload) addPublisher(name string) {
	w.t.Helper()
	conn := dialURL(w.t, w.url)
	w.conns = append(w.conns, conn)
	ch, err := conn.Channel()
	if err != nil {
		w.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		w.t.Fatal(err)
	}
	w.publishers.Add(1)
	go func() {
		defer w.publishers.Done()
		for i := 0; w.ctx.Err() == nil; i++ {
			body := fmt.Sprintf("%s-%d", name, i)
			w.mu.Lock()
			w.publishedAt[body] = time.Now()
			w.mu.Unlock()
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", w.queue, false, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
			if err != nil {
				w.problem("publish %s: %v", body, err)
				return
			}
			wait, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			ok, err := dc.WaitContext(wait)
			cancel()
			if err != nil {
				w.problem("publish %s neither confirmed nor nacked within 20s: %v", body, err)
				return
			}
			w.mu.Lock()
			if ok {
				w.confirmed[body] = time.Now()
			} else {
				w.nacked[body] = true
			}
			w.mu.Unlock()
			// Pacing, so that two publishers leave the machine's two
			// cores to the brokers and the consumers.
			time.Sleep(time.Millisecond)
		}
	}()
}

// addConsumer starts a consumer with manual acks, and returns its channel
// (for NotifyCancel). A message it receives again must carry redelivered.
// With ackEvery above 1 it acks every ackEvery deliveries at once
// (multiple), as batching clients do: some messages are always unacked
// when a failover comes, and a multiple ack may reach across one.
func (w *workload) addConsumer(tag string, args amqp.Table, ackEvery int) *amqp.Channel {
	w.t.Helper()
	conn := dialURL(w.t, w.url)
	w.conns = append(w.conns, conn)
	ch, err := conn.Channel()
	if err != nil {
		w.t.Fatal(err)
	}
	if err := ch.Qos(20, 0, false); err != nil {
		w.t.Fatal(err)
	}
	deliveries, err := ch.Consume(w.queue, tag, false, false, false, false, args)
	if err != nil {
		w.t.Fatalf("consume as %s: %v", tag, err)
	}
	go func() {
		var unacked []string
		for d := range deliveries {
			body := string(d.Body)
			now := time.Now()
			w.mu.Lock()
			if w.received[body] > 0 && !d.Redelivered {
				w.problems = append(w.problems, fmt.Sprintf("%s delivered again (to %s) without redelivered", body, tag))
			}
			w.received[body]++
			w.deliveries = append(w.deliveries, chaosDelivery{body: body, consumer: tag, at: now, redelivered: d.Redelivered})
			w.mu.Unlock()
			if unacked = append(unacked, body); len(unacked) < ackEvery {
				continue
			}
			if err := d.Ack(ackEvery > 1); err != nil {
				w.problem("ack of %s by %s: %v", body, tag, err)
				continue
			}
			w.mu.Lock()
			for _, b := range unacked {
				if _, ok := w.ackedAt[b]; !ok {
					w.ackedAt[b] = time.Now()
				}
			}
			w.mu.Unlock()
			unacked = unacked[:0]
		}
	}()
	return ch
}

// counts returns how many messages were confirmed and how many distinct
// ones received.
func (w *workload) counts() (confirmed, received int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.confirmed), len(w.received)
}

// waitProgress waits until n more messages were both confirmed and
// received than when it was called.
func (w *workload) waitProgress(n int) {
	w.t.Helper()
	c0, r0 := w.counts()
	testutil.Eventually(w.t, 30*time.Second, func() error {
		if c, r := w.counts(); c < c0+n || r < r0+n {
			return fmt.Errorf("%d more confirmed, %d more received; want %d each", c-c0, r-r0, n)
		}
		return nil
	})
}

// resumedAfter is how long after at a consumer (any, when consumer is "")
// first received a message published after at.
func (w *workload) resumedAfter(at time.Time, consumer string) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.deliveries {
		if d.at.Before(at) || (consumer != "" && d.consumer != consumer) {
			continue
		}
		if w.publishedAt[d.body].After(at) {
			return d.at.Sub(at), true // deliveries are in the order they came
		}
	}
	return 0, false
}

// resumedWithin polls resumedAfter (any consumer) until limit after at;
// false when no message published after at was received by then. It does
// not fail the test: the caller has more to do first.
func (w *workload) resumedWithin(at time.Time, limit time.Duration) (time.Duration, bool) {
	for {
		if took, ok := w.resumedAfter(at, ""); ok {
			return took, true
		}
		if time.Since(at) > limit {
			return 0, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// publishingAfter says how publishers fared across at: how long after at
// the first publish was sent (they send one at a time, so a confirm that
// takes long delays it), and the longest wait for a confirm of a publish
// sent before at and confirmed after it.
func (w *workload) publishingAfter(at time.Time) (firstPublish, longestConfirm time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	firstPublish = -1
	for body, sent := range w.publishedAt {
		if sent.After(at) && (firstPublish < 0 || sent.Sub(at) < firstPublish) {
			firstPublish = sent.Sub(at)
		}
		if confirmed, ok := w.confirmed[body]; ok && sent.Before(at) && confirmed.After(at) {
			longestConfirm = max(longestConfirm, confirmed.Sub(sent))
		}
	}
	return firstPublish, longestConfirm
}

// waitResumed waits until a message published after at reached consumer
// ("" for any) and returns how long after at that was.
func (w *workload) waitResumed(at time.Time, consumer string) time.Duration {
	w.t.Helper()
	var took time.Duration
	testutil.Eventually(w.t, 30*time.Second, func() error {
		var ok bool
		if took, ok = w.resumedAfter(at, consumer); !ok {
			return fmt.Errorf("no message published after %s reached consumer %q", at.Format(time.StampMilli), consumer)
		}
		return nil
	})
	return took
}

// finish stops the publishers and checks what the clients saw: every
// publish ended confirmed or nacked, every confirmed message arrived, every
// repeated delivery carried redelivered, no connection was closed.
func (w *workload) finish() {
	w.t.Helper()
	w.stop()
	w.publishers.Wait()
	testutil.Eventually(w.t, 30*time.Second, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		var missing []string
		for body := range w.confirmed {
			if w.received[body] == 0 {
				missing = append(missing, body)
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("%d of %d confirmed messages not received: %s", len(missing), len(w.confirmed), abbreviate(missing))
		}
		return nil
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.problems {
		w.t.Error(p)
	}
	duplicates := 0
	for _, n := range w.received {
		if n > 1 {
			duplicates++
		}
	}
	w.t.Logf("%d published, %d confirmed, %d nacked, %d received, %d delivered more than once",
		len(w.publishedAt), len(w.confirmed), len(w.nacked), len(w.received), duplicates)
	for _, c := range w.conns {
		if c.IsClosed() {
			w.t.Errorf("a client connection was closed: %s", c.LocalAddr())
		}
	}
}

// abbreviate lists the first few of many names.
func abbreviate(names []string) string {
	if len(names) > 10 {
		return strings.Join(names[:10], " ") + fmt.Sprintf(" and %d more", len(names)-10)
	}
	return strings.Join(names, " ")
}

// durationSummary gives the median and the maximum.
func durationSummary(ds []time.Duration) (median, maximum time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return sorted[len(sorted)/2], sorted[len(sorted)-1]
}

// rounded rounds durations to the millisecond for the log.
func rounded(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// checkNoStaleDeliveries fails the test for every delivery after wokenAt
// of a message the client had acked before it: only a stale master (the
// frozen one, woken) could send it, as the new master settled those acks
// before (a redelivery of an ack lost with the old master comes at the
// promotion, before the wake-up).
func (w *workload) checkNoStaleDeliveries(wokenAt time.Time) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	stale, afterWake := 0, 0
	for _, d := range w.deliveries {
		if !d.at.After(wokenAt) {
			continue
		}
		afterWake++
		if acked, ok := w.ackedAt[d.body]; ok && acked.Before(wokenAt) {
			stale++
			if stale <= 10 {
				w.t.Errorf("%s acked %v before the wake-up, delivered again to %s %v after it (redelivered %t)",
					d.body, wokenAt.Sub(acked).Round(time.Millisecond), d.consumer, d.at.Sub(wokenAt).Round(time.Millisecond), d.redelivered)
			}
		}
	}
	if stale > 0 {
		w.t.Errorf("%d of %d deliveries after the wake-up were of messages acked before it", stale, afterWake)
	}
}
