package integration

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// These tests cover channels the client never put in confirm mode: the
// proxy puts their backend sides in confirm mode itself at the first
// publish to several copies, so that a slave that did not take a publish
// stops counting as synchronised (Mirror.Missed), and the client sees
// nothing of it.

// missedReports records the proxy's Missed calls beside a fixedPlacement.
type missedReports struct {
	*fixedPlacement
	mu     sync.Mutex
	missed []string // "backend queue", queue "*" for any
}

func (m *missedReports) Missed(backend string, queue *mirror.QueueID) {
	name := "*"
	if queue != nil {
		name = queue.Name
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.missed = append(m.missed, backend+" "+name)
}

// reports returns the reports made, each once, sorted.
func (m *missedReports) reports() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Clone(m.missed)
	slices.Sort(out)
	return slices.Compact(out)
}

// faultyLink forwards TCP connections to a real broker and can stop
// passing what the broker sends (hold) and cut every connection: the
// network fault between the proxy and one backend that tests need.
type faultyLink struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	held  bool
	conns []net.Conn
}

func startFaultyLink(t *testing.T, target string) *faultyLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &faultyLink{ln: ln, target: target}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		f.cut()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			broker, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, client, broker)
			f.mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(broker, client); broker.Close() }()
			go func() { defer wg.Done(); f.copyHeld(client, broker); client.Close() }()
		}
	}()
	return f
}

// copyHeld copies the broker's bytes to the proxy, pausing while held.
func (f *faultyLink) copyHeld(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for f.isHeld() {
			time.Sleep(5 * time.Millisecond)
			if f.isCut(src) {
				return
			}
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *faultyLink) isHeld() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held
}

func (f *faultyLink) isCut(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !slices.Contains(f.conns, c)
}

func (f *faultyLink) hold() {
	f.mu.Lock()
	f.held = true
	f.mu.Unlock()
}

// cut closes every connection (the proxy sees its link reset).
func (f *faultyLink) cut() {
	f.mu.Lock()
	conns := f.conns
	f.conns, f.held = nil, false
	f.mu.Unlock()
	for _, c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

func (f *faultyLink) addr() string { return f.ln.Addr().String() }

// dialOwnConfirms connects a client for these tests, with no copy of
// queue left by an earlier run; the queue is deleted through the proxy when
// the test ends. Its heartbeat (which the proxy's links take) is long: a
// faultyLink holds the broker's frames for as long as the brokers take to
// count their messages.
func dialOwnConfirms(t *testing.T, url, queue string) *amqp.Connection {
	t.Helper()
	for _, n := range cluster.Nodes() {
		c := dial(t, n)
		if err := deleteQueue(c, queue); err != nil {
			t.Fatalf("deleting %s's leftover %q: %v", n.Name, queue, err)
		}
		c.Close()
	}
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: time.Minute})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() {
		conn.Close()
		// A new connection: the test's may have a link broken a moment ago,
		// which the delete would not reach.
		c := dialURL(t, url)
		if err := deleteQueue(c, queue); err != nil {
			t.Errorf("deleting %q through the proxy: %v", queue, err)
		}
		c.Close()
		removeLeftovers(t, queue)
	})
	return conn
}

// TestOwnConfirmsNameASlaveThatMissedPublishes: a client publishing without
// confirms to a mirrored queue; the link to one slave stops answering and
// breaks with publishes it never confirmed, while its broker stays up. The
// proxy reports that slave's copy (and no other) as short of publishes; the
// client's connection and channel go on, and the client never sees a
// confirm it did not ask for.
func TestOwnConfirmsNameASlaveThatMissedPublishes(t *testing.T) {
	nodes := cluster.Nodes()
	faulty := startFaultyLink(t, nodeAddr(nodes[2]))
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	placement := &missedReports{fixedPlacement: newFixedPlacement(names...)}
	url, _ := startProxy(t, nodes[0], func(o *proxy.Options) {
		o.Others = []proxy.Backend{
			{Name: nodes[1].Name, Addr: nodeAddr(nodes[1])},
			{Name: nodes[2].Name, Addr: faulty.addr()},
		}
		o.Mirror = placement
	})
	const queue = "own-confirms-missed"
	conn := dialOwnConfirms(t, url, queue)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	ctx := testContext(t, 30*time.Second)
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)}); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
	}
	publish(0, 5)
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := queueDepth(t, nodes[2], queue); got != 5 {
			return fmt.Errorf("%s holds %d, want 5", nodes[2].Name, got)
		}
		return nil
	})
	if got := placement.reports(); len(got) != 0 {
		t.Fatalf("reports before any fault: %v, want none", got)
	}

	faulty.hold() // the slave's confirms stop reaching the proxy
	publish(5, 10)
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := queueDepth(t, nodes[2], queue); got != 10 {
			return fmt.Errorf("%s holds %d, want 10", nodes[2].Name, got)
		}
		return nil
	})
	faulty.cut()
	testutil.Eventually(t, 10*time.Second, func() error {
		if got, want := placement.reports(), []string{nodes[2].Name + " " + queue}; !slices.Equal(got, want) {
			return fmt.Errorf("missed reports %v, want %v", got, want)
		}
		return nil
	})

	// The client noticed nothing: its channel publishes on, and the master
	// and the other slave get everything.
	publish(10, 12)
	for _, n := range nodes[:2] {
		testutil.Eventually(t, 10*time.Second, func() error {
			if got := queueDepth(t, n, queue); got != 12 {
				return fmt.Errorf("%s holds %d, want 12", n.Name, got)
			}
			return nil
		})
	}
	select {
	case e := <-closed:
		t.Fatalf("the client's channel closed: %v", e)
	default:
	}
}

// TestOwnConfirmsAndTheClientsModes: a channel in the proxy's own confirm
// mode that the client later puts in confirm mode numbers from 1 and gets
// exactly its own confirms; tx.select before the first publish works across
// copies; tx.select after publishing outside a transaction works too, the
// proxy keeping the transaction (the backends' channels are in confirm mode).
func TestOwnConfirmsAndTheClientsModes(t *testing.T) {
	url, _ := startFanoutProxy(t)
	const queue = "own-confirms-modes"
	conn := dialOwnConfirms(t, url, queue)
	ctx := testContext(t, 30*time.Second)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	body := func(s string) amqp.Publishing { return amqp.Publishing{Body: []byte(s)} }

	t.Run("confirm.select after publishing", func(t *testing.T) {
		for i := range 3 {
			if err := ch.PublishWithContext(ctx, "", queue, false, false, body(fmt.Sprint("before", i))); err != nil {
				t.Fatal(err)
			}
		}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 10))
		if err := ch.Confirm(false); err != nil {
			t.Fatalf("confirm.select: %v", err)
		}
		for i := range 2 {
			if err := ch.PublishWithContext(ctx, "", queue, false, false, body(fmt.Sprint("after", i))); err != nil {
				t.Fatal(err)
			}
		}
		var got []uint64
		for len(got) < 2 {
			select {
			case c := <-confirms:
				if !c.Ack {
					t.Fatalf("confirm %d: nack", c.DeliveryTag)
				}
				got = append(got, c.DeliveryTag)
			case <-ctx.Done():
				t.Fatalf("confirms: got %v, want [1 2]", got)
			}
		}
		if !slices.Equal(got, []uint64{1, 2}) {
			t.Fatalf("confirms: got %v, want [1 2]", got)
		}
		select {
		case c := <-confirms:
			t.Fatalf("an extra confirm %+v", c)
		case <-time.After(200 * time.Millisecond):
		}
	})

	t.Run("tx.select first", func(t *testing.T) {
		tx, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Tx(); err != nil {
			t.Fatalf("tx.select: %v", err)
		}
		if err := tx.PublishWithContext(ctx, "", queue, false, false, body("in-tx")); err != nil {
			t.Fatal(err)
		}
		if err := tx.TxCommit(); err != nil {
			t.Fatalf("tx.commit: %v", err)
		}
		for _, n := range cluster.Nodes() {
			testutil.Eventually(t, 10*time.Second, func() error {
				if got := queueDepth(t, n, queue); got != 6 {
					return fmt.Errorf("%s holds %d, want 6", n.Name, got)
				}
				return nil
			})
		}
	})

	t.Run("tx.select after publishing", func(t *testing.T) {
		// The backends' channel is in confirm mode by then; the proxy keeps
		// the transaction itself, and the client sees what a broker's
		// transaction shows.
		late, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		depths := func(step string, want int) {
			t.Helper()
			for _, n := range cluster.Nodes() {
				if got := queueDepth(t, n, queue); got != want {
					t.Fatalf("%s: %s holds %d, want %d", step, n.Name, got, want)
				}
			}
		}
		if err := late.PublishWithContext(ctx, "", queue, false, false, body("plain")); err != nil {
			t.Fatal(err)
		}
		for _, n := range cluster.Nodes() {
			testutil.Eventually(t, 10*time.Second, func() error {
				if got := queueDepth(t, n, queue); got != 7 {
					return fmt.Errorf("%s holds %d, want 7", n.Name, got)
				}
				return nil
			})
		}
		if err := late.Tx(); err != nil {
			t.Fatalf("tx.select after a publish: %v", err)
		}
		if err := late.PublishWithContext(ctx, "", queue, false, false, body("rolled back")); err != nil {
			t.Fatal(err)
		}
		// A request on the same channel is answered after the publish
		// would have reached the master.
		if q, err := late.QueueDeclarePassive(queue, false, false, false, false, nil); err != nil || q.Messages != 7 {
			t.Fatalf("passive declare in the open transaction: %d messages, %v; want 7", q.Messages, err)
		}
		depths("before the rollback", 7)
		if err := late.TxRollback(); err != nil {
			t.Fatalf("tx.rollback: %v", err)
		}
		if err := late.PublishWithContext(ctx, "", queue, false, false, body("committed")); err != nil {
			t.Fatal(err)
		}
		depths("before the commit", 7)
		if err := late.TxCommit(); err != nil {
			t.Fatalf("tx.commit: %v", err)
		}
		// commit-ok came once every copy confirmed the publish.
		depths("after the commit", 8)

		// An ack in the transaction takes effect at the commit.
		got, ok, err := late.Get(queue, false)
		if err != nil || !ok {
			t.Fatalf("basic.get: %v, %v", ok, err)
		}
		if err := got.Ack(false); err != nil {
			t.Fatal(err)
		}
		if err := late.TxRollback(); err != nil {
			t.Fatalf("tx.rollback: %v", err)
		}
		if err := got.Ack(false); err != nil {
			t.Fatal(err)
		}
		if err := late.TxCommit(); err != nil {
			t.Fatalf("tx.commit of an ack: %v", err)
		}

		// As on a broker: a transactional channel cannot select confirms.
		err = late.Confirm(false)
		var amqpErr *amqp.Error
		if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.PreconditionFailed || !strings.Contains(amqpErr.Reason, "cannot switch from tx to confirm mode") {
			t.Fatalf("confirm.select in tx mode: got %v, want 406 PRECONDITION_FAILED", err)
		}
		// The channel closed, so a delivery it had not acked would be back
		// now: the committed ack took it.
		if got := queueDepth(t, cluster.Nodes()[0], queue); got != 7 {
			t.Fatalf("the master holds %d after the channel closed, want 7", got)
		}
		if _, err := conn.Channel(); err != nil {
			t.Fatalf("a new channel after the refusal: %v", err)
		}
	})

	t.Run("a kept transaction past its bound", func(t *testing.T) {
		big, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := big.PublishWithContext(ctx, "", queue, false, false, body("plain")); err != nil {
			t.Fatal(err)
		}
		if err := big.Tx(); err != nil {
			t.Fatalf("tx.select after a publish: %v", err)
		}
		mib := amqp.Publishing{Body: make([]byte, 1<<20)}
		for range 65 {
			if err := big.PublishWithContext(ctx, "", queue, false, false, mib); err != nil {
				break // the channel closed
			}
		}
		err = big.TxCommit()
		var amqpErr *amqp.Error
		if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.PreconditionFailed || !strings.Contains(amqpErr.Reason, "transaction larger than the 64 MiB") {
			t.Fatalf("tx.commit of 65 MiB: got %v, want 406 PRECONDITION_FAILED naming the bound", err)
		}
		if _, err := conn.Channel(); err != nil {
			t.Fatalf("a new channel after the refusal: %v", err)
		}
	})
}

// TestASlaveThatMissedPublishesSynchronisesAgain, with the replication
// engine: the client's link to a slave breaks with publishes the slave never
// confirmed (its broker stays up, so nothing fails over). The slave stops
// counting as synchronised and rejoins as the youngest slave; with
// ha-sync-mode automatic it is purged and synchronised again, and then holds
// exactly the master's messages.
func TestASlaveThatMissedPublishesSynchronisesAgain(t *testing.T) {
	nodes := cluster.Nodes()
	home, slave := nodes[0], nodes[2]
	faulty := startFaultyLink(t, nodeAddr(slave))
	p := startMirroredProxyWith(t, home, mirroredOptions{
		logger:    slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})),
		linkAddrs: map[string]string{slave.Name: faulty.addr()},
	})
	const queue = "own-confirms-resync"
	conn := dialOwnConfirms(t, p.url, queue)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	id := mirror.QueueID{VHost: "/", Name: queue}
	ctx := testContext(t, 60*time.Second)
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)}); err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
		}
	}
	publish(0, 100)
	faulty.hold()
	before, _ := p.eng.Lookup(id)
	publish(100, 200)
	// Held by its trimmer, so counted by the broker itself (ready and
	// unacknowledged).
	awaitHeld(t, time.Minute, map[string]map[string]int{queue: onEvery(200, home.Name, nodes[1].Name, slave.Name)})
	faulty.cut()
	// The slave rejoined: youngest, and (automatic sync) synchronised again.
	testutil.Eventually(t, 30*time.Second, func() error {
		m, ok := p.eng.Lookup(id)
		if !ok {
			return errors.New("queue not recorded")
		}
		if m.Version == before.Version {
			return fmt.Errorf("metadata unchanged: %+v", m.Slaves)
		}
		last := m.Slaves[len(m.Slaves)-1]
		if last.Backend != slave.Name || !last.Synchronised {
			return fmt.Errorf("slaves %+v, want %s the youngest, synchronised", m.Slaves, slave.Name)
		}
		return nil
	})
	publish(200, 210)
	awaitHeld(t, time.Minute, map[string]map[string]int{queue: onEvery(210, home.Name, nodes[1].Name, slave.Name)})
}
