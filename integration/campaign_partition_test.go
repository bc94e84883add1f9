package integration

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The campaign of partitions in the sidecar cluster: the proxies run in network
// namespaces as TestSidecarPartition's do (partition_test.go: their brokers are the
// shared ones, reached through the bridge namespace), with the clients and the checker
// of TestCampaignSidecar, and a nemesis that cuts one proxy off from the other two (serf
// gossip and raft; every proxy still reaches every broker), or one proxy off from another
// node's broker while the other proxies still reach that broker: a partial partition. The
// sidecar campaign's kills, freezes and wipes are mixed in.

// TestCampaignPartitions: whatever the partitions, mixed with the sidecar campaign's
// faults, every confirmed message is received, no message nobody published is, and a
// message delivered again through the proxy process that delivered it first carries
// redelivered. A proxy cut off from the other two pauses (pause_minority), closing its
// clients with 320, which reconnect to another proxy until it serves again; a proxy cut
// off from one broker is hit by nothing: its clients, as every other proxy's, never see
// their connection or a consumer end. The default tier injects each partition and two of
// the sidecar campaign's faults, chosen at random; AMQP_MIRROR_CAMPAIGN_FAULTS more, of
// every kind.
func TestCampaignPartitions(t *testing.T) {
	queues := []string{"partition_campaign_1", "partition_campaign_2", "partition_campaign_3"}
	t.Cleanup(func() { removeLeftovers(t, queues...) })
	restoreClusterOnCleanup(t)
	seed, rnd := campaignRandom(t)
	network := newPartitionNetwork(t)
	partitions := []sidecarNemesis{
		{"cut a proxy off from the other two", network.isolateOneProxy, false},
		{"cut a proxy off from another node's broker, the others still reach it", network.cutOneBroker, false},
	}
	kinds := append(slices.Clone(partitions), sidecarNemeses...)
	faults := campaignFaults(t, len(partitions)+2, 100)
	var order []sidecarNemesis
	if faults < len(kinds) {
		order = append(slices.Clone(partitions), mixed(rnd, sidecarNemeses, 0)[:max(0, faults-len(partitions))]...)
		rnd.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	} else {
		order = mixed(rnd, kinds, faults)
	}
	t.Logf("partition campaign: %d faults, seed %d (%s=%d replays the order)", len(order), seed, campaignSeedVariable, seed)
	nodes := newKillSidecars(cluster.Nodes(), network.startProxies(t), network.dialer)
	runSidecarCampaign(t, nodes, queues, kinds, order, rnd)
}

// cutBrokerHold is how long cutOneBroker holds its cut once the proxy counts the broker
// down: a few of its questions to the other proxies, a second apart.
const cutBrokerHold = 2500 * time.Millisecond

// isolateOneProxy cuts proxy victim off from the other two, holds the cut until it has
// paused and the others list no queue mastered on its broker, and heals it.
func (n *partitionNetwork) isolateOneProxy(t *testing.T, nodes *killSidecars, load *killLoad, queues []string, victim int) string {
	broker := nodes.brokers[victim].Name
	asked := (victim + 1) % len(nodes.brokers)
	nodes.hit(victim, false) // it pauses, and closes its clients
	cutAt := time.Now()
	n.isolateProxy(t, true, victim)
	awaitCondition(t, 90*time.Second, func() error {
		status, err := nodes.status(t, victim)
		if err != nil {
			return err
		}
		if !status.Paused {
			return fmt.Errorf("the proxy beside %s, cut off, is not paused", broker)
		}
		return mastersMovedFrom(t, nodes, asked, queues, broker)
	})
	held := time.Since(cutAt)
	n.isolateProxy(t, false, victim)
	nodes.serveAgain(t, victim)
	load.comeHome(victim)
	return fmt.Sprintf("the proxy beside %s cut off for %v", broker, held.Round(time.Millisecond))
}

// cutOneBroker cuts proxy victim off from another node's broker (the master of a queue
// when that is another node's), holds the cut until the proxy counts that broker down (its
// own probe, past failover_grace) and for cutBrokerHold more, while it asks the others
// whether to promote away from it, and heals it. The other proxies reach the broker all
// along.
func (n *partitionNetwork) cutOneBroker(t *testing.T, nodes *killSidecars, _ *killLoad, queues []string, victim int) string {
	asked := (victim + 1) % len(nodes.brokers)
	broker := masterOf(t, nodes, queues[victim%len(queues)], asked)
	if broker == victim {
		broker = asked
	}
	name := nodes.brokers[broker].Name
	cutAt := time.Now()
	n.blockBroker(t, true, victim, broker)
	awaitCondition(t, 90*time.Second, func() error {
		status, err := nodes.status(t, victim)
		if err != nil {
			return err
		}
		for _, b := range status.Backends {
			if b.Name == name && b.State == "down" {
				return nil
			}
		}
		return fmt.Errorf("the proxy beside %s, cut off from %s, does not count it down: %v", nodes.brokers[victim].Name, name, status.Backends)
	})
	time.Sleep(cutBrokerHold)
	held := time.Since(cutAt)
	rows, err := listQueues(t, nodes.proxy(victim))
	if err != nil {
		t.Fatal(err)
	}
	n.blockBroker(t, false, victim, broker)
	var masters []string
	for _, q := range queues {
		masters = append(masters, q+" on "+rows[q].Master)
	}
	return fmt.Sprintf("the proxy beside %s cut off from %s for %v (it listed %v)", nodes.brokers[victim].Name, name, held.Round(time.Millisecond), masters)
}
