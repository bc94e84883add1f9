package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// The fault campaign: the workload of campaign_workload_test.go through one
// mirrored proxy over the three nodes, while a nemesis injects faults one
// after another in a seeded random order, each healed and the queues
// synchronised again before the next. The checker then reads what every
// client saw, and the copies of every queue are counted on the brokers
// themselves. The default tier injects each kind of fault once; the long
// tier (make chaos) injects campaignLongFaults, mixed.

// campaignFaultsVariable overrides the number of faults: every kind once
// when it is smaller than the number of kinds.
const campaignFaultsVariable = "AMQP_MIRROR_CAMPAIGN_FAULTS"

// campaignSeedVariable replays a campaign's order of faults.
const campaignSeedVariable = "AMQP_MIRROR_CAMPAIGN_SEED"

const campaignLongFaults = 105

// campaignGrace is failover_grace: long enough that a broker restarting
// beside the others on a loaded machine is not taken for a frozen one,
// short enough that a frozen master is promoted away within the fault.
const campaignGrace = 5 * time.Second

// campaign is what the nemeses act on.
type campaign struct {
	t      *testing.T
	proxy  *chaosProxy
	queues []campaignQueue
	rnd    *rand.Rand
}

// nemesis injects one kind of fault, heals it, and says what it did.
type nemesis struct {
	name   string
	inject func(c *campaign) string
}

var nemeses = []nemesis{
	{"kill -9 a master's broker", (*campaign).killMaster},
	{"kill -9 a slave's broker", (*campaign).killSlave},
	{"SIGSTOP a broker, shorter than failover_grace", (*campaign).freezeShort},
	{"SIGSTOP a master's broker, longer than failover_grace", (*campaign).freezeMaster},
	{"restart a broker with its data wiped", (*campaign).wipe},
	{"disk alarm on a broker", (*campaign).diskAlarm},
	{"memory alarm on a broker", (*campaign).memoryAlarm},
}

// TestCampaign: no fault of the nemesis makes a client lose a confirmed
// message, see a message again without redelivered or after its ack
// settled, see a message nobody published, or see one publisher's
// messages out of order on a single-consumer queue; no client sees an
// error; and afterwards every copy of every queue holds the same.
func TestCampaign(t *testing.T) {
	restoreClusterOnCleanup(t)
	seed, rnd := campaignRandom(t)
	faults := campaignFaults(t, len(nemeses), campaignLongFaults)
	t.Logf("campaign: %d faults, seed %d (%s=%d replays the order)", faults, seed, campaignSeedVariable, seed)

	p := startChaosProxy(t, node(t, "rabbit1"), chaosOptions{definition: haAllAutomatic, grace: campaignGrace})
	base := queueName(t)
	dead := base + ".dead"
	queues := []campaignQueue{
		{name: base + ".main", publishers: 2, consumers: []string{"consume", "cancel"}},
		{name: base + ".ordered", publishers: 1, consumers: []string{"consume"}, ordered: true},
		{name: base + ".get", publishers: 1, consumers: []string{"get"}},
		{name: base + ".priority", args: amqp.Table{"x-max-priority": int32(4)}, publishers: 1, consumers: []string{"consume"}, priorities: true},
		{name: base + ".ttl", publishers: 1, consumers: []string{"consume"}, rejectEvery: 7, deadLetterTo: dead,
			args: amqp.Table{"x-message-ttl": int32(10 * 60 * 1000), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}},
		{name: dead, consumers: []string{"consume"}},
	}
	declareCampaignQueues(t, p, queues)
	c := &campaign{t: t, proxy: p, queues: queues, rnd: rnd}

	w := newCampaignWorkload(t, p.url, queues)
	w.start()
	if err := w.waitProgress(100, 60*time.Second); err != nil {
		t.Fatalf("before the first fault: %v", err)
	}

	injected := map[string]int{}
	for i, n := range mixed(rnd, nemeses, faults) {
		from := time.Now()
		what := n.inject(c)
		c.awaitWhole()
		if err := w.waitProgress(20, 90*time.Second); err != nil {
			t.Fatalf("after fault %d (%s: %s): %v", i+1, n.name, what, err)
		}
		w.fault(from, time.Now())
		injected[n.name]++
		t.Logf("fault %d/%d: %s: %s; whole again after %v", i+1, faults, n.name, what, time.Since(from).Round(time.Millisecond))
	}

	v := w.finish(60 * time.Second)
	copiesDiffer, leaked := c.copiesDiffer()
	if len(leaked) > 0 {
		t.Logf("dead-letter targets whose slaves hold more than their master (a leak, not a loss: docs/guarantees.md): %s", strings.Join(leaked, "; "))
	}
	report := campaignReport(injected, v, copiesDiffer, leaked)
	t.Log("\n" + report)
	if path := os.Getenv("AMQP_MIRROR_CAMPAIGN_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Errorf("write the report: %v", err)
		}
	}
	for _, finding := range []struct {
		what string
		list []string
	}{
		{"confirmed and never delivered where owed", v.lost},
		{"delivered again without redelivered", v.unflagged},
		{"delivered again after its ack settled", v.ackedThenRedelivered},
		{"delivered before an earlier publish of the same publisher", v.outOfOrder},
		{"never published", v.unexpected},
		{"a client saw", v.problems},
		{"copies differ", copiesDiffer},
	} {
		if len(finding.list) > 0 {
			t.Errorf("%d %s: %s", len(finding.list), finding.what, abbreviate(finding.list))
		}
	}
}

// declareCampaignQueues declares queues through the proxy and waits until
// each has three synchronised copies written to disk on every node.
func declareCampaignQueues(t *testing.T, p *chaosProxy, queues []campaignQueue) {
	t.Helper()
	ch, err := dialURL(t, p.url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, q.args); err != nil {
			t.Fatalf("declare %s: %v", q.name, err)
		}
		t.Cleanup(func() {
			if _, err := ch.QueueDelete(q.name, false, false, false); err != nil {
				t.Logf("delete %s: %v", q.name, err)
			}
		})
	}
	for _, q := range queues {
		p.waitSynchronised(t, q.name, 3)
	}
	for _, n := range cluster.Nodes() {
		if err := n.FlushMetadata(testContext(t, 20*time.Second)); err != nil {
			t.Fatalf("flush %s: %v", n.Name, err)
		}
	}
}

// campaignFaults is how many faults a campaign injects: campaignFaultsVariable
// when it is set, else short in the default tier and long in the long tier.
func campaignFaults(t *testing.T, short, long int) int {
	t.Helper()
	faults := bySize(short, long)
	if s := os.Getenv(campaignFaultsVariable); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a number of faults", campaignFaultsVariable, s)
		}
		faults = n
	}
	return faults
}

// campaignRandom is a campaign's source of random choices, seeded from
// campaignSeedVariable when it is set, else from the clock; the seed is
// returned for the log, so that a run's order of faults can be replayed.
func campaignRandom(t *testing.T) (uint64, *rand.Rand) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(campaignSeedVariable); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", campaignSeedVariable, s, err)
		}
	}
	return seed, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// mixed is every kind once, in random order, then random kinds up to
// count.
func mixed[T any](rnd *rand.Rand, kinds []T, count int) []T {
	order := slices.Clone(kinds)
	rnd.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for len(order) < count {
		order = append(order, kinds[rnd.IntN(len(kinds))])
	}
	return order
}

// awaitWhole waits until every node runs and every queue has a master
// and two synchronised slaves again.
func (c *campaign) awaitWhole() {
	c.t.Helper()
	for _, q := range c.queues {
		c.proxy.waitSynchronised(c.t, q.name, 3)
	}
}

func (c *campaign) pickQueue() campaignQueue { return c.queues[c.rnd.IntN(len(c.queues))] }

func (c *campaign) pickNode() *localbroker.Node {
	nodes := cluster.Nodes()
	return nodes[c.rnd.IntN(len(nodes))]
}

func (c *campaign) restart(n *localbroker.Node) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n.Restart(ctx); err != nil {
		c.t.Fatalf("restart %s: %v", n.Name, err)
	}
}

func (c *campaign) killMaster() string {
	q := c.pickQueue()
	victim := node(c.t, c.proxy.meta(c.t, q.name).Master)
	killNode(c.t, victim)
	moved := c.proxy.waitMasterMoved(c.t, q.name, victim.Name)
	c.restart(victim)
	return fmt.Sprintf("%s, master of %s, killed; %s promoted", victim.Name, q.name, moved.Master)
}

func (c *campaign) killSlave() string {
	q := c.pickQueue()
	slaves := c.proxy.meta(c.t, q.name).Slaves
	victim := node(c.t, slaves[c.rnd.IntN(len(slaves))].Backend)
	killNode(c.t, victim)
	c.awaitSlaveDropped(q.name, victim.Name)
	c.restart(victim)
	return fmt.Sprintf("%s, a slave of %s, killed", victim.Name, q.name)
}

// awaitSlaveDropped waits until the metadata no longer counts backend
// among queue's synchronised slaves.
func (c *campaign) awaitSlaveDropped(queue, backend string) {
	c.t.Helper()
	testutil.Eventually(c.t, 30*time.Second, func() error {
		for _, s := range c.proxy.meta(c.t, queue).Slaves {
			if s.Backend == backend && s.Synchronised {
				return fmt.Errorf("%s is still a synchronised slave of %s", backend, queue)
			}
		}
		return nil
	})
}

func (c *campaign) freezeShort() string {
	victim := c.pickNode()
	pause := (campaignGrace / 3).Round(time.Millisecond)
	signalNode(c.t, victim, syscall.SIGSTOP)
	time.Sleep(pause)
	signalNode(c.t, victim, syscall.SIGCONT)
	return fmt.Sprintf("%s frozen for %v", victim.Name, pause)
}

func (c *campaign) freezeMaster() string {
	q := c.pickQueue()
	victim := node(c.t, c.proxy.meta(c.t, q.name).Master)
	frozenAt := time.Now()
	signalNode(c.t, victim, syscall.SIGSTOP)
	moved := c.proxy.waitMasterMoved(c.t, q.name, victim.Name)
	time.Sleep(time.Second) // the woken broker finds its queues promoted away
	signalNode(c.t, victim, syscall.SIGCONT)
	return fmt.Sprintf("%s, master of %s, frozen for %v; %s promoted", victim.Name, q.name, time.Since(frozenAt).Round(time.Millisecond), moved.Master)
}

func (c *campaign) wipe() string {
	victim := c.pickNode()
	if err := victim.Wipe(); err != nil {
		c.t.Fatal(err)
	}
	c.restart(victim)
	return fmt.Sprintf("%s killed, its data deleted, started empty", victim.Name)
}

// alarm runs set, holds the alarm for a few seconds while clients go on,
// then runs clear.
func (c *campaign) alarm(victim *localbroker.Node, set, clear []string) {
	c.t.Helper()
	ctx := testContext(c.t, time.Minute)
	if _, err := victim.Ctl(ctx, set...); err != nil {
		c.t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if _, err := victim.Ctl(ctx, clear...); err != nil {
		c.t.Fatal(err)
	}
}

func (c *campaign) diskAlarm() string {
	victim := c.pickNode()
	c.alarm(victim, []string{"set_disk_free_limit", "1000000GB"}, []string{"set_disk_free_limit", "1MB"})
	return fmt.Sprintf("%s in a disk alarm for 3s", victim.Name)
}

func (c *campaign) memoryAlarm() string {
	victim := c.pickNode()
	c.alarm(victim, []string{"set_vm_memory_high_watermark", "absolute", "1MB"}, []string{"set_vm_memory_high_watermark", "0.4"})
	return fmt.Sprintf("%s in a memory alarm for 3s", victim.Name)
}

// copiesDiffer counts every queue on every node directly, until the
// copies of each hold the same number of messages (the slaves' trimmers
// settle a moment after the master), and lists those that still differ
// after a minute. A dead-letter target whose slaves hold more than its
// master is listed apart, in leaked: a message its slaves keep and its
// master no longer holds comes back, redelivered, only after a promotion
// (a leak, not a loss), which the campaign has seen after faults on the
// dead-lettering path and which docs/guarantees.md states.
func (c *campaign) copiesDiffer() (differ, leaked []string) {
	deadline := time.Now().Add(time.Minute)
	for {
		differ = differ[:0]
		counts := map[string]map[string]int{}
		for _, n := range cluster.Nodes() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			queues, err := n.Queues(ctx, "/")
			cancel()
			if err != nil {
				differ = append(differ, err.Error())
				continue
			}
			for _, q := range c.queues {
				if counts[q.name] == nil {
					counts[q.name] = map[string]int{}
				}
				if qc, ok := queues[q.name]; ok {
					counts[q.name][n.Name] = qc.Messages
				} else {
					counts[q.name][n.Name] = -1
				}
			}
		}
		leaked = leaked[:0]
		for _, q := range c.queues {
			var values []int
			for _, v := range counts[q.name] {
				values = append(values, v)
			}
			if slices.Min(values) == slices.Max(values) && slices.Min(values) >= 0 {
				continue
			}
			row := fmt.Sprintf("%s %v (master %s)", q.name, counts[q.name], c.proxy.meta(c.t, q.name).Master)
			if c.deadLetterTarget(q.name) && c.slavesHoldMore(q.name, counts[q.name]) {
				leaked = append(leaked, row)
				continue
			}
			differ = append(differ, row)
		}
		if len(differ)+len(leaked) == 0 || time.Now().After(deadline) {
			return differ, leaked
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// deadLetterTarget reports whether some queue of the workload dead-letters
// to queue.
func (c *campaign) deadLetterTarget(queue string) bool {
	return slices.ContainsFunc(c.queues, func(q campaignQueue) bool { return q.deadLetterTo == queue })
}

// slavesHoldMore reports whether every slave of queue holds at least what
// its master holds, and one more.
func (c *campaign) slavesHoldMore(queue string, counts map[string]int) bool {
	master := c.proxy.meta(c.t, queue).Master
	more := false
	for backend, n := range counts {
		switch {
		case backend == master:
		case n < counts[master]:
			return false
		case n > counts[master]:
			more = true
		}
	}
	return more
}

// writeFaultTable writes the faults injected by kind, in the order of names, and
// their sum, as a table followed by an empty line.
func writeFaultTable(b *strings.Builder, names []string, injected map[string]int) {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fault\tinjected")
	total := 0
	for _, name := range names {
		fmt.Fprintf(tw, "%s\t%d\n", name, injected[name])
		total += injected[name]
	}
	fmt.Fprintf(tw, "all\t%d\n", total)
	tw.Flush()
	b.WriteString("\n")
}

// campaignReport is the campaign's table.
func campaignReport(injected map[string]int, v campaignVerdict, copiesDiffer, leaked []string) string {
	var b strings.Builder
	names := make([]string, len(nemeses))
	for i, n := range nemeses {
		names[i] = n.name
	}
	writeFaultTable(&b, names, injected)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, row := range []struct {
		name  string
		value any
	}{
		{"published", v.published},
		{"confirmed", v.confirmed},
		{"nacked", v.nacked},
		{"delivered", v.delivered},
		{"lost (confirmed, never delivered where owed)", len(v.lost)},
		{"unexpected (never published)", len(v.unexpected)},
		{"repeated without redelivered", len(v.unflagged)},
		{"delivered again after its ack settled", len(v.ackedThenRedelivered)},
		{"out of publish order (single consumer)", len(v.outOfOrder)},
		{"client errors (the clients never reconnect)", len(v.problems)},
		{"queues whose copies differ at the end", len(copiesDiffer)},
		{"dead-letter targets whose slaves hold more (a leak)", len(leaked)},
		{"longest pause between deliveries", v.longestGap.Round(time.Millisecond)},
		{"consumes again after x-cancel-on-ha-failover", v.reconsumes},
	} {
		fmt.Fprintf(tw, "%s\t%v\n", row.name, row.value)
	}
	tw.Flush()
	return b.String()
}
