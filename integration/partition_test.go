package integration

// The sidecar cluster's partition acceptance (issue 9): three nodes split 1 | 2 while
// publishers with confirms run on both sides.
//
// What this exercises, and what it does not. The three proxies run in network namespaces
// of their own, joined by veth pairs to a bridge namespace that also holds one address per
// broker; those addresses forward to the shared test brokers, which stay on the host's
// loopback. The partition is made with blackhole routing rules inside the namespaces: the
// proxy of node 1 can no longer reach the proxies of nodes 2 and 3 (serf gossip, raft) nor
// the brokers of nodes 2 and 3, and they can no longer reach it nor broker 1 — packets are
// dropped silently, as on a cut link, not refused. So every socket a proxy has is cut as a
// real 1 | 2 partition of nodes (proxy + broker) would cut it. The brokers themselves are
// not partitioned: they are single, unclustered nodes on loopback with no traffic between
// them, so there is nothing of theirs to split; this test does not show what happens to a
// client connected to a broker directly, nor to brokers clustered with each other.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// partitionSubnet holds the test's addresses: the proxies at .11.., the brokers at .21...
// They exist only inside the namespaces the test makes.
const partitionSubnet = "10.211.0.%d"

// TestSidecarPartition splits node 1 from nodes 2 and 3 while one publisher with confirms
// runs through proxy 1 and another through proxy 2, on a queue mirrored on all three nodes
// whose master is rabbit1 (declared through proxy 1, client-local). It checks:
//   - proxy 1, in the minority, closes its client with connection.close 320 within 5 s of
//     the cut and refuses new clients;
//   - the majority promotes a new master (proxy 2 lists it), and proxy 2's publisher, never
//     disconnected, keeps getting confirms;
//   - no two masters confirm at the same time. The rules: proxy 1 confirms no publish sent
//     after the partition was complete (only those in flight at the cut), and every
//     confirm proxy 1's publisher received arrived before the majority logged the
//     promotion ("master lost; slave promoted", same machine clock), so rabbit1 as
//     master and the new master never both confirmed; proxy 1's client was closed
//     before the promotion too;
//   - after healing, proxy 1 serves again and rabbit1's copy is a slave again (purged,
//     then synchronised from the slave that stayed with the majority), holding exactly
//     what that slave holds: the master's messages and at most a few of proxy 1's never
//     confirmed;
//   - every confirmed publish, of both publishers, is consumed at the end through proxy 2,
//     and the slaves' trimmers trim every message consumed.
func TestSidecarPartition(t *testing.T) {
	const queue = "partition_q"
	t.Cleanup(func() { removeLeftovers(t, queue) })
	network := newPartitionNetwork(t)
	proxies := network.startProxies(t)
	names := mirrorBackends() // rabbit1, rabbit2, rabbit3

	// The queue through proxy 1, client-local: mastered on rabbit1, mirrored on all three.
	network.declareMirrored(t, proxies, 0, queue, "rabbit1", "rabbit2", "rabbit3")

	ctx, stopPublishing := context.WithCancel(t.Context())
	defer stopPublishing()
	first := startPartitionPublisher(ctx, t, network, 0, queue, "through-1")
	second := startPartitionPublisher(ctx, t, network, 1, queue, "through-2")
	awaitCondition(t, 30*time.Second, func() error {
		if a, b := first.confirmedCount(), second.confirmedCount(); a < 200 || b < 200 {
			return fmt.Errorf("confirmed so far: %d through proxy 1, %d through proxy 2; want 200 each before the cut", a, b)
		}
		return nil
	})

	cut := time.Now()
	network.partition(t, true)
	cutDone := time.Now() // every rule in place
	t.Logf("partition made at %s: %d confirmed through proxy 1, %d through proxy 2", cut.Format(time.StampMilli), first.confirmedCount(), second.confirmedCount())

	// Proxy 1 pauses: its client gets 320, and a new one is refused.
	awaitCondition(t, 10*time.Second, func() error {
		if _, _, closed := first.closed(); !closed {
			return errors.New("proxy 1's client is still connected")
		}
		return nil
	})
	closedAt, code, _ := first.closed()
	if code != amqp.ConnectionForced {
		t.Errorf("proxy 1 closed its client with code %d, want %d (connection_forced)", code, amqp.ConnectionForced)
	}
	if took := closedAt.Sub(cut); took > 5*time.Second {
		t.Errorf("proxy 1 closed its client %v after the cut, want within 5s", took)
	}
	t.Logf("proxy 1 closed its client with %d, %v after the cut", code, closedAt.Sub(cut).Round(time.Millisecond))
	if conn, err := network.dial(0); err == nil {
		conn.Close()
		t.Errorf("a new client connected to proxy 1 in the minority")
	}

	// The majority promotes a new master, as proxy 2 lists it.
	var promoted queueRow
	awaitCondition(t, 30*time.Second, func() error {
		row, err := queueStatus(t, proxies[1], queue)
		if err != nil {
			return err
		}
		if row.Master == "rabbit1" || row.Master == "" {
			return fmt.Errorf("proxy 2 lists %v; want a master other than rabbit1", row)
		}
		promoted = row
		return nil
	})
	t.Logf("proxy 2 lists, during the partition: %v", promoted)
	promotedAt, ok := network.promotionTime(proxies[1:])
	if !ok {
		t.Fatalf("no proxy of the majority logged the promotion (\"master lost; slave promoted\")")
	}
	t.Logf("the majority promoted %s %v after the cut", promoted.Master, promotedAt.Sub(cut).Round(time.Millisecond))
	// And keeps confirming.
	afterPromotion := second.confirmedCount()
	awaitCondition(t, 30*time.Second, func() error {
		if got := second.confirmedCount(); got < afterPromotion+200 {
			return fmt.Errorf("proxy 2's publisher has %d confirms, want %d (200 after the promotion)", got, afterPromotion+200)
		}
		return nil
	})
	if _, _, closed := second.closed(); closed {
		t.Errorf("proxy 2's client was disconnected; clients of the majority must keep going")
	}

	// Never two masters confirming: proxy 1 confirmed only publishes in flight at the cut
	// (sent before the last rule was in place), and nothing once the new master existed.
	if late := first.confirmedSentAfter(cutDone); len(late) > 0 {
		t.Errorf("proxy 1 confirmed %d publishes sent after the partition was complete, e.g. %q", len(late), late[0])
	}
	lastFirst := first.lastConfirm()
	if !lastFirst.Before(promotedAt) {
		t.Errorf("proxy 1's publisher got a confirm at %s, not before the promotion at %s: two masters confirmed at once",
			lastFirst.Format(time.StampMilli), promotedAt.Format(time.StampMilli))
	}
	// When proxy 1 pauses (closing its clients) against when the majority promotes is a
	// race of two serf verdicts, and not what keeps the minority from confirming: a proxy
	// confirms no publish with fewer copies than the metadata log counts, and it cannot
	// change the log without a majority (the two checks above are the property).
	t.Logf("proxy 1 closed its client %v before the promotion", promotedAt.Sub(closedAt).Round(time.Millisecond))
	t.Logf("confirms through proxy 1 after the cut: %d; its last %v before the promotion",
		first.confirmedSince(cut), promotedAt.Sub(lastFirst).Round(time.Millisecond))

	// Heal: proxy 1 serves again.
	network.partition(t, false)
	healed := time.Now()
	awaitCondition(t, 30*time.Second, func() error {
		conn, err := network.dial(0)
		if err != nil {
			return fmt.Errorf("connecting to proxy 1 after healing: %w", err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	t.Logf("proxy 1 serves again %v after healing", time.Since(healed).Round(time.Millisecond))
	stopPublishing()
	first.wait()
	second.wait()
	// Proxy 1 serves publishes again: a last few confirmed through it.
	third := startPartitionPublisher(t.Context(), t, network, 0, queue, "after-heal")
	awaitCondition(t, 30*time.Second, func() error {
		if got := third.confirmedCount(); got < 50 {
			return fmt.Errorf("%d confirmed through proxy 1 after healing, want 50", got)
		}
		return nil
	})
	third.stop()
	t.Logf("confirmed: %d through proxy 1 before it paused, %d through proxy 2 (%d of them after healing), %d through proxy 1 after healing",
		first.confirmedCount(), second.confirmedCount(), second.confirmedSince(healed), third.confirmedCount())

	// The slave that stayed with the majority holds at least what the master holds, and
	// may hold a few more: the cut is made one rule after another, so a publish of proxy
	// 1's in flight at the cut can reach that slave and not the master; never confirmed,
	// it stays there (see docs/guarantees.md, "Not guaranteed"). rabbit1's copy is a
	// slave again, synchronised from that slave's copy (in a sidecar cluster a sync copies
	// from a synchronised slave through the proxy beside it), and holds exactly what that
	// slave holds: counted on the brokers once publishing has stopped, nothing consumes,
	// and the trimmers settled. More would be its stale copy from before the cut, not
	// purged; less, a sync that ended short. Which messages they hold is checked after
	// the consume below.
	confirmedTotal := first.confirmedCount() + second.confirmedCount() + third.confirmedCount()
	unconfirmedAtCut := first.sentCount() - first.confirmedCount()
	var held map[string]int
	var row queueRow
	rejoined := poll(t.Context(), 60*time.Second, func() error {
		var err error
		if row, err = queueStatus(t, proxies[1], queue); err != nil {
			return err
		}
		copies := slices.Sorted(slices.Values(row.copies()))
		if row.Master != promoted.Master || !slices.Equal(copies, names) || !slices.Contains(row.SynchronisedSlaves, "rabbit1") || !slices.Equal(row.SynchronisedSlaves, row.Slaves) {
			return fmt.Errorf("proxy 2 lists %v; want master %s, rabbit1 a synchronised slave again", row, promoted.Master)
		}
		all, err := brokerMessages(t.Context(), queue)
		if err != nil {
			return err
		}
		held = all[queue]
		master := held[row.Master]
		stayed := slices.DeleteFunc(slices.Clone(row.SynchronisedSlaves), func(s string) bool { return s == "rabbit1" })
		for _, s := range row.SynchronisedSlaves {
			if held[s] < master || held[s] > master+unconfirmedAtCut || s == "rabbit1" && len(stayed) == 1 && held[s] != held[stayed[0]] {
				return fmt.Errorf("brokers hold %v (node: messages); want %v to hold at least what the master %s holds and at most %d more (proxy 1's publishes never confirmed), and rabbit1 what %v, the slave it was copied from, holds",
					held, row.SynchronisedSlaves, row.Master, unconfirmedAtCut, stayed)
			}
		}
		return nil
	})
	if rejoined != nil {
		// Which confirms came before rabbit1 was recorded synchronised, to tell a short
		// copy from publishes that skipped the new slave.
		for _, r := range cliParseRecords(proxies[0].stderr.String()) {
			if r.text("msg") == "slave synchronisation recorded" {
				at, _ := time.Parse(time.RFC3339Nano, r.text("time"))
				before := 0
				for _, p := range []*partitionPublisher{first, second, third} {
					before += p.confirmedCount() - p.confirmedSince(at)
				}
				t.Logf("rabbit1 recorded synchronised at %s; %d of the %d confirms came before", at.Format(time.StampMilli), before, confirmedTotal)
			}
		}
		t.Logf("published but never confirmed: %d through proxy 1 before it paused, %d through proxy 2, %d through proxy 1 after healing",
			unconfirmedAtCut, second.sentCount()-second.confirmedCount(), third.sentCount()-third.confirmedCount())
		t.Fatalf("after healing: %v", rejoined)
	}
	t.Logf("after healing the brokers hold %v (node: messages); %d confirmed", held, confirmedTotal)
	t.Logf("after healing, proxy 2 lists %s", proxies[1].ctl(t, "list_queues", "name", "master", "slaves", "synchronised_slaves", "messages").stdout)

	// Every confirmed body arrives, consumed through proxy 2.
	conn, err := network.dial(1)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch := openChannel(t, conn)
	declared, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	consumed := map[string]bool{}
	for _, d := range consumeAcked(t, conn, queue, declared.Messages) {
		consumed[string(d.Body)] = true
	}
	total, lost := 0, []string{}
	for _, p := range []*partitionPublisher{first, second, third} {
		for body := range p.confirmedBodies() {
			total++
			if !consumed[body] {
				lost = append(lost, body)
			}
		}
	}
	slices.Sort(lost)
	if len(lost) > 0 {
		t.Errorf("%d of %d confirmed messages lost, e.g. %v", len(lost), total, lost[:min(len(lost), 10)])
	}
	t.Logf("%d confirmed messages (%d through proxy 1 before the cut, %d through proxy 2, %d after healing); %d consumed, %d distinct",
		total, first.confirmedCount(), second.confirmedCount(), third.confirmedCount(), declared.Messages, len(consumed))

	// The slaves held the master's messages, not others of the same number: once every
	// message was consumed and acked through proxy 2, their trimmers have trimmed them
	// all, and what is left on a slave is what it held beyond the master (the few
	// never-confirmed publishes of proxy 1's). A slave that lacked some of the master's messages and held as many
	// others would keep more.
	want := map[string]int{}
	for _, s := range row.SynchronisedSlaves {
		want[s] = held[s] - held[row.Master]
	}
	if err := poll(t.Context(), 60*time.Second, func() error {
		all, err := brokerMessages(t.Context(), queue)
		if err != nil {
			return err
		}
		for s, n := range want {
			if got := all[queue][s]; got != n {
				return fmt.Errorf("after consuming everything, the slaves hold %v (node: messages), want %v (what each held beyond the master)", all[queue], want)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// declareMirrored declares the durable queue through proxy i (client-local: mastered on
// master, its node's broker) and waits until proxy 1 lists it with slaves, in that order,
// synchronised. The queue is deleted through proxy 2 when the test ends, which serves
// whatever the test did to proxy 1.
func (n *partitionNetwork) declareMirrored(t *testing.T, proxies []*cliProxy, i int, queue, master string, slaves ...string) {
	t.Helper()
	awaitCondition(t, 60*time.Second, func() error {
		if err := declareDurable(n.dial(i))(queue); err != nil {
			return err
		}
		row, err := queueStatus(t, proxies[0], queue)
		if err != nil {
			return err
		}
		if row.Master != master || !slices.Equal(row.SynchronisedSlaves, slaves) {
			return fmt.Errorf("proxy 1 lists %v; want master %s, slaves %v synchronised", row, master, slaves)
		}
		return nil
	})
	t.Cleanup(func() {
		if conn, err := n.dial(1); err == nil {
			deleteQueue(conn, queue)
			conn.Close()
		}
	})
}

// partitionNetwork is the namespaces of TestSidecarPartition and TestCampaignPartitions: a
// bridge namespace with the brokers' addresses (forwarding to the shared brokers) and one
// namespace per proxy, joined to the bridge by a veth pair. It reuses composeNetwork's
// namespaces, forwarders and cleanup.
type partitionNetwork struct {
	*composeNetwork
	bridge   string
	proxyNS  []string // per node, in node order
	proxyIP  []string
	brokerIP []string
	binary   cliBinary
	proxies  []*cliProxy
}

func newPartitionNetwork(t *testing.T) *partitionNetwork {
	t.Helper()
	n := &partitionNetwork{composeNetwork: &composeNetwork{
		prefix:      fmt.Sprintf("amqpp%d", os.Getpid()),
		brokerIPs:   map[string]string{},
		proxyIPs:    map[string]string{},
		connections: map[net.Conn]bool{},
	}}
	t.Cleanup(n.close)
	n.bridge = n.namespace(t, "b")
	n.ip(t, "-n", n.bridge, "link", "set", "lo", "up")
	n.ip(t, "-n", n.bridge, "link", "add", "br0", "type", "bridge")
	n.ip(t, "-n", n.bridge, "link", "set", "br0", "up")
	for i, node := range cluster.Nodes() {
		broker := fmt.Sprintf(partitionSubnet, 21+i)
		n.brokerIP = append(n.brokerIP, broker)
		n.ip(t, "-n", n.bridge, "addr", "add", broker+"/24", "dev", "br0")
		n.forward(t, n.bridge, net.JoinHostPort(broker, "5672"), node.URL())

		address := fmt.Sprintf(partitionSubnet, 11+i)
		n.proxyIP = append(n.proxyIP, address)
		ns := n.namespace(t, fmt.Sprintf("p%d", i+1))
		n.proxyNS = append(n.proxyNS, ns)
		peer := fmt.Sprintf("v%d", i+1)
		n.ip(t, "-n", ns, "link", "set", "lo", "up")
		n.ip(t, "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", n.bridge)
		n.ip(t, "-n", ns, "addr", "add", address+"/24", "dev", "eth0")
		n.ip(t, "-n", ns, "link", "set", "eth0", "up")
		n.ip(t, "-n", n.bridge, "link", "set", peer, "master", "br0")
		n.ip(t, "-n", n.bridge, "link", "set", peer, "up")
	}
	return n
}

// startProxies runs `amqp-mirror serve` in each proxy's namespace: listening on the
// namespace's loopback, gossip and raft on its veth address, every broker a backend
// through the bridge's addresses, an ha-mode all policy with automatic sync, and a
// failover_grace of 3 s. The returned proxies' ctl runs inside their namespaces too.
func (n *partitionNetwork) startProxies(t *testing.T) []*cliProxy {
	t.Helper()
	binary := newCLI(t)
	nodes := cluster.Nodes()
	for i, node := range nodes {
		// ctl and serve through a wrapper that enters the namespace: ip netns exec execs the
		// program, so the process started is the proxy itself.
		wrapper := filepath.Join(t.TempDir(), "amqp-mirror-in-"+n.proxyNS[i])
		writeExecutable(t, wrapper, fmt.Sprintf("#!/bin/sh\nexec ip netns exec %s %s \"$@\"\n", n.proxyNS[i], binary.path))
		var join []string
		for j := range nodes {
			if j != i {
				join = append(join, net.JoinHostPort(n.proxyIP[j], "7946"))
			}
		}
		var yaml strings.Builder
		fmt.Fprintf(&yaml, "node: %s\nlisten:\n  amqp: 127.0.0.1:5672\n  admin: 127.0.0.1:15672\nstate_dir: %s\nshutdown_timeout: 5s\nfailover_grace: 3s\nqueue_master_locator: client-local\nlog:\n  format: text\n",
			node.Name, filepath.Join(t.TempDir(), "state"))
		fmt.Fprintf(&yaml, "cluster:\n  bind: %s\n  raft_bind: %s\n  bootstrap_expect: %d\n  join: [%s]\nbackends:\n",
			net.JoinHostPort(n.proxyIP[i], "7946"), net.JoinHostPort(n.proxyIP[i], "7947"), len(nodes), strings.Join(join, ", "))
		for j, b := range nodes {
			u, err := url.Parse(b.URL())
			if err != nil {
				t.Fatal(err)
			}
			u.Host = net.JoinHostPort(n.brokerIP[j], "5672")
			fmt.Fprintf(&yaml, "  - name: %s\n    url: %q\n", b.Name, u.String())
		}
		yaml.WriteString(mirrorPolicyYAML("ha-all", "^partition_", map[string]any{"ha-mode": "all", "ha-sync-mode": "automatic"}))
		path := filepath.Join(t.TempDir(), "amqp-mirror.yaml")
		cliWriteFile(t, path, yaml.String())
		n.proxies = append(n.proxies, startServeProcess(t, cliBinary{path: wrapper}, path))
	}
	for i, p := range n.proxies {
		awaitCondition(t, 60*time.Second, func() error {
			if p.exited() {
				return fmt.Errorf("the proxy beside %s exited with %v:\n%s", nodes[i].Name, p.command.ProcessState, p.stderr)
			}
			amqpLine, ok := p.record(map[string]string{"msg": "AMQP listening"})
			if !ok {
				return fmt.Errorf("the proxy beside %s does not listen yet", nodes[i].Name)
			}
			p.amqpAddr = amqpLine.text("addr")
			if adminLine, ok := p.record(map[string]string{"msg": "admin API listening"}); ok {
				p.adminAddr = adminLine.text("addr")
			}
			if _, ok := p.record(map[string]string{"msg": "sidecar cluster: metadata log ready"}); !ok {
				return fmt.Errorf("the proxy beside %s knows no metadata leader", nodes[i].Name)
			}
			return nil
		})
		settings, err := config.Load(p.configPath, nil)
		if err != nil {
			t.Fatal(err)
		}
		if p.token, err = config.LoadAdminToken(settings); err != nil {
			t.Fatalf("admin token of the proxy beside %s: %v", nodes[i].Name, err)
		}
	}
	return n.proxies
}

// partition cuts node 1 (its proxy and the way to its broker) from nodes 2 and 3, or
// heals the cut: blackhole rules in each proxy's namespace for the other side's proxies
// and brokers, and in the bridge namespace for the other side's brokers answering.
func (n *partitionNetwork) partition(t *testing.T, cut bool) {
	t.Helper()
	minority, majority := []int{0}, []int{1, 2}
	for _, sides := range [][2][]int{{minority, majority}, {majority, minority}} {
		for _, i := range sides[0] {
			for _, j := range sides[1] {
				n.blockProxy(t, cut, i, j)
				n.blockBroker(t, cut, i, j)
			}
		}
	}
}

// isolateProxy cuts the proxy of node i from the other proxies (serf gossip and raft, both
// ways), or heals the cut; every proxy still reaches every broker.
func (n *partitionNetwork) isolateProxy(t *testing.T, cut bool, i int) {
	t.Helper()
	for j := range n.proxyNS {
		if j != i {
			n.blockProxy(t, cut, i, j)
			n.blockProxy(t, cut, j, i)
		}
	}
}

// blockProxy adds (cut) or deletes the rule in proxy i's namespace that drops what it
// sends to proxy j.
func (n *partitionNetwork) blockProxy(t *testing.T, cut bool, i, j int) {
	t.Helper()
	n.ip(t, "-n", n.proxyNS[i], "rule", ruleVerb(cut), "to", n.proxyIP[j], "blackhole")
}

// blockBroker adds (cut) or deletes the rules that cut proxy i from broker j both ways:
// in proxy i's namespace for what it sends, in the bridge namespace for the broker's
// answers. The other proxies still reach broker j.
func (n *partitionNetwork) blockBroker(t *testing.T, cut bool, i, j int) {
	t.Helper()
	n.ip(t, "-n", n.proxyNS[i], "rule", ruleVerb(cut), "to", n.brokerIP[j], "blackhole")
	n.ip(t, "-n", n.bridge, "rule", ruleVerb(cut), "from", n.brokerIP[j], "to", n.proxyIP[i], "blackhole")
}

// ruleVerb is ip rule's verb that makes a cut (add) or heals it (del).
func ruleVerb(cut bool) string {
	if cut {
		return "add"
	}
	return "del"
}

// dial connects a client to the proxy of node i (from 0), from inside its namespace.
func (n *partitionNetwork) dial(i int) (*amqp.Connection, error) {
	return amqp.DialConfig(n.proxies[i].url("guest", "guest"), amqp.Config{Dial: n.dialer(i)})
}

// dialer opens TCP connections from inside the namespace of node i's proxy.
func (n *partitionNetwork) dialer(i int) func(network, address string) (net.Conn, error) {
	return func(network, address string) (net.Conn, error) {
		var conn net.Conn
		err := inNetworkNamespace(n.proxyNS[i], func() (err error) {
			conn, err = net.DialTimeout(network, address, 5*time.Second)
			return err
		})
		return conn, err
	}
}

// promotionTime is when the first of the proxies logged a promotion.
func (n *partitionNetwork) promotionTime(proxies []*cliProxy) (time.Time, bool) {
	var first time.Time
	for _, p := range proxies {
		for _, r := range cliParseRecords(p.stderr.String()) {
			if r.text("msg") != "master lost; slave promoted" {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, r.text("time"))
			if err == nil && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
	}
	return first, !first.IsZero()
}

// partitionPublisher publishes "name i" to a queue through one proxy in confirm mode, at
// most 100 unconfirmed, on one connection, and records when each publish was confirmed
// and how the connection ended.
type partitionPublisher struct {
	name string
	done chan struct{}
	stop func()

	mu        sync.Mutex
	sentAt    map[string]time.Time // when each body was published
	confirmed map[string]time.Time // when each body's ack arrived
	closedAt  time.Time
	code      int
	err       error
}

func startPartitionPublisher(ctx context.Context, t *testing.T, network *partitionNetwork, proxy int, queue, name string) *partitionPublisher {
	t.Helper()
	conn, err := network.dial(proxy)
	if err != nil {
		t.Fatalf("connecting %s to proxy %d: %v", name, proxy+1, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &partitionPublisher{name: name, done: make(chan struct{}), sentAt: map[string]time.Time{}, confirmed: map[string]time.Time{}}
	p.stop = func() {
		cancel()
		<-p.done
	}
	t.Cleanup(p.stop)
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 100))
	go func() {
		defer close(p.done)
		sent := map[uint64]string{} // unconfirmed: delivery tag → body
		// receive settles one confirm; false once the channel has closed.
		receive := func(c amqp.Confirmation, ok bool) bool {
			if !ok {
				p.ended(closes)
				return false
			}
			p.mu.Lock()
			if c.Ack {
				p.confirmed[sent[c.DeliveryTag]] = time.Now()
			}
			p.mu.Unlock()
			delete(sent, c.DeliveryTag)
			return true
		}
		// drain waits (at most 30 s) for the confirms of what was published.
		drain := func() {
			timeout := time.After(30 * time.Second)
			for len(sent) > 0 {
				select {
				case c, ok := <-confirms:
					if !receive(c, ok) {
						return
					}
				case <-timeout:
					return
				}
			}
		}
		pace := time.NewTicker(2 * time.Millisecond)
		defer pace.Stop()
		for i := 0; ; {
			if len(sent) >= 100 {
				select {
				case c, ok := <-confirms:
					if !receive(c, ok) {
						return
					}
				case <-ctx.Done():
					drain()
					return
				}
				continue
			}
			select {
			case c, ok := <-confirms:
				if !receive(c, ok) {
					return
				}
				continue
			case <-ctx.Done():
				drain()
				return
			case <-pace.C:
			}
			body := fmt.Sprintf("%s %d", name, i)
			i++
			tag := ch.GetNextPublishSeqNo()
			sent[tag] = body
			p.mu.Lock()
			p.sentAt[body] = time.Now()
			p.mu.Unlock()
			if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte(body), DeliveryMode: amqp.Persistent}); err != nil {
				delete(sent, tag)
				drain()
				return
			}
		}
	}()
	return p
}

// ended records how the connection closed.
func (p *partitionPublisher) ended(closes <-chan *amqp.Error) {
	var reason *amqp.Error
	select {
	case reason = <-closes:
	case <-time.After(5 * time.Second):
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closedAt = time.Now()
	if reason != nil {
		p.code, p.err = reason.Code, reason
	}
}

func (p *partitionPublisher) wait() { <-p.done }

func (p *partitionPublisher) closed() (time.Time, int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closedAt, p.code, !p.closedAt.IsZero()
}

func (p *partitionPublisher) sentCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sentAt)
}

func (p *partitionPublisher) confirmedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.confirmed)
}

func (p *partitionPublisher) confirmedSince(since time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	count := 0
	for _, at := range p.confirmed {
		if at.After(since) {
			count++
		}
	}
	return count
}

// confirmedSentAfter is the confirmed bodies published after since, sorted.
func (p *partitionPublisher) confirmedSentAfter(since time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var late []string
	for body := range p.confirmed {
		if p.sentAt[body].After(since) {
			late = append(late, body)
		}
	}
	slices.Sort(late)
	return late
}

func (p *partitionPublisher) lastConfirm() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last time.Time
	for _, at := range p.confirmed {
		if at.After(last) {
			last = at
		}
	}
	return last
}

func (p *partitionPublisher) confirmedBodies() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	bodies := map[string]bool{}
	for body := range p.confirmed {
		bodies[body] = true
	}
	return bodies
}
