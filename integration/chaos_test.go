package integration

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// Chaos tests for failover (issue 8's acceptance): real brokers killed
// with SIGKILL or frozen with SIGSTOP under load, amqp091-go clients
// without reconnect logic through a proxy mirroring every queue. They
// kill any of the three nodes, so they never run in parallel, and each
// puts the cluster back as it found it when it ends.

const haAllAutomatic = `{"ha-mode":"all","ha-sync-mode":"automatic"}`

// killGrace is failover_grace in the tests that kill brokers: a kill is
// seen at once (the connections reset), and on this shared, loaded
// machine a live broker restarting beside the others can leave a probe
// unanswered for over 2s, the default. That promotion is legitimate but
// belongs to TestChaosMasterFrozen, not to the kill tests.
const killGrace = 10 * time.Second

// TestChaosMasterKilledRepeatedly: the master's broker is killed three times
// in one run (ten in the long tier, bySize), each time after the previous victim came back and became a
// synchronised slave again. Two publishers with confirms and two consumers
// with manual acks never notice: nothing confirmed is lost, every repeated
// delivery carries redelivered, every publish ends confirmed or nacked, and
// consumers resume by themselves.
func TestChaosMasterKilledRepeatedly(t *testing.T) {
	restoreClusterOnCleanup(t)
	p := startChaosProxy(t, node(t, "rabbit1"), chaosOptions{definition: haAllAutomatic, grace: killGrace})
	queue := declareChaosQueue(t, p, 3)
	w := newWorkload(t, p.url, queue)
	w.addPublisher("p1")
	w.addPublisher("p2")
	w.addConsumer("c1", nil, 1)
	w.addConsumer("c2", nil, 5)
	w.waitProgress(200)

	kills := bySize(3, 10)
	var resumes []time.Duration
	for round := range kills {
		m := p.waitSynchronised(t, queue, 3)
		victim := node(t, m.Master)
		killedAt := killNode(t, victim)
		resumed := w.waitResumed(killedAt, "")
		promoted := p.waitMasterMoved(t, queue, victim.Name)
		resumes = append(resumes, resumed)
		firstPublish, longestConfirm := w.publishingAfter(killedAt)
		t.Logf("kill %d: master %s killed, %s promoted (epoch %d), consumers resumed after %v (first publish after the kill sent after %v; a confirm in flight took up to %v)",
			round+1, victim.Name, promoted.Master, promoted.Epoch, resumed.Round(time.Millisecond),
			firstPublish.Round(time.Millisecond), longestConfirm.Round(time.Millisecond))
		restartNode(t, victim)
		w.waitProgress(50)
	}
	p.waitSynchronised(t, queue, 3)
	w.waitProgress(50)
	w.finish()
	median, maximum := durationSummary(resumes)
	t.Logf("resume after a master kill over %d kills: median %v, max %v (all: %v)",
		kills, median.Round(time.Millisecond), maximum.Round(time.Millisecond), rounded(resumes))
}

// TestChaosSlaveKilled: the oldest slave's broker (the one a master
// failure would promote) is killed twice (three times in the long tier);
// clients notice nothing.
func TestChaosSlaveKilled(t *testing.T) {
	restoreClusterOnCleanup(t)
	p := startChaosProxy(t, node(t, "rabbit1"), chaosOptions{definition: haAllAutomatic, grace: killGrace})
	queue := declareChaosQueue(t, p, 3)
	w := newWorkload(t, p.url, queue)
	w.addPublisher("p1")
	w.addPublisher("p2")
	w.addConsumer("c1", nil, 1)
	w.addConsumer("c2", nil, 5)
	w.waitProgress(200)

	kills := bySize(2, 3)
	var resumes []time.Duration
	for round := range kills {
		m := p.waitSynchronised(t, queue, 3)
		victim := node(t, m.Slaves[0].Backend)
		killedAt := killNode(t, victim)
		resumed := w.waitResumed(killedAt, "")
		resumes = append(resumes, resumed)
		firstPublish, longestConfirm := w.publishingAfter(killedAt)
		if after := p.meta(t, queue); after.Master != m.Master || after.Epoch != m.Epoch {
			t.Errorf("kill %d of slave %s: master %s epoch %d, want %s epoch %d unchanged",
				round+1, victim.Name, after.Master, after.Epoch, m.Master, m.Epoch)
		}
		t.Logf("kill %d: slave %s killed, consumers resumed after %v (first publish after the kill sent after %v; a confirm in flight took up to %v)",
			round+1, victim.Name, resumed.Round(time.Millisecond), firstPublish.Round(time.Millisecond), longestConfirm.Round(time.Millisecond))
		restartNode(t, victim)
		w.waitProgress(50)
	}
	p.waitSynchronised(t, queue, 3)
	w.waitProgress(50)
	w.finish()
	median, maximum := durationSummary(resumes)
	t.Logf("resume after a slave kill over %d kills: median %v, max %v", kills, median.Round(time.Millisecond), maximum.Round(time.Millisecond))
}

// TestChaosTwoBrokersKilled: with the queue on all three nodes, the master
// is killed, then the master promoted in its place: the last node serves
// alone and nothing confirmed is lost.
func TestChaosTwoBrokersKilled(t *testing.T) {
	restoreClusterOnCleanup(t)
	p := startChaosProxy(t, node(t, "rabbit1"), chaosOptions{definition: haAllAutomatic, grace: killGrace})
	queue := declareChaosQueue(t, p, 3)
	w := newWorkload(t, p.url, queue)
	w.addPublisher("p1")
	w.addPublisher("p2")
	w.addConsumer("c1", nil, 1)
	w.addConsumer("c2", nil, 5)
	w.waitProgress(200)

	first := node(t, p.waitSynchronised(t, queue, 3).Master)
	killedAt := killNode(t, first)
	second := node(t, p.waitMasterMoved(t, queue, first.Name).Master)
	t.Logf("first kill: %s; consumers resumed after %v on %s", first.Name, w.waitResumed(killedAt, "").Round(time.Millisecond), second.Name)
	w.waitProgress(100)

	killedAt = killNode(t, second)
	last := p.waitMasterMoved(t, queue, second.Name)
	t.Logf("second kill: %s; consumers resumed after %v on %s (epoch %d)", second.Name, w.waitResumed(killedAt, "").Round(time.Millisecond), last.Master, last.Epoch)
	w.waitProgress(100)

	restartNode(t, first)
	restartNode(t, second)
	p.waitSynchronised(t, queue, 3)
	w.waitProgress(50)
	w.finish()
}

// TestChaosMasterFrozen: the master's broker is frozen with SIGSTOP for
// longer than failover_grace, so a slave is promoted, then woken with
// SIGCONT while the client links' own heartbeats would still wait for it.
// Consumers resume on the new master while the old one is frozen; nothing
// the stale master delivers after waking reaches a client (no message
// already acked before the wake-up arrives again), and nothing confirmed
// is lost.
func TestChaosMasterFrozen(t *testing.T) {
	restoreClusterOnCleanup(t)
	const grace = time.Second
	p := startChaosProxy(t, node(t, "rabbit1"), chaosOptions{definition: haAllAutomatic, grace: grace})
	queue := declareChaosQueue(t, p, 3)
	w := newWorkload(t, p.url, queue)
	w.addPublisher("p1")
	w.addPublisher("p2")
	w.addConsumer("c1", nil, 1)
	w.addConsumer("c2", nil, 5)
	w.waitProgress(200)

	m := p.waitSynchronised(t, queue, 3)
	frozen := node(t, m.Master)
	frozenAt := time.Now()
	signalNode(t, frozen, syscall.SIGSTOP)
	t.Cleanup(func() { syscall.Kill(frozen.PID(), syscall.SIGCONT) })
	promoted := p.waitMasterMoved(t, queue, frozen.Name)
	promotedAfter := time.Since(frozenAt)
	// A frozen backend is down after failover_grace, found by the proxy's
	// own probes (DESIGN.md §5), not by the client links' AMQP heartbeats
	// or TCP timeouts; the margin is for a loaded machine. The node stays
	// frozen until the consumers were served by the new master or that
	// bound passed, and for 3×grace at least; it wakes before the links'
	// heartbeat timeout (10s), so whatever it sends on links the proxy
	// still holds is put to the test too.
	limit := grace + 4*time.Second
	resumed, inTime := w.resumedWithin(frozenAt, limit)
	testutil.Eventually(t, 10*time.Second, func() error {
		if since := time.Since(frozenAt); since < 3*grace {
			return fmt.Errorf("frozen for %v, want at least %v", since, 3*grace)
		}
		return nil
	})
	wokenAt := time.Now()
	signalNode(t, frozen, syscall.SIGCONT)
	// Checked also when a later step fails: what the woken node sent is
	// the point of this test.
	defer w.checkNoStaleDeliveries(wokenAt)
	if !inTime {
		t.Errorf("no consumer received a message published after the freeze within %v (failover_grace %v) while %s was frozen", limit, grace, frozen.Name)
		resumed = w.waitResumed(frozenAt, "")
	}
	firstPublish, longestConfirm := w.publishingAfter(frozenAt)
	t.Logf("%s frozen for %v (grace %v); %s promoted (epoch %d) within %v; consumers resumed after %v (first publish after the freeze sent after %v; a confirm in flight took up to %v)",
		frozen.Name, wokenAt.Sub(frozenAt).Round(time.Millisecond), grace, promoted.Master, promoted.Epoch,
		promotedAfter.Round(time.Millisecond), resumed.Round(time.Millisecond),
		firstPublish.Round(time.Millisecond), longestConfirm.Round(time.Millisecond))
	w.waitProgress(100)

	// The woken node rejoins as a slave, purged and synchronised again.
	p.waitSynchronised(t, queue, 3)
	w.waitProgress(200)
	w.finish()
}

// TestChaosCancelOnFailover: of two consumers on a queue whose master is
// killed, the one declared with x-cancel-on-ha-failover receives
// basic.cancel; the other goes on by itself.
func TestChaosCancelOnFailover(t *testing.T) {
	restoreClusterOnCleanup(t)
	p := startChaosProxy(t, node(t, "rabbit1"), chaosOptions{definition: haAllAutomatic, grace: killGrace})
	queue := declareChaosQueue(t, p, 3)
	w := newWorkload(t, p.url, queue)
	w.addPublisher("p1")
	cancelling := w.addConsumer("cancel-on-failover", amqp.Table{"x-cancel-on-ha-failover": true}, 1)
	cancels := cancelling.NotifyCancel(make(chan string, 1))
	w.addConsumer("stays", nil, 1)
	w.waitProgress(200)

	m := p.waitSynchronised(t, queue, 3)
	victim := node(t, m.Master)
	killedAt := killNode(t, victim)
	// Kill returns once the VM is gone: a message published after that
	// can only come from the new master.
	goneAt := time.Now()
	select {
	case tag := <-cancels:
		if tag != "cancel-on-failover" {
			t.Errorf("basic.cancel for %q, want %q", tag, "cancel-on-failover")
		}
		t.Logf("basic.cancel %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Errorf("no basic.cancel within 30s of the master's kill")
	}
	t.Logf("the other consumer resumed after %v", w.waitResumed(killedAt, "stays").Round(time.Millisecond))
	w.waitProgress(100)
	restartNode(t, victim)
	p.waitSynchronised(t, queue, 3)
	w.waitProgress(50)
	w.finish()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.deliveries {
		if d.consumer == "cancel-on-failover" && w.publishedAt[d.body].After(goneAt) {
			t.Errorf("%s, published after the killed broker was gone, delivered %v after the kill to the consumer cancelled by the failover", d.body, d.at.Sub(killedAt).Round(time.Millisecond))
		}
	}
}

// TestChaosWhenSyncedNoPromotion: with ha-promote-on-failure when-synced
// and only an unsynchronised slave (it was down while messages were
// published, and syncs manually), the master's death promotes nobody; when
// the master returns the queue serves again with every confirmed message.
func TestChaosWhenSyncedNoPromotion(t *testing.T) {
	restoreClusterOnCleanup(t)
	p := startChaosProxy(t, node(t, "rabbit1"), chaosOptions{
		definition: `{"ha-mode":"nodes","ha-params":["rabbit2","rabbit3"],"ha-sync-mode":"manual","ha-promote-on-failure":"when-synced"}`,
		grace:      killGrace,
	})
	queue := declareChaosQueue(t, p, 2)
	before := p.meta(t, queue)
	master, slave := node(t, before.Master), node(t, before.Slaves[0].Backend)

	killNode(t, slave)
	testutil.Eventually(t, 30*time.Second, func() error {
		if m := p.meta(t, queue); m.SlaveIndex(slave.Name) < 0 || m.Slaves[m.SlaveIndex(slave.Name)].Synchronised {
			return fmt.Errorf("slave %s still synchronised after its kill: %+v", slave.Name, m.Slaves)
		}
		return nil
	})
	// Published while the slave is down: only the master holds them.
	conn := dialURL(t, p.url)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const messages = 100
	for i := range messages {
		dc, err := ch.PublishWithDeferredConfirmWithContext(testContext(t, 10*time.Second), "", queue, false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "m%d", i)})
		if err != nil {
			t.Fatalf("publish m%d: %v", i, err)
		}
		if ok, err := dc.WaitContext(testContext(t, 10*time.Second)); err != nil || !ok {
			t.Fatalf("confirm of m%d: %t, %v", i, ok, err)
		}
	}
	lost := p.meta(t, queue)
	restartNode(t, slave)
	// The slave is back when the engine recorded its rejoin (a write, so the
	// version rises); manual sync leaves it unsynchronised.
	testutil.Eventually(t, 30*time.Second, func() error {
		m := p.meta(t, queue)
		if m.Version <= lost.Version || m.SlaveIndex(slave.Name) < 0 {
			return fmt.Errorf("version %d (was %d), slaves %+v: %s has not rejoined", m.Version, lost.Version, m.Slaves, slave.Name)
		}
		return nil
	})
	if m := p.meta(t, queue); m.Slaves[m.SlaveIndex(slave.Name)].Synchronised {
		t.Fatalf("slave %s synchronised after its return with ha-sync-mode manual: %+v", slave.Name, m.Slaves)
	}

	killNode(t, master)
	var decision []string
	testutil.Eventually(t, 30*time.Second, func() error {
		if decision = p.log.lines("nobody promoted", "master="+master.Name); len(decision) == 0 {
			return fmt.Errorf("no decision logged about the loss of master %s", master.Name)
		}
		return nil
	})
	t.Logf("engine: %s", decision[0])
	after := p.meta(t, queue)
	if after.Master != master.Name || after.Epoch != before.Epoch {
		t.Errorf("after the master's kill: master %s epoch %d, want %s epoch %d (no promotion)", after.Master, after.Epoch, master.Name, before.Epoch)
	}
	// Meanwhile the queue answers as RabbitMQ answers for a queue whose node
	// is down: 404 on get, consume and a passive declare.
	probe := dialURL(t, p.url)
	for _, op := range []struct {
		name string
		do   func(ch *amqp.Channel) error
	}{
		{"basic.get", func(ch *amqp.Channel) error { _, _, err := ch.Get(queue, true); return err }},
		{"basic.consume", func(ch *amqp.Channel) error {
			_, err := ch.Consume(queue, "", true, false, false, false, nil)
			return err
		}},
		{"passive queue.declare", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			return err
		}},
	} {
		pch, err := probe.Channel()
		if err != nil {
			t.Fatalf("channel: %v", err)
		}
		err = op.do(pch)
		var amqpErr *amqp.Error
		if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.NotFound || !strings.Contains(amqpErr.Reason, "is down or inaccessible") {
			t.Errorf("%s while the master is down and nobody was promoted: got %v, want 404 NOT_FOUND ... is down or inaccessible", op.name, err)
		}
	}

	restartNode(t, master)
	consumer := dialURL(t, p.url)
	got := map[string]bool{}
	testutil.Eventually(t, 30*time.Second, func() error {
		// A channel of its own per attempt: an error closes it.
		cch, err := consumer.Channel()
		if err != nil {
			return fmt.Errorf("channel: %w", err)
		}
		defer cch.Close()
		for {
			d, ok, err := cch.Get(queue, true)
			if err != nil {
				return fmt.Errorf("get: %w", err)
			}
			if !ok {
				break
			}
			got[string(d.Body)] = true
		}
		if len(got) < messages {
			return fmt.Errorf("%d of %d confirmed messages received", len(got), messages)
		}
		return nil
	})
	if m := p.meta(t, queue); m.Master != master.Name || m.Epoch != before.Epoch {
		t.Errorf("after the master's return: master %s epoch %d, want %s epoch %d", m.Master, m.Epoch, master.Name, before.Epoch)
	}
}

// TestChaosGetWhileMasterFrozen: a basic.get waiting on a frozen master's
// broker when the proxy counts that broker down is answered get-empty, as
// RabbitMQ's channel retries a get against the new master instead of
// failing it; the channel stays open, and the next get takes the message
// from the new master.
func TestChaosGetWhileMasterFrozen(t *testing.T) {
	restoreClusterOnCleanup(t)
	const grace = 2 * time.Second
	p := startChaosProxy(t, node(t, "rabbit1"), chaosOptions{definition: haAllAutomatic, grace: grace})
	queue := declareChaosQueue(t, p, 3)
	ch, err := dialURL(t, p.url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	publishOneConfirmed(t, ch, queue, "waiting")

	m := p.waitSynchronised(t, queue, 3)
	frozen := node(t, m.Master)
	signalNode(t, frozen, syscall.SIGSTOP)
	t.Cleanup(func() { syscall.Kill(frozen.PID(), syscall.SIGCONT) })
	_, ok, err := ch.Get(queue, false)
	if err != nil {
		t.Fatalf("basic.get in flight when %s was counted down: %v; want get-empty", frozen.Name, err)
	}
	if ok {
		t.Fatalf("basic.get sent to the frozen %s returned a message", frozen.Name)
	}
	promoted := p.waitMasterMoved(t, queue, frozen.Name)
	var d amqp.Delivery
	testutil.Eventually(t, 10*time.Second, func() error {
		if d, ok, err = ch.Get(queue, false); err != nil {
			t.Fatalf("basic.get after the promotion to %s: %v", promoted.Master, err)
		}
		if !ok {
			return fmt.Errorf("get-empty from %s", promoted.Master)
		}
		return nil
	})
	if string(d.Body) != "waiting" {
		t.Fatalf("got %q, want the confirmed message", d.Body)
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	signalNode(t, frozen, syscall.SIGCONT)
	p.waitSynchronised(t, queue, 3)
}

// TestChaosQosWhileHomeFrozen: a request the proxy sends to every backend
// a channel is open on (basic.qos here) takes another backend's reply when
// the first one's broker is counted down before it answers, instead of
// closing the channel, and one asked of that backend alone is answered by
// the proxy; the client keeps its channels.
func TestChaosQosWhileHomeFrozen(t *testing.T) {
	restoreClusterOnCleanup(t)
	const grace = 2 * time.Second
	home := node(t, "rabbit1")
	p := startChaosProxy(t, home, chaosOptions{definition: haAllAutomatic, grace: grace})
	queue := declareChaosQueue(t, p, 3)
	ch, err := dialURL(t, p.url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	// A publish to a queue mirrored on all three opens the channel on
	// every backend.
	publishOneConfirmed(t, ch, queue, "before")

	// A channel that only opened is open on the home backend alone.
	homeOnly, err := dialURL(t, p.url).Channel()
	if err != nil {
		t.Fatal(err)
	}

	signalNode(t, home, syscall.SIGSTOP)
	t.Cleanup(func() { syscall.Kill(home.PID(), syscall.SIGCONT) })
	homeOnlyQos := make(chan error, 1)
	go func() { homeOnlyQos <- homeOnly.Qos(7, 0, false) }()
	if err := ch.Qos(5, 0, false); err != nil {
		t.Fatalf("basic.qos in flight when %s, the first backend asked, was counted down: %v; want qos-ok from another", home.Name, err)
	}
	// The proxy repeats a channel's prefetch on every backend it opens the
	// channel on later, so the setting holds without the lost one.
	if err := <-homeOnlyQos; err != nil {
		t.Fatalf("basic.qos asked of %s alone when it was counted down: %v; want qos-ok from the proxy", home.Name, err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume after the qos: %v", err)
	}
	select {
	case d := <-deliveries:
		if string(d.Body) != "before" {
			t.Fatalf("got %q, want the confirmed message", d.Body)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the confirmed message was not delivered after the failover")
	}
	signalNode(t, home, syscall.SIGCONT)
	p.waitSynchronised(t, queue, 3)
}

// publishOneConfirmed puts ch in confirm mode and publishes one persistent
// message to queue, failing the test unless it is confirmed.
func publishOneConfirmed(t *testing.T, ch *amqp.Channel, queue, body string) {
	t.Helper()
	err := publishWindow(testContext(t, 10*time.Second), ch, "", queue, 1, 1,
		func(int) amqp.Publishing { return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)} }, nil)
	if err != nil {
		t.Fatalf("publishing %q to %s: %v", body, queue, err)
	}
}
