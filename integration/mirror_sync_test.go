package integration

// Acceptance tests of mirrored queues (issue 7): slaves added by a policy change and their
// synchronisation, and queues adopted from a broker the proxy was put in front of.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// others is every backend but one.
func others(backend string) []string {
	return slices.DeleteFunc(mirrorBackends(), func(b string) bool { return b == backend })
}

// awaitAlone waits until ctl list_queues shows the queue on one backend, without slaves,
// and returns that backend.
func awaitAlone(t testing.TB, p *cliProxy, queue string) string {
	t.Helper()
	var master string
	awaitCondition(t, 30*time.Second, func() error {
		row, err := queueStatus(t, p, queue)
		if err != nil {
			return err
		}
		if row.Master == "" || len(row.Slaves) != 0 {
			return fmt.Errorf("ctl list_queues: %v; want a master and no slaves", row)
		}
		master = row.Master
		return nil
	})
	return master
}

// awaitSlaves waits until ctl list_queues shows the queue with master, slaves on every other
// backend, and exactly the synchronised slaves given.
func awaitSlaves(t testing.TB, timeout time.Duration, p *cliProxy, queue, master string, synchronised []string) {
	t.Helper()
	awaitCondition(t, timeout, slavesAre(t, p, queue, master, synchronised))
}

// slavesAre is the condition of awaitSlaves.
func slavesAre(t testing.TB, p *cliProxy, queue, master string, synchronised []string) func() error {
	return func() error {
		row, err := queueStatus(t, p, queue)
		if err != nil {
			return err
		}
		if row.Master != master || !sameSet(row.Slaves, others(master)) || !sameSet(row.SynchronisedSlaves, synchronised) {
			return fmt.Errorf("ctl list_queues: %v; want master %s, slaves %v, synchronised %v", row, master, others(master), synchronised)
		}
		return nil
	}
}

// TestMirrorSlaveSynchronisation: slaves a policy change adds start empty; with
// ha-sync-mode automatic they are synchronised soon, with manual (the default) only after
// ctl sync_queue, and the queue keeps serving publishers and consumers while a sync of
// 100 000 messages runs.
func TestMirrorSlaveSynchronisation(t *testing.T) {
	p := startMirrorProxy(t, "")
	conn := dialURL(t, p.url("guest", "guest"))

	t.Run("automatic", func(t *testing.T) {
		const messages = 1000
		queue := queueName(t)
		declareMirrored(t, p, conn, queue, true, nil)
		publishConfirmed(t, conn, queue, messages, func(i int) amqp.Publishing {
			return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "message %d", i)}
		})
		master := awaitAlone(t, p, queue)
		awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(messages, master)})

		setPolicy(t, p, "sync-automatic", exactly(queue), `{"ha-mode":"all","ha-sync-mode":"automatic"}`)
		awaitSlaves(t, 30*time.Second, p, queue, master, others(master))
		awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(messages, mirrorBackends()...)})
	})

	t.Run("manual", func(t *testing.T) {
		// With no clients beside it; TestMirrorSyncUnderLoad syncs under load.
		const backlog = 20_000
		queue := queueName(t)
		declareMirrored(t, p, conn, queue, false, nil)
		body := bytes.Repeat([]byte{'s'}, 256)
		message := func(int) amqp.Publishing { return amqp.Publishing{Body: body} }
		start := time.Now()
		publishConfirmed(t, conn, queue, backlog, message)
		t.Logf("backlog: %d messages of %d bytes published with confirms to one copy in %v (%.0f msg/s)",
			backlog, len(body), time.Since(start).Round(time.Millisecond), backlog/time.Since(start).Seconds())
		master := awaitAlone(t, p, queue)

		setPolicy(t, p, "sync-manual", exactly(queue), `{"ha-mode":"all"}`)
		awaitSlaves(t, 30*time.Second, p, queue, master, nil)
		held := onEvery(0, others(master)...)
		held[master] = backlog
		awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: held})
		row, err := queueStatus(t, p, queue)
		if err != nil {
			t.Fatal(err)
		}
		if len(row.SynchronisedSlaves) != 0 {
			t.Errorf("ctl list_queues before sync_queue: %v; want no synchronised slave (ha-sync-mode manual)", row)
		}

		syncStart := time.Now()
		p.ctl(t, "sync_queue", queue).check(t, 0, nil, nil, nil)
		if err := poll(t.Context(), 90*time.Second, slavesAre(t, p, queue, master, others(master))); err != nil {
			t.Fatalf("sync of a %d-message backlog to 2 new slaves: not done after %v: %v", backlog, time.Since(syncStart).Round(time.Millisecond), err)
		}
		t.Logf("sync of a %d-message backlog to 2 new slaves: %v until ctl list_queues showed both synchronised", backlog, time.Since(syncStart).Round(time.Millisecond))
		awaitHeld(t, time.Minute, map[string]map[string]int{queue: onEvery(backlog, mirrorBackends()...)})
	})
}

// TestMirrorSyncUnderLoad: publishing and consuming go on during a sync. A queue holding
// a backlog (20 000 messages; 100 000 in the long tier) gets two slaves by a policy change
// while two publishers with confirms and two consumers with manual acks run at full speed
// through the proxy; ctl sync_queue synchronises both, no client stalls meanwhile, and
// once the clients stop every broker holds exactly what the master holds. How long the
// sync takes and how long clients waited are logged, figures for the reader, not bounds:
// they follow the machine's load.
func TestMirrorSyncUnderLoad(t *testing.T) {
	backlog := bySize(20_000, 100_000)
	const (
		// Generous waits for events, so that only a sync or a client that stopped fails.
		syncWait = 15 * time.Minute
		stall    = time.Minute // no confirm or delivery for this long is a stalled client
	)
	p := startMirrorProxy(t, "")
	conn := dialURL(t, p.url("guest", "guest"))
	queue := queueName(t)
	declareMirrored(t, p, conn, queue, false, nil)
	// A sync still running when the test fails would hold up the queue's deletion. The
	// test's context has ended when cleanups run, so the command gets one of its own.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		exec.CommandContext(ctx, p.binary.path, "ctl", "--admin", p.adminAddr, "--token", p.token, "cancel_sync_queue", queue).Run()
	})
	// Every body is different: the backlog is published while the queue has one copy, so
	// without the identity header, and a trimmer knows such messages by their content (a
	// settlement of one the slave never got would take another with the same body).
	padding := bytes.Repeat([]byte{'s'}, 240)
	message := func(prefix string) func(int) amqp.Publishing {
		return func(i int) amqp.Publishing {
			return amqp.Publishing{Body: fmt.Appendf(slices.Clip(padding), " %s %d", prefix, i)}
		}
	}
	start := time.Now()
	publishConfirmed(t, conn, queue, backlog, message("backlog"))
	t.Logf("backlog: %d messages of about 256 bytes published with confirms to one copy in %v",
		backlog, time.Since(start).Round(time.Millisecond))
	master := awaitAlone(t, p, queue)

	load := startSyncLoad(t, p.url("guest", "guest"), queue, message)
	t.Cleanup(load.stop)
	time.Sleep(5 * time.Second) // a measurement: the clients' rates before the sync
	policyAt := time.Now()
	setPolicy(t, p, "sync-load", exactly(queue), `{"ha-mode":"all"}`)
	awaitSlaves(t, 30*time.Second, p, queue, master, nil)
	syncStart := time.Now()
	p.ctl(t, "sync_queue", queue).check(t, 0, nil, nil, nil)
	synced := poll(t.Context(), syncWait, slavesAre(t, p, queue, master, others(master)))
	syncEnd := time.Now()
	took := syncEnd.Sub(syncStart)
	load.stop()

	t.Logf("clients before the sync: %s", load.rates(policyAt.Add(-5*time.Second), policyAt))
	t.Logf("clients during the sync: %s (load average %s)", load.rates(syncStart, syncEnd), loadAverage())
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		if strings.Contains(line, "sync") && strings.Contains(line, queue) {
			t.Log(line)
		}
	}
	for _, gap := range load.gaps(policyAt, syncEnd) {
		t.Logf("%s: longest wait %v (from %s)", gap.client, gap.longest.Round(time.Millisecond), gap.from.Format(time.StampMilli))
		if gap.longest > stall {
			t.Errorf("%s waited %v (from %s) during the policy change and the sync: it stalled",
				gap.client, gap.longest.Round(time.Millisecond), gap.from.Format(time.StampMilli))
		}
	}
	load.check(t)
	if synced != nil {
		t.Fatalf("sync of a %d-message backlog to 2 new slaves under load: not done after %v: %v", backlog, took.Round(time.Millisecond), synced)
	}
	t.Logf("sync of a %d-message backlog to 2 new slaves under load: %v until ctl list_queues showed both synchronised", backlog, took.Round(time.Millisecond))
	// Only a sync that copied shows sync_queue at work: a never-synced slave also becomes
	// synchronised once the messages older than its join have been consumed.
	if _, ok := p.record(map[string]string{"msg": "slaves synchronised", "queue": queue}); !ok {
		t.Errorf("no \"slaves synchronised\" log line for %s: the slaves were not synchronised by a copy", queue)
	}

	// Every copy holds what the master holds once the clients stop and the trimmers settle.
	awaitCondition(t, time.Minute, func() error {
		held, err := brokerMessages(t.Context(), queue)
		if err != nil {
			return err
		}
		want := held[queue][master]
		if got := held[queue]; !mapsEqual(got, onEvery(want, mirrorBackends()...)) {
			return fmt.Errorf("brokers hold %v (node: messages); want the master's %d on every node", got, want)
		}
		return nil
	})
}

// syncLoad is two publishers with confirms (at most 100 unconfirmed each) and two consumers
// with manual acks (prefetch 100) on one queue through the proxy, each on a connection of
// its own, recording when each confirm and each delivery came.
type syncLoad struct {
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	conns   []*amqp.Connection
	stopped sync.Once

	mu     sync.Mutex
	events map[string][]time.Time // client → when its confirms or deliveries came
	errs   []error
}

func startSyncLoad(t *testing.T, url, queue string, message func(prefix string) func(int) amqp.Publishing) *syncLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &syncLoad{ctx: ctx, cancel: cancel, events: map[string][]time.Time{}}
	channel := func() *amqp.Channel {
		conn := dialURL(t, url)
		l.conns = append(l.conns, conn)
		return openChannel(t, conn)
	}
	for i := range 2 {
		name, ch := fmt.Sprintf("publisher %d", i+1), channel()
		l.wg.Go(func() { l.fail(name, l.publish(ch, name, queue, message(name))) })
	}
	for i := range 2 {
		name, ch := fmt.Sprintf("consumer %d", i+1), channel()
		l.wg.Go(func() { l.fail(name, l.consume(ch, name, queue)) })
	}
	return l
}

func (l *syncLoad) mark(client string) {
	now := time.Now()
	l.mu.Lock()
	l.events[client] = append(l.events[client], now)
	l.mu.Unlock()
}

func (l *syncLoad) fail(client string, err error) {
	if err != nil {
		l.mu.Lock()
		l.errs = append(l.errs, fmt.Errorf("%s: %w", client, err))
		l.mu.Unlock()
	}
}

// publish publishes until the load stops, at most 100 unconfirmed, and waits for the last
// confirms.
func (l *syncLoad) publish(ch *amqp.Channel, name, queue string, message func(int) amqp.Publishing) error {
	const window = 100
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
	outstanding := 0
	awaitOne := func() error {
		select {
		case c, ok := <-confirms:
			if !ok {
				return fmt.Errorf("channel closed with %d publishes unconfirmed", outstanding)
			}
			if !c.Ack {
				return fmt.Errorf("publish %d nacked", c.DeliveryTag)
			}
			outstanding--
			l.mark(name)
			return nil
		case <-time.After(30 * time.Second):
			return fmt.Errorf("no confirm within 30s, %d unconfirmed", outstanding)
		}
	}
	for i := 0; l.ctx.Err() == nil; i++ {
		if outstanding == window {
			if err := awaitOne(); err != nil {
				return err
			}
		}
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false, message(i)); err != nil {
			return err
		}
		outstanding++
	}
	for outstanding > 0 {
		if err := awaitOne(); err != nil {
			return err
		}
	}
	return ch.Close()
}

// consume acks each delivery until the load stops, then closes its channel: what it held
// unacknowledged goes back to the queue.
func (l *syncLoad) consume(ch *amqp.Channel, name, queue string) error {
	if err := ch.Qos(100, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(queue, name, false, false, false, false, nil)
	if err != nil {
		return err
	}
	defer ch.Close()
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("the channel closed")
			}
			if err := d.Ack(false); err != nil {
				return err
			}
			l.mark(name)
		case <-l.ctx.Done():
			return nil
		}
	}
}

// stop ends the load and waits for it, closing its connections if it does not end in time
// (a publish the proxy holds back would otherwise hold the test).
func (l *syncLoad) stop() {
	l.stopped.Do(func() {
		l.cancel()
		done := make(chan struct{})
		go func() {
			l.wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(45 * time.Second):
			l.fail("load", errors.New("did not stop within 45s; closing its connections"))
			for _, conn := range l.conns {
				conn.CloseDeadline(time.Now().Add(5 * time.Second))
			}
			<-done
		}
	})
}

// rates is how many confirms and deliveries per second the clients had between from and to.
func (l *syncLoad) rates(from, to time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var published, consumed int
	for client, times := range l.events {
		n := 0
		for _, at := range times {
			if !at.Before(from) && at.Before(to) {
				n++
			}
		}
		if strings.HasPrefix(client, "publisher") {
			published += n
		} else {
			consumed += n
		}
	}
	seconds := to.Sub(from).Seconds()
	return fmt.Sprintf("%d confirmed (%.0f msg/s), %d consumed (%.0f msg/s) in %v",
		published, float64(published)/seconds, consumed, float64(consumed)/seconds, to.Sub(from).Round(time.Millisecond))
}

// clientGap is the longest a client waited for its next confirm or delivery.
type clientGap struct {
	client  string
	from    time.Time
	longest time.Duration
}

// gaps is each client's longest wait between from and to (counting from from, and until to
// when nothing came after the last event).
func (l *syncLoad) gaps(from, to time.Time) []clientGap {
	l.mu.Lock()
	defer l.mu.Unlock()
	var gaps []clientGap
	for _, client := range slices.Sorted(mapKeys(l.events)) {
		gap := clientGap{client: client}
		last := from
		for _, at := range append(l.events[client], to) {
			if at.Before(from) {
				continue
			}
			if at.After(to) {
				at = to
			}
			if at.Sub(last) > gap.longest {
				gap.longest, gap.from = at.Sub(last), last
			}
			last = at
			if !at.Before(to) {
				break
			}
		}
		gaps = append(gaps, gap)
	}
	return gaps
}

// check reports every error of the load's clients, and a connection the proxy closed.
func (l *syncLoad) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, err := range l.errs {
		t.Error(err)
	}
	for _, c := range l.conns {
		if c.IsClosed() {
			t.Errorf("a client connection was closed: %s", c.LocalAddr())
		}
	}
}

// loadAverage is the machine's 1, 5 and 15 minute load averages, which say how far the rates
// measured are the proxy's own: the cores are shared with the brokers and other tests.
func loadAverage() string {
	content, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(content))[:3], " ")
}

// TestMirrorAdoption: a queue holding messages on one broker before the proxy is put in
// front of it is adopted, mirrored to all three by an ha-all policy and sync_queue, and
// every message is consumed once.
func TestMirrorAdoption(t *testing.T) {
	const messages = 1000
	queue := queueName(t)
	owner := mirrorBackends()[1]
	direct := dial(t, node(t, owner))
	t.Cleanup(func() { // whatever the proxy did, the broker is left clean
		if conn, err := amqp.Dial(node(t, owner).URL()); err == nil {
			deleteQueue(conn, queue)
			conn.Close()
		}
	})
	declareChannel := openChannel(t, direct)
	if _, err := declareChannel.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("queue.declare %s on %s directly: %v", queue, owner, err)
	}
	publishConfirmed(t, direct, queue, messages, func(i int) amqp.Publishing {
		return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "adopted %d", i)}
	})
	direct.Close()

	p := startMirrorProxy(t, "")
	setPolicy(t, p, "adopt-all", exactly(queue), `{"ha-mode":"all"}`)
	conn := dialURL(t, p.url("guest", "guest"))
	declared := declareMirrored(t, p, conn, queue, true, nil)
	if declared.Messages != messages {
		t.Errorf("queue.declare-ok through the proxy: %d messages, want the %d on %s", declared.Messages, messages, owner)
	}
	// ha-sync-mode manual (the default): the new slaves wait for sync_queue.
	awaitSlaves(t, 30*time.Second, p, queue, owner, nil)
	p.ctl(t, "sync_queue", queue).check(t, 0, nil, nil, nil)
	awaitSlaves(t, time.Minute, p, queue, owner, others(owner))
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(messages, mirrorBackends()...)})

	seen := make([]int, messages)
	for _, d := range consumeAcked(t, conn, queue, messages) {
		if i := bodyIndex(t, d.Body); i >= 0 && i < messages {
			seen[i]++
		} else {
			t.Errorf("delivered %q, which was never published", d.Body)
		}
	}
	for i, n := range seen {
		if n != 1 {
			t.Errorf("message %d delivered %d times, want once", i, n)
		}
	}
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(0, mirrorBackends()...)})
	if _, ok, err := openChannel(t, conn).Get(queue, true); err != nil || ok {
		t.Errorf("basic.get after consuming all %d: got a message %v, error %v; want an empty queue", messages, ok, err)
	}
}
