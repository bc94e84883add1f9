package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"
)

// The fault campaign of the sidecar cluster: three nodes, each a broker with
// a proxy beside it, the clients of TestSidecarNodeKilledRepeatedly (a
// publisher and a consumer through every proxy, reconnecting to another
// proxy only when the fault under way hit theirs), and a nemesis that kills,
// stops and freezes proxies, kills whole nodes, and kills and freezes
// brokers, in a seeded random order, each healed, every proxy serving and
// every queue synchronised again before the next.

// sidecarNemesis injects one kind of fault in the sidecar cluster and heals
// it. victim is the node it acts on; it returns what it did.
type sidecarNemesis struct {
	name   string
	inject func(t *testing.T, nodes *killSidecars, load *killLoad, queues []string, victim int) string
	// wakes says that the fault stops the victim's proxy and wakes it: nothing its
	// broker's deposed masters sent its consumers meanwhile may reach them, so no
	// message comes again without redelivered through it.
	wakes bool
}

var sidecarNemeses = []sidecarNemesis{
	{"kill -9 a proxy, restarted with its state dir", killOneProxy, false},
	{"SIGTERM a proxy, restarted with its state dir", stopOneProxy, false},
	{"SIGSTOP a proxy, shorter than failover_grace", freezeProxyShort, true},
	{"SIGSTOP a proxy, longer than failover_grace", freezeProxyLong, true},
	{"kill -9 a whole node, proxy and broker", killWholeNode, false},
	{"kill -9 a master's broker, its proxy up", killMasterBroker, false},
	{"SIGSTOP a master's broker past failover_grace, its proxy up", freezeMasterBroker, false},
	{"restart a master's broker with its data wiped, its proxy up", wipeMasterBroker, false},
}

// TestCampaignSidecar: whatever the nemesis does to proxies and brokers,
// every confirmed message is received, no message nobody published is,
// clients of proxies the fault under way did not hit never see their
// connection or consumers end, and a message delivered again through the
// proxy process that delivered it first carries redelivered. A proxy the
// fault hit (killed, stopped or frozen) may end its clients' connections,
// and they reconnect to another proxy until theirs serves again.
func TestCampaignSidecar(t *testing.T) {
	queues := []string{"sidecarcampaign_1", "sidecarcampaign_2", "sidecarcampaign_3"}
	restoreClusterOnCleanup(t)
	t.Cleanup(func() { removeLeftovers(t, queues...) })
	seed, rnd := campaignRandom(t)
	faults := campaignFaults(t, len(sidecarNemeses), 2*len(sidecarNemeses)*3)
	t.Logf("sidecar campaign: %d faults, seed %d (%s=%d replays the order)", faults, seed, campaignSeedVariable, seed)

	nodes := startKillSidecars(t, "^sidecarcampaign_")
	runSidecarCampaign(t, nodes, queues, sidecarNemeses, mixed(rnd, sidecarNemeses, faults), rnd)
}

// settleMargin is how long after a client's ack settled on its channel the campaign
// counts a fault as possibly in time to lose the settle on its way to the slaves'
// trimmers (batched, and across the cluster best effort: docs/guarantees.md).
const settleMargin = 3 * time.Second

// runSidecarCampaign declares queues, starts the clients, injects the faults of
// order one after another, each on a random node, healed, every proxy serving
// and every queue synchronised again before the next, then checks what the
// clients saw (killLoad.finish) and deletes the queues.
func runSidecarCampaign(t *testing.T, nodes *killSidecars, queues []string, kinds, order []sidecarNemesis, rnd *rand.Rand) {
	t.Helper()
	declareSidecarQueues(t, nodes, queues)
	load := startKillLoad(t, nodes, queues)
	injected := map[string]int{}
	victims := make([]int, len(order))
	began := time.Now()
	for i, n := range order {
		from := time.Now()
		victim := rnd.IntN(len(nodes.brokers))
		victims[i] = victim
		nodes.beginFault()
		what := n.inject(t, nodes, load, queues, victim)
		nodes.awaitServing(t)
		nodes.awaitSynchronised(t, (victim+1)%len(nodes.brokers), queues)
		load.waitProgress(t, 100)
		load.fault(from, time.Now())
		injected[n.name]++
		t.Logf("fault %d/%d: %s: %s; whole again after %v", i+1, len(order), n.name, what, time.Since(from).Round(time.Millisecond))
	}
	nodes.beginFault() // the end of the last fault: the drain is no fault's
	load.finish(t)
	load.mu.Lock()
	again := load.ackedThenRedelivered(settleMargin)
	if len(again) > 0 {
		t.Errorf("%d delivered again although an ack of theirs settled %v or more before the next fault: %s",
			len(again), settleMargin, abbreviate(again))
	}
	woken := 0
	for i, n := range order {
		if repeats := load.unflaggedVia[faultProxy{i + 1, victims[i]}]; repeats > 0 && n.wakes {
			woken += repeats
			t.Errorf("fault %d (%s): the woken proxy %d delivered %d messages again without redelivered", i+1, n.name, victims[i]+1, repeats)
		}
	}
	report := sidecarCampaignReport(kinds, injected, load, woken, len(again))
	load.mu.Unlock()
	t.Log("\n" + report)
	if path := os.Getenv("AMQP_MIRROR_CAMPAIGN_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Errorf("write the report: %v", err)
		}
	}
	for _, q := range queues {
		if err := nodes.deleteQueue(0, q); err != nil {
			t.Errorf("deleting %s through proxy 1: %v", q, err)
		}
	}
	for _, n := range kinds {
		t.Logf("%s: %d", n.name, injected[n.name])
	}
	t.Logf("%d faults in %v", len(order), time.Since(began).Round(time.Second))
}

// declareSidecarQueues declares queue i through proxy i, client-local, so
// that node i masters it, waits until every copy is a synchronised slave,
// and has every broker write its metadata (a kill -9 a moment after a
// declare can lose the queue on that broker: see declareChaosQueue).
func declareSidecarQueues(t *testing.T, nodes *killSidecars, queues []string) {
	t.Helper()
	names := mirrorBackends()
	for i, q := range queues {
		awaitCondition(t, 60*time.Second, func() error {
			if err := nodes.declare(i, q); err != nil {
				return err
			}
			row, err := queueStatus(t, nodes.proxy(i), q)
			if err != nil {
				return err
			}
			if row.Master != names[i] {
				return fmt.Errorf("proxy %d lists %v, want it mastered on %s", i+1, row, names[i])
			}
			return nil
		})
	}
	nodes.awaitSynchronised(t, 0, queues)
	for _, b := range nodes.brokers {
		if err := b.FlushMetadata(testContext(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

func killOneProxy(t *testing.T, nodes *killSidecars, load *killLoad, _ []string, victim int) string {
	nodes.killProxy(t, victim)
	nodes.restartProxy(t, victim)
	load.comeHome(victim)
	return fmt.Sprintf("the proxy beside %s", nodes.brokers[victim].Name)
}

func stopOneProxy(t *testing.T, nodes *killSidecars, load *killLoad, _ []string, victim int) string {
	took := nodes.stopProxy(t, victim)
	nodes.restartProxy(t, victim)
	load.comeHome(victim)
	return fmt.Sprintf("the proxy beside %s, stopped in %v", nodes.brokers[victim].Name, took.Round(time.Millisecond))
}

// freezeProxyShort freezes a proxy for a third of failover_grace: serf
// holds it failed within about a second all the same, so the others count
// its broker down and move its masters away, while its own clients wait.
func freezeProxyShort(t *testing.T, nodes *killSidecars, load *killLoad, _ []string, victim int) string {
	pause := (mirrorFailoverGrace / 3).Round(time.Millisecond)
	thaw := nodes.freezeProxy(t, victim)
	time.Sleep(pause) // the fault: a freeze of this length
	thaw()
	load.comeHome(victim)
	return fmt.Sprintf("the proxy beside %s, frozen for %v", nodes.brokers[victim].Name, pause)
}

// freezeProxyLong freezes a proxy past failover_grace, and until the others
// list no queue mastered on its broker: woken, its own probes and timers
// find every deadline passed at once.
func freezeProxyLong(t *testing.T, nodes *killSidecars, load *killLoad, queues []string, victim int) string {
	broker := nodes.brokers[victim].Name
	asked := (victim + 1) % len(nodes.brokers)
	frozenAt := time.Now()
	thaw := nodes.freezeProxy(t, victim)
	awaitCondition(t, 90*time.Second, func() error {
		if frozen := time.Since(frozenAt); frozen <= mirrorFailoverGrace+time.Second {
			return fmt.Errorf("frozen for %v, not past failover_grace (%v) yet", frozen, mirrorFailoverGrace)
		}
		return mastersMovedFrom(t, nodes, asked, queues, broker)
	})
	frozen := time.Since(frozenAt)
	thaw()
	load.comeHome(victim)
	return fmt.Sprintf("the proxy beside %s, frozen for %v", broker, frozen.Round(time.Millisecond))
}

// mastersMovedFrom says, as proxy asked lists them, whether no queue of queues is
// mastered on broker any more (nil), and which one is otherwise.
func mastersMovedFrom(t *testing.T, nodes *killSidecars, asked int, queues []string, broker string) error {
	rows, err := listQueues(t, nodes.proxy(asked))
	if err != nil {
		return err
	}
	for _, q := range queues {
		if rows[q].Master == broker {
			return fmt.Errorf("proxy %d lists %v, still mastered on %s", asked+1, rows[q], broker)
		}
	}
	return nil
}

func killWholeNode(t *testing.T, nodes *killSidecars, load *killLoad, _ []string, victim int) string {
	nodes.kill(t, victim)
	nodes.restart(t, victim)
	load.comeHome(victim)
	return fmt.Sprintf("node %d (%s and its proxy)", victim+1, nodes.brokers[victim].Name)
}

// longestPause is the longest time no consumer received anything while the publishers
// ran (until the last publish). l.mu is held.
func (l *killLoad) longestPause() time.Duration {
	var lastPublish time.Time
	for _, at := range l.publishedAt {
		if at.After(lastPublish) {
			lastPublish = at
		}
	}
	times := make([]time.Time, 0, len(l.deliveries))
	for _, d := range l.deliveries {
		if !d.at.After(lastPublish) {
			times = append(times, d.at)
		}
	}
	slices.SortFunc(times, time.Time.Compare)
	var longest time.Duration
	for i := 1; i < len(times); i++ {
		longest = max(longest, times[i].Sub(times[i-1]))
	}
	return longest
}

// sidecarCampaignReport is the table of a sidecar campaign: the faults injected by kind,
// then what the clients saw (load.mu held). woken counts the repeats without
// redelivered through a proxy woken from a freeze, acked the messages delivered again
// after an ack of theirs settled with no fault within settleMargin.
func sidecarCampaignReport(kinds []sidecarNemesis, injected map[string]int, load *killLoad, woken, acked int) string {
	var b strings.Builder
	names := make([]string, len(kinds))
	for i, n := range kinds {
		names[i] = n.name
	}
	writeFaultTable(&b, names, injected)
	lost := 0
	for body := range load.confirmed {
		if load.received[body] == 0 {
			lost++
		}
	}
	repeated := 0
	for _, n := range load.received {
		if n > 1 {
			repeated++
		}
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, row := range []struct {
		name  string
		value any
	}{
		{"published", len(load.publishedAt)},
		{"confirmed", len(load.confirmed)},
		{"nacked", load.nacked},
		{"received", len(load.received)},
		{"lost (confirmed, never received)", lost},
		{"unexpected and other client problems", len(load.problems)},
		{"received more than once", repeated},
		{"again without redelivered through a proxy woken from a freeze", woken},
		{"again without redelivered through another proxy (not guaranteed)", len(load.unflagged) - woken},
		{fmt.Sprintf("again after an ack settled, no fault within %v", settleMargin), acked},
		{"again after an ack settled, a fault within it (best effort)", len(load.ackedThenRedelivered(0)) - acked},
		{"longest pause between deliveries, while publishing", load.longestPause().Round(time.Millisecond)},
		{"client reconnects (clients of a proxy hit by the fault)", load.reconnects},
	} {
		fmt.Fprintf(tw, "%s\t%v\n", row.name, row.value)
	}
	tw.Flush()
	return b.String()
}

// masterOf is the index of the broker that masters queue, as proxy asked
// lists it; a listing that fails (a loaded machine can make ctl wait past
// its timeout) is asked again.
func masterOf(t *testing.T, nodes *killSidecars, queue string, asked int) int {
	t.Helper()
	master := -1
	awaitCondition(t, 60*time.Second, func() error {
		rows, err := listQueues(t, nodes.proxy(asked))
		if err != nil {
			return err
		}
		for i, b := range nodes.brokers {
			if b.Name == rows[queue].Master {
				master = i
				return nil
			}
		}
		return fmt.Errorf("proxy %d lists no master for %s: %v", asked+1, queue, rows[queue])
	})
	return master
}

func killMasterBroker(t *testing.T, nodes *killSidecars, _ *killLoad, queues []string, pick int) string {
	queue := queues[pick%len(queues)]
	m := masterOf(t, nodes, queue, pick)
	killNode(t, nodes.brokers[m])
	restartNode(t, nodes.brokers[m])
	return fmt.Sprintf("%s, master of %s", nodes.brokers[m].Name, queue)
}

// wipeMasterBroker kills a master's broker, deletes its data (queues, messages,
// definitions) and starts it empty: the proxies declare its copies again as new
// slaves, which synchronise.
func wipeMasterBroker(t *testing.T, nodes *killSidecars, _ *killLoad, queues []string, pick int) string {
	queue := queues[pick%len(queues)]
	m := masterOf(t, nodes, queue, pick)
	if err := nodes.brokers[m].Wipe(); err != nil {
		t.Fatal(err)
	}
	restartNode(t, nodes.brokers[m])
	return fmt.Sprintf("%s, master of %s, killed, its data deleted, started empty", nodes.brokers[m].Name, queue)
}

func freezeMasterBroker(t *testing.T, nodes *killSidecars, _ *killLoad, queues []string, pick int) string {
	queue := queues[pick%len(queues)]
	m := masterOf(t, nodes, queue, pick)
	broker := nodes.brokers[m]
	frozenAt := time.Now()
	signalNode(t, broker, syscall.SIGSTOP)
	asked := (m + 1) % len(nodes.brokers)
	awaitCondition(t, 60*time.Second, func() error {
		rows, err := listQueues(t, nodes.proxy(asked))
		if err != nil {
			return err
		}
		if rows[queue].Master == broker.Name {
			return fmt.Errorf("%s still masters %s", broker.Name, queue)
		}
		return nil
	})
	signalNode(t, broker, syscall.SIGCONT)
	return fmt.Sprintf("%s, master of %s, frozen for %v", broker.Name, queue, time.Since(frozenAt).Round(time.Millisecond))
}

// declare declares a durable queue through proxy i.
func (s *killSidecars) declare(i int, queue string) error {
	if err := declareDurable(s.connect(i))(queue); err != nil {
		return fmt.Errorf("declaring %s through proxy %d: %w", queue, i+1, err)
	}
	return nil
}

// deleteQueue deletes a queue through proxy i.
func (s *killSidecars) deleteQueue(i int, queue string) error {
	conn, err := s.connect(i)
	if err != nil {
		return err
	}
	defer conn.Close()
	return deleteQueue(conn, queue)
}

// killProxy sends SIGKILL to node i's proxy alone and waits until it is
// gone; its broker runs on.
func (s *killSidecars) killProxy(t *testing.T, i int) {
	t.Helper()
	p := s.hit(i, true)
	if err := p.command.Process.Kill(); err != nil {
		t.Fatalf("kill -9 the proxy beside %s: %v", s.brokers[i].Name, err)
	}
	<-p.done
}

// stopWithin bounds a proxy's graceful stop in the campaigns: its shutdown_timeout
// (5 s) for its clients, then its servers' and cluster's own stop, on a loaded machine.
const stopWithin = 45 * time.Second

// stopProxy sends SIGTERM to node i's proxy alone, waits until it has
// exited, cleanly, and says how long that took; its broker runs on.
func (s *killSidecars) stopProxy(t *testing.T, i int) time.Duration {
	t.Helper()
	p := s.hit(i, true)
	began := time.Now()
	if err := p.command.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM to the proxy beside %s: %v", s.brokers[i].Name, err)
	}
	select {
	case <-p.done:
	case <-time.After(stopWithin):
		// Its goroutines' stacks (SIGQUIT) say where the stop hangs.
		p.command.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
		t.Fatalf("the proxy beside %s still ran %v after SIGTERM (its shutdown_timeout is 5s); its log and, after SIGQUIT, its goroutines:\n%s", s.brokers[i].Name, stopWithin, p.stderr)
	}
	if code := p.command.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the proxy beside %s exited with %d after SIGTERM:\n%s", s.brokers[i].Name, code, p.stderr)
	}
	return time.Since(began)
}

// freezeProxy stops node i's proxy with SIGSTOP, its broker running on, and
// returns once all of the proxy's threads have stopped. thaw sends SIGCONT
// (as a cleanup does, should the test end first) and waits until every
// proxy serves again.
func (s *killSidecars) freezeProxy(t *testing.T, i int) (thaw func()) {
	t.Helper()
	p := s.hit(i, false)
	pid := p.command.Process.Pid
	var once sync.Once
	resume := func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT to the proxy beside %s: %v", s.brokers[i].Name, err)
			}
		})
	}
	t.Cleanup(resume)
	freezeProcess(t, "the proxy beside "+s.brokers[i].Name, pid)
	return func() {
		t.Helper()
		resume()
		s.serveAgain(t, i)
	}
}

// serveAgain waits until every proxy serves (awaitServing), then marks proxy
// i, which a fault hit, up again.
func (s *killSidecars) serveAgain(t *testing.T, i int) {
	t.Helper()
	s.awaitServing(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.up[i] = true
}

// sidecarStatus is what the tests read of ctl cluster_status.
type sidecarStatus struct {
	Paused bool
	Nodes  []struct{ Name, State string }
	// Backends' states are up, down or unknown.
	Backends []struct{ Name, State string }
}

// status is ctl cluster_status as proxy i answers it.
func (s *killSidecars) status(t *testing.T, i int) (sidecarStatus, error) {
	t.Helper()
	var status sidecarStatus
	r := s.proxy(i).ctl(t, "cluster_status", "--formatter", "json")
	if r.code != 0 {
		return status, fmt.Errorf("proxy %d: ctl cluster_status: exit %d: %s", i+1, r.code, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), &status); err != nil {
		return status, fmt.Errorf("proxy %d: ctl cluster_status --formatter json: %v\n%s", i+1, err, r.stdout)
	}
	return status, nil
}

// awaitServing waits until every proxy runs, is not paused, and sees every
// proxy alive and every backend up.
func (s *killSidecars) awaitServing(t *testing.T) {
	t.Helper()
	awaitCondition(t, 90*time.Second, func() error {
		var errs []error
		for i := range s.brokers {
			p := s.proxy(i)
			if p.exited() {
				t.Fatalf("the proxy beside %s exited by itself (%v):\n%s", s.brokers[i].Name, p.command.ProcessState, p.stderr)
			}
			status, err := s.status(t, i)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if status.Paused {
				errs = append(errs, fmt.Errorf("proxy %d is paused", i+1))
			}
			if len(status.Nodes) != len(s.brokers) {
				errs = append(errs, fmt.Errorf("proxy %d lists %d proxies, want %d", i+1, len(status.Nodes), len(s.brokers)))
			}
			for _, n := range status.Nodes {
				if n.State != "alive" {
					errs = append(errs, fmt.Errorf("proxy %d sees proxy %s %s", i+1, n.Name, n.State))
				}
			}
			for _, b := range status.Backends {
				if b.State != "up" {
					errs = append(errs, fmt.Errorf("proxy %d counts %s %s", i+1, b.Name, b.State))
				}
			}
		}
		return errors.Join(errs...)
	})
}

// restartProxy starts node i's proxy again with the same config and
// state_dir, and waits until it is ready.
func (s *killSidecars) restartProxy(t *testing.T, i int) {
	t.Helper()
	p := startServeProcess(t, s.proxy(i).binary, s.proxy(i).configPath)
	s.mu.Lock()
	s.proxies[i] = p
	s.mu.Unlock()
	s.awaitReady(t, i)
}
