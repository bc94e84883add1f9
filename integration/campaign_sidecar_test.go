package integration

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// The fault campaign of the sidecar cluster: three nodes, each a broker with
// a proxy beside it, the clients of TestSidecarNodeKilledRepeatedly (a
// publisher and a consumer through every proxy, reconnecting to another
// proxy only when theirs was killed), and a nemesis that kills proxies,
// whole nodes and brokers in a seeded random order, each healed and every
// queue synchronised again before the next.

// sidecarNemesis injects one kind of fault in the sidecar cluster and heals
// it. victim is the node it acts on; it returns what it did.
type sidecarNemesis struct {
	name   string
	inject func(t *testing.T, nodes *killSidecars, load *killLoad, queues []string, victim int) string
}

var sidecarNemeses = []sidecarNemesis{
	{"kill -9 a proxy, restarted with its state dir", killOneProxy},
	{"kill -9 a whole node, proxy and broker", killWholeNode},
	{"kill -9 a master's broker, its proxy up", killMasterBroker},
	{"SIGSTOP a master's broker past failover_grace, its proxy up", freezeMasterBroker},
}

// TestCampaignSidecar: whatever the nemesis does to proxies and brokers,
// every confirmed message is received, clients of proxies that were not
// killed never see their connection or consumers end, and a message
// delivered again through the proxy process that delivered it first
// carries redelivered.
func TestCampaignSidecar(t *testing.T) {
	queues := []string{"sidecarcampaign_1", "sidecarcampaign_2", "sidecarcampaign_3"}
	restoreClusterOnCleanup(t)
	t.Cleanup(func() { removeLeftovers(t, queues...) })
	seed, rnd := campaignRandom(t)
	faults := bySize(len(sidecarNemeses), 2*len(sidecarNemeses)*3)
	t.Logf("sidecar campaign: %d faults, seed %d (%s=%d replays the order)", faults, seed, campaignSeedVariable, seed)

	nodes := startKillSidecars(t, "^sidecarcampaign_")
	declareSidecarQueues(t, nodes, queues)
	load := startKillLoad(t, nodes, queues)
	order := mixed(rnd, sidecarNemeses, faults)
	injected := map[string]int{}
	for i, n := range order {
		began := time.Now()
		victim := rnd.IntN(len(nodes.brokers))
		what := n.inject(t, nodes, load, queues, victim)
		nodes.awaitSynchronised(t, (victim+1)%len(nodes.brokers), queues)
		load.waitProgress(t, 100)
		injected[n.name]++
		t.Logf("fault %d/%d: %s: %s; whole again after %v", i+1, len(order), n.name, what, time.Since(began).Round(time.Millisecond))
	}
	load.finish(t)
	for _, q := range queues {
		if err := deleteThrough(nodes.proxy(0), q); err != nil {
			t.Errorf("deleting %s through proxy 1: %v", q, err)
		}
	}
	for _, n := range sidecarNemeses {
		t.Logf("%s: %d", n.name, injected[n.name])
	}
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
			if err := declareThrough(nodes.proxy(i), q); err != nil {
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

func killWholeNode(t *testing.T, nodes *killSidecars, load *killLoad, _ []string, victim int) string {
	nodes.kill(t, victim)
	nodes.restart(t, victim)
	load.comeHome(victim)
	return fmt.Sprintf("node %d (%s and its proxy)", victim+1, nodes.brokers[victim].Name)
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

// killProxy sends SIGKILL to node i's proxy alone and waits until it is
// gone; its broker runs on.
func (s *killSidecars) killProxy(t *testing.T, i int) {
	t.Helper()
	s.mu.Lock()
	p := s.proxies[i]
	s.up[i] = false
	s.kills[i]++
	s.mu.Unlock()
	if err := p.command.Process.Kill(); err != nil {
		t.Fatalf("kill -9 the proxy beside %s: %v", s.brokers[i].Name, err)
	}
	<-p.done
}

// restartProxy starts node i's proxy again with the same config and
// state_dir, and waits until it is ready.
func (s *killSidecars) restartProxy(t *testing.T, i int) {
	t.Helper()
	p := startServeProcess(t, s.binary, s.proxy(i).configPath)
	s.mu.Lock()
	s.proxies[i] = p
	s.mu.Unlock()
	s.awaitReady(t, i)
}
