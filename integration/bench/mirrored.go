package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	harness "github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// The mirrored scenario's targets, the rows of its table in the order each round runs them.
const (
	// targetDirect is one plain node, the first of the three amqp-mirror fronts.
	targetDirect = "direct"
	// targetMirror is `amqp-mirror serve` in front of three plain nodes, ha-mode all.
	targetMirror = "amqp-mirror"
	// targetMirrorBaseline is targetMirror with another build (-amqp-mirror-baseline-bin):
	// an older commit's, so that a change is measured against it in one run, on the same
	// nodes, alternating. It is not in the default rows.
	targetMirrorBaseline = "amqp-mirror-baseline"
	// targetNativeHA is RabbitMQ's own classic mirroring on a three-node cluster.
	targetNativeHA = "native-ha"
	// targetQuorum is quorum queues on the same cluster.
	targetQuorum = "quorum"
)

var mirroredTargets = []string{targetDirect, targetMirror, targetNativeHA, targetQuorum}

// mirroredRows are the rows the table can have, in its order.
var mirroredRows = []string{targetDirect, targetMirror, targetMirrorBaseline, targetNativeHA, targetQuorum}

// mirroredNodes is how many nodes each side has: the plain nodes amqp-mirror fronts, and
// the RabbitMQ cluster.
const mirroredNodes = 3

// copiesTimeout bounds the wait for every copy of a run's queues before its load starts.
const copiesTimeout = 15 * time.Second

// haPolicy is the ha-mode all policy, the same on amqp-mirror and on the native cluster.
var haPolicy = map[string]string{"ha-mode": "all", "ha-sync-mode": "automatic"}

// mirroredBench is what the mirrored scenario runs on: three plain nodes, a three-node
// RabbitMQ cluster and an amqp-mirror binary, all started or built for the run.
type mirroredBench struct {
	cfg    config
	dir    string // the binary, configs and proxy state
	binary string // amqp-mirror
	plain  *harness.Cluster
	native *harness.Cluster
	// servers counts amqp-mirror processes, for their directories.
	servers int
	// withAdmin gives the next servers an admin API (the failover scenario asks it where
	// a queue's master is with amqp-mirror ctl); serverConfigPath is the last one's config.
	withAdmin        bool
	serverConfigPath string
	// plainOnly starts the plain nodes alone, without the RabbitMQ cluster.
	plainOnly bool
}

// declareResult is the rate of one kind of queue.declare on one target.
type declareResult struct {
	Kind    string  `json:"kind"`
	Target  string  `json:"target"`
	Round   int     `json:"round"`
	Calls   int     `json:"calls"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"calls_per_second"`
}

// The declare kinds: an RPC client's reply queue (declared and deleted per call), and a
// client that declares the queue it already uses before each use.
const (
	declareServerNamed = "server-named exclusive auto-delete queue, declare + delete"
	declareNamed       = "named durable queue that exists, declare"
)

// runMirrored runs the mirrored scenario: the full load on each of its targets, round
// after round and a last direct run, then the queue.declare rates. It stops every node
// and process it started before it returns, however it returns.
func runMirrored(ctx context.Context, cfg config, logger *slog.Logger) (runs []runResult, declares []declareResult, err error) {
	m := &mirroredBench{cfg: cfg}
	defer m.shutdown()
	if err := m.open(ctx, logger, "mirrored"); err != nil {
		return nil, nil, err
	}
	if runs, err = m.runLoads(ctx); err != nil {
		return runs, nil, err
	}
	declares, err = m.runDeclares(ctx)
	return runs, declares, err
}

// runLoads runs the full load on each of -mirrored-targets, round after round, and a last
// direct run.
func (m *mirroredBench) runLoads(ctx context.Context) ([]runResult, error) {
	var runs []runResult
	plan := make([]string, 0, m.cfg.rounds*len(m.cfg.mirroredTargets)+1)
	for range m.cfg.rounds {
		plan = append(plan, m.cfg.mirroredTargets...)
	}
	plan = append(plan, targetDirect)
	runsOf := map[string]int{}
	for i, target := range plan {
		runsOf[target]++
		progress("mirrored load, run %d of %d: %s", i+1, len(plan), target)
		result, err := m.runTarget(ctx, target)
		result.Scenario, result.Target, result.Run = "mirrored", target, runsOf[target]
		if err != nil {
			return runs, fmt.Errorf("mirrored load, %s run %d: %w", target, runsOf[target], err)
		}
		runs = append(runs, result)
		progress("  %s; %d copies", result.oneLine(), result.Copies)
	}
	return runs, nil
}

// start builds amqp-mirror and starts the nodes and the cluster, all at once: the build
// and the Erlang VMs' boots overlap.
func (m *mirroredBench) start(ctx context.Context, logger *slog.Logger) error {
	var group sync.WaitGroup
	var buildErr, plainErr, nativeErr error
	var extraConfig string
	if v := m.cfg.classicQueueVersion; v != 0 {
		extraConfig = fmt.Sprintf("classic_queue.default_version = %d\n", v)
	}
	group.Go(func() { buildErr = m.build(ctx) })
	group.Go(func() {
		progress("mirrored: starting %d plain RabbitMQ nodes", mirroredNodes)
		m.plain, plainErr = harness.Start(ctx, harness.Options{Names: nodeNames("plain"), Logger: logger, ExtraConfig: extraConfig})
	})
	group.Go(func() {
		if m.plainOnly {
			return
		}
		progress("mirrored: starting a %d-node RabbitMQ cluster", mirroredNodes)
		m.native, nativeErr = harness.Start(ctx, harness.Options{Names: nodeNames("native"), Logger: logger, ExtraConfig: extraConfig})
		if nativeErr != nil {
			return
		}
		if nativeErr = m.native.JoinRabbitMQCluster(ctx); nativeErr != nil {
			return
		}
		definition, _ := json.Marshal(haPolicy)
		_, nativeErr = m.native.Nodes()[0].Ctl(ctx, "set_policy", "bench-ha-all", "^"+queuePrefix(targetNativeHA),
			string(definition), "--apply-to", "queues")
	})
	group.Wait()
	if plainErr != nil {
		plainErr = fmt.Errorf("start the plain nodes: %w", plainErr)
	}
	if nativeErr != nil {
		nativeErr = fmt.Errorf("start the RabbitMQ cluster: %w", nativeErr)
	}
	return errors.Join(buildErr, plainErr, nativeErr)
}

func nodeNames(prefix string) []string {
	names := make([]string, mirroredNodes)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", prefix, i+1)
	}
	return names
}

// close stops both sets of nodes. Close kills: teardown needs no graceful stop.
func (m *mirroredBench) close() {
	for _, c := range []*harness.Cluster{m.plain, m.native} {
		if c == nil {
			continue
		}
		if err := c.Close(); err != nil {
			progress("stopping RabbitMQ: %v", err)
		}
	}
}

// open makes the bench's temporary directory and starts its nodes (and builds
// amqp-mirror); shutdown undoes it, whatever open got to. scenario names the progress
// line.
func (m *mirroredBench) open(ctx context.Context, logger *slog.Logger, scenario string) error {
	began := time.Now()
	dir, err := os.MkdirTemp("", "amqp-mirror-bench-")
	if err != nil {
		return err
	}
	m.dir = dir
	if err := m.start(ctx, logger); err != nil {
		return err
	}
	progress("%s: nodes ready in %s", scenario, time.Since(began).Round(100*time.Millisecond))
	return nil
}

// shutdown stops the nodes and removes the temporary directory.
func (m *mirroredBench) shutdown() {
	m.close()
	if m.dir != "" {
		os.RemoveAll(m.dir)
	}
}

// build builds amqp-mirror from the module the bench belongs to, or takes -amqp-mirror-bin.
func (m *mirroredBench) build(ctx context.Context) error {
	if m.cfg.mirrorBin != "" {
		m.binary = m.cfg.mirrorBin
		return nil
	}
	m.binary = filepath.Join(m.dir, "amqp-mirror")
	progress("mirrored: building amqp-mirror")
	build := exec.CommandContext(ctx, "go", "build", "-o", m.binary, "github.com/amqp-mirror/amqp-mirror")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build amqp-mirror (or give -amqp-mirror-bin): %w\n%s", err, out)
	}
	return nil
}

// queuePrefix names a target's queues, so that the native cluster's ha policy matches
// the native-ha target's queues and not the quorum target's.
func queuePrefix(target string) string { return "bench-mirrored-" + target }

func pids(c *harness.Cluster) []int {
	var out []int
	for _, n := range c.Nodes() {
		out = append(out, n.PID())
	}
	return out
}

// runTarget runs the full load once on target. The copies a row reports are counted
// by its prepare step, after the declares and before the load.
func (m *mirroredBench) runTarget(ctx context.Context, target string) (runResult, error) {
	cfg := m.cfg
	spec := loadSpec{
		scenario: "mirrored", publishers: cfg.publishers, consumers: cfg.consumers,
		window: cfg.confirmWindow, rate: cfg.mirroredRate / float64(cfg.publishers), prefetch: cfg.prefetch, multiAck: cfg.multiAck,
		size: cfg.size, persistent: true, warmup: cfg.warmup, duration: cfg.duration,
		queuePrefix: queuePrefix(target),
	}
	plain1, native1 := m.plain.Nodes()[0], m.native.Nodes()[0]
	var copies int
	switch target {
	case targetDirect:
		result, err := runSpec(ctx, spec, plain1.URL(), watched{brokers: []int{plain1.PID()}})
		result.Copies = 1
		return result, err
	case targetMirror, targetMirrorBaseline:
		binary := m.binary
		if target == targetMirrorBaseline {
			binary = cfg.mirrorBaselineBin
		}
		// Queues an earlier run left on a node (a delete that did not reach every copy)
		// would be work for the brokers that the row does not ask for.
		if err := m.warnLeftovers(ctx); err != nil {
			return runResult{}, err
		}
		server, err := m.startServerOf(ctx, binary)
		if err != nil {
			return runResult{}, err
		}
		profiler, err := startPerf(cfg.mirrorPerf, target, m.servers, server.pid())
		if err != nil {
			server.stop()
			return runResult{}, err
		}
		// The copies of every queue are counted on the nodes themselves, not asked of the
		// proxy: a proxy that does not mirror shows as 1 copy.
		spec.prepare = func(ctx context.Context, queues []string) error {
			var err error
			copies, err = m.awaitPlainCopies(ctx, queues)
			return err
		}
		spec.settle = m.awaitTrimmed
		result, err := runSpec(ctx, spec, proxyURL(plain1.URL(), server.addr), watched{brokers: pids(m.plain), proxy: server.pid()})
		profiler.stop()
		if stopErr := server.stop(); err == nil {
			err = stopErr
		}
		result.Copies = copies
		return result, err
	case targetNativeHA:
		spec.prepare = func(ctx context.Context, queues []string) error {
			copies, err := awaitNativeCopies(ctx, native1, queues, "synchronised_slave_pids", 1)
			if err != nil {
				return err
			}
			if copies < mirroredNodes {
				return fmt.Errorf("the native cluster's queues have %d synchronised copies after %v, want %d", copies, copiesTimeout, mirroredNodes)
			}
			return nil
		}
		result, err := runSpec(ctx, spec, native1.URL(), watched{brokers: pids(m.native)})
		result.Copies = mirroredNodes
		return result, err
	case targetQuorum:
		spec.queueArgs = amqp.Table{"x-queue-type": "quorum"}
		spec.prepare = func(ctx context.Context, queues []string) error {
			var err error
			copies, err = awaitNativeCopies(ctx, native1, queues, "online", 0)
			return err
		}
		result, err := runSpec(ctx, spec, native1.URL(), watched{brokers: pids(m.native)})
		result.Copies = copies
		return result, err
	}
	return runResult{}, fmt.Errorf("unknown mirrored target %q", target)
}

// trimTimeout bounds the wait for the slaves' trimmers after a run.
const trimTimeout = time.Minute

// awaitTrimmed waits until every plain node's copy of each queue holds as many messages
// as the others: the slaves' trimmers have caught up with the acks of the run's
// consumers. Past trimTimeout it says how far they are behind and returns: the whole
// run's CPU then leaves that trimming out, which the settle time shows.
func (m *mirroredBench) awaitTrimmed(ctx context.Context, queues []string) error {
	deadline := time.Now().Add(trimTimeout)
	for {
		excess, err := m.untrimmed(ctx, queues)
		if err == nil && excess == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			progress("  the slaves still hold %d messages more than their masters after %v (%v)", excess, trimTimeout, err)
			return nil
		}
		if !sleepUntil(ctx, time.Now().Add(time.Second)) {
			return ctx.Err()
		}
	}
}

// untrimmed is how many messages the fullest copy of each queue holds beyond the
// emptiest, summed over the queues.
func (m *mirroredBench) untrimmed(ctx context.Context, queues []string) (int, error) {
	fewest, most := map[string]int{}, map[string]int{}
	for i, node := range m.plain.Nodes() {
		held, err := node.Queues(ctx, "/")
		if err != nil {
			return 0, err
		}
		for _, q := range queues {
			n := held[q].Messages
			if i == 0 || n < fewest[q] {
				fewest[q] = n
			}
			most[q] = max(most[q], n)
		}
	}
	excess := 0
	for _, q := range queues {
		excess += most[q] - fewest[q]
	}
	return excess, nil
}

// awaitPlainCopies waits until every plain node holds each of the queues, or
// copiesTimeout passed, and returns how many nodes hold all of them. Fewer than all is not
// an error: the row then says how many copies it measured.
func (m *mirroredBench) awaitPlainCopies(ctx context.Context, queues []string) (int, error) {
	deadline := time.Now().Add(copiesTimeout)
	for {
		copies := 0
		for _, node := range m.plain.Nodes() {
			held, err := holdsQueues(node.URL(), queues)
			if err != nil {
				return 0, err
			}
			if held {
				copies++
			}
		}
		if copies == mirroredNodes || time.Now().After(deadline) {
			if copies < mirroredNodes {
				progress("  WARNING: amqp-mirror put the queues on %d of %d nodes: the row measures %d copies", copies, mirroredNodes, copies)
			}
			return copies, nil
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return 0, ctx.Err()
		}
	}
}

// warnLeftovers reports the queues the plain nodes hold before a run, with their messages.
func (m *mirroredBench) warnLeftovers(ctx context.Context) error {
	for _, node := range m.plain.Nodes() {
		out, err := node.Ctl(ctx, "list_queues", "name", "messages", "--formatter", "json")
		if err != nil {
			return err
		}
		var rows []struct {
			Name     string `json:"name"`
			Messages int    `json:"messages"`
		}
		if err := json.Unmarshal(out, &rows); err != nil {
			return fmt.Errorf("rabbitmqctl list_queues on %s: %w: %s", node.Name, err, out)
		}
		for _, row := range rows {
			progress("  WARNING: %s still holds queue %s (%d messages) from an earlier run", node.Name, row.Name, row.Messages)
		}
	}
	return nil
}

// holdsQueues reports whether the broker at url has every one of the queues, asking it
// with passive declares.
func holdsQueues(url string, queues []string) (bool, error) {
	conn, err := dial(url, "bench copies check", nil)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	for _, q := range queues {
		// A passive declare of a missing queue closes the channel: one channel per queue.
		ch, err := conn.Channel()
		if err != nil {
			return false, err
		}
		_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if amqpErr, ok := errors.AsType[*amqp.Error](err); ok && amqpErr.Code == amqp.NotFound {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("passive declare of %s: %w", q, err)
		}
		ch.Close()
	}
	return true, nil
}

// awaitNativeCopies waits until each queue on the native cluster has all its copies by
// nativeCopies, or copiesTimeout passed, and returns the fewest copies of any queue.
func awaitNativeCopies(ctx context.Context, node *harness.Node, queues []string, item string, extra int) (int, error) {
	deadline := time.Now().Add(copiesTimeout)
	for {
		fewest, err := nativeCopies(ctx, node, queues, item, extra)
		if err != nil {
			return 0, err
		}
		if fewest >= mirroredNodes || time.Now().After(deadline) {
			return fewest, nil
		}
		if !sleepUntil(ctx, time.Now().Add(500*time.Millisecond)) {
			return 0, ctx.Err()
		}
	}
}

// nativeCopies returns the fewest copies of any of the queues on the native cluster by
// rabbitmqctl list_queues' item (synchronised_slave_pids, or online for quorum members):
// the item's count plus extra (the master, which synchronised_slave_pids leaves out).
func nativeCopies(ctx context.Context, node *harness.Node, queues []string, item string, extra int) (int, error) {
	out, err := node.Ctl(ctx, "list_queues", "name", item, "--formatter", "json")
	if err != nil {
		return 0, err
	}
	var rows []map[string]any
	if err := json.Unmarshal(out, &rows); err != nil {
		return 0, fmt.Errorf("rabbitmqctl list_queues %s: %w: %s", item, err, out)
	}
	fewest := -1
	for _, q := range queues {
		n := 0
		for _, row := range rows {
			if row["name"] == q {
				list, _ := row[item].([]any)
				n = len(list) + extra
			}
		}
		if fewest < 0 || n < fewest {
			fewest = n
		}
	}
	return fewest, nil
}

// serverWrapper runs `amqp-mirror serve` ($@) and ties its life to the bench, as
// localbroker's wrapper does for the nodes: its stdin is the bench's lifeline pipe, and when
// that closes (stop, or the bench died however it died) the server gets SIGTERM, its
// graceful shutdown. The wrapper exits with the server's status.
const serverWrapper = `
exec 3<&0 </dev/null
"$@" 3<&- &
server=$!
( read -r _ <&3; kill -TERM "$server" 2>/dev/null ) &
watcher=$!
exec 3<&-
trap 'kill -TERM "$server" 2>/dev/null' TERM INT
while :; do
	wait "$server"
	status=$?
	kill -0 "$server" 2>/dev/null || break
done
kill -KILL "$watcher" 2>/dev/null
exit "$status"
`

// plainMirror is amqp-mirror serve, with its admin API, in front of three plain nodes:
// the setup of the scenarios that look at amqp-mirror alone (scale, connections,
// backlog).
type plainMirror struct {
	m      *mirroredBench
	server *proxyProcess
	pid    int    // amqp-mirror serve's own process, under the server's wrapper
	url    string // the client URL through the proxy
}

// startPlainMirror starts the nodes and the server; close stops them. On an error it
// stops what it started.
func startPlainMirror(ctx context.Context, cfg config, logger *slog.Logger, scenario string) (_ *plainMirror, err error) {
	p := &plainMirror{m: &mirroredBench{cfg: cfg, withAdmin: true, plainOnly: true}}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if err := p.m.open(ctx, logger, scenario); err != nil {
		return nil, err
	}
	if p.server, err = p.m.startServer(ctx); err != nil {
		return nil, err
	}
	if p.pid, err = serverProcess(p.server.pid(), p.m.binary); err != nil {
		return nil, err
	}
	p.url = proxyURL(p.m.plain.Nodes()[0].URL(), p.server.addr)
	return p, nil
}

// close stops the server and the nodes and removes their files.
func (p *plainMirror) close() {
	if p.server != nil {
		p.server.stop()
	}
	p.m.shutdown()
}

// startServer starts `amqp-mirror serve` in front of the plain nodes with the ha-all
// policy, as a deployment would, and waits until it accepts connections. Each server has
// its own state directory: every run starts from the same state.
func (m *mirroredBench) startServer(ctx context.Context) (*proxyProcess, error) {
	return m.startServerOf(ctx, m.binary)
}

// startServerOf is startServer with another amqp-mirror binary.
func (m *mirroredBench) startServerOf(ctx context.Context, binary string) (*proxyProcess, error) {
	m.servers++
	dir := filepath.Join(m.dir, fmt.Sprintf("server%d", m.servers))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	addrs, err := freeAddresses(2)
	if err != nil {
		return nil, err
	}
	addr := addrs[0]
	path := filepath.Join(dir, "amqp-mirror.yaml")
	config := serverConfig(addr, filepath.Join(dir, "state"), m.cfg.proxyLogLevel, m.plain.Nodes())
	if m.withAdmin {
		config = strings.Replace(config, `admin: ""`, "admin: "+addrs[1], 1)
	}
	m.serverConfigPath = path
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("sh", "-c", serverWrapper, "amqp-mirror-bench-wrapper", binary, "serve", "--config", path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// Its own process group, so that a stop that times out can kill the server with
	// its wrapper, and Ctrl-C reaches the bench alone, which stops the server itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if m.cfg.proxyGOMAXPROCS > 0 {
		cmd.Env = append(os.Environ(), fmt.Sprintf("GOMAXPROCS=%d", m.cfg.proxyGOMAXPROCS))
	}
	lifeline, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start amqp-mirror serve: %w", err)
	}
	p := &proxyProcess{cmd: cmd, addr: addr, lifeline: lifeline, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	if err := awaitAccept(ctx, p, 20*time.Second); err != nil {
		p.stop()
		return nil, fmt.Errorf("amqp-mirror serve --config %s: %w", path, err)
	}
	return p, nil
}

// serverConfig is the amqp-mirror config of a bench server: the three plain nodes as
// backends, every bench queue ha-mode all with automatic sync but the sync scenario's,
// synchronised on demand only, no admin API and no gossip (nothing that could collide
// with another program's ports).
func serverConfig(addr, stateDir, level string, nodes []*harness.Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node: %s\nlisten:\n  amqp: %s\n  admin: \"\"\n", nodes[0].Name, addr)
	fmt.Fprintf(&b, "state_dir: %s\nlog: {level: %s, format: text}\nshutdown_timeout: 5s\nbackends:\n", strconv.Quote(stateDir), level)
	for _, node := range nodes {
		fmt.Fprintf(&b, "  - name: %s\n    url: %s\n", node.Name, node.URL())
	}
	b.WriteString("policies:\n")
	writePolicy(&b, "bench-ha-all", "^bench-", 0, haPolicy)
	// Both patterns match the sync scenario's queues: the higher priority wins.
	writePolicy(&b, "bench-sync-manual", "^"+syncQueuePrefix, 1, syncPolicy)
	return b.String()
}

// writePolicy writes one policy of a config's policies list, its keys sorted.
func writePolicy(b *strings.Builder, name, pattern string, priority int, definition map[string]string) {
	fmt.Fprintf(b, "  - name: %s\n    pattern: %s\n    apply-to: queues\n    priority: %d\n    definition:\n", name, strconv.Quote(pattern), priority)
	keys := make([]string, 0, len(definition))
	for k := range definition {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(b, "      %s: %s\n", k, definition[k])
	}
}

// freeAddresses are n distinct loopback addresses with ports nothing
// listens on right now. Each listener stays open until all n are picked: a
// port freed at once can come back from the next pick.
func freeAddresses(n int) ([]string, error) {
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs, nil
}

// awaitAccept waits until p accepts TCP connections on its address.
func awaitAccept(ctx context.Context, p *proxyProcess, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited before accepting connections: %v", p.waitErr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("does not accept on %s after %v: %w", p.addr, timeout, err)
		}
	}
}

// runDeclares measures queue.declare directly at the first plain node and through one
// amqp-mirror process in front of all three, each kind for -declare-duration, once per
// round.
func (m *mirroredBench) runDeclares(ctx context.Context) ([]declareResult, error) {
	server, err := m.startServer(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := server.stop(); err != nil {
			progress("  %v", err)
		}
	}()
	direct := m.plain.Nodes()[0].URL()
	urls := map[string]string{targetDirect: direct, targetMirror: proxyURL(direct, server.addr)}
	var results []declareResult
	// Alternating, -rounds times, as the loads do: the table takes the medians.
	for round := range m.cfg.rounds {
		for _, kind := range []string{declareServerNamed, declareNamed} {
			for _, target := range []string{targetDirect, targetMirror} {
				progress("queue.declare, round %d of %d, %s: %s", round+1, m.cfg.rounds, target, kind)
				r, err := measureDeclares(ctx, urls[target], kind, m.cfg.declareDuration)
				r.Target, r.Round = target, round+1
				if err != nil {
					return results, fmt.Errorf("queue.declare via %s (%s): %w", target, kind, err)
				}
				results = append(results, r)
				progress("  %.0f calls/s", r.Rate)
			}
		}
	}
	return results, nil
}

// measureDeclares makes one kind of declare call on one channel, one call after the
// other as an RPC client does, for d.
func measureDeclares(ctx context.Context, url, kind string, d time.Duration) (declareResult, error) {
	result := declareResult{Kind: kind}
	conn, err := dial(url, "bench declares", nil)
	if err != nil {
		return result, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return result, err
	}
	named := fmt.Sprintf("%s-declare-%s", queuePrefix(targetMirror), strconv.FormatInt(time.Now().UnixNano(), 36))
	if kind == declareNamed {
		if _, err := ch.QueueDeclare(named, true, false, false, false, nil); err != nil {
			return result, err
		}
	}
	began := time.Now()
	for time.Since(began) < d && ctx.Err() == nil {
		switch kind {
		case declareServerNamed:
			q, err := ch.QueueDeclare("", false, true, true, false, nil)
			if err != nil {
				return result, err
			}
			if _, err := ch.QueueDelete(q.Name, false, false, false); err != nil {
				return result, err
			}
		case declareNamed:
			if _, err := ch.QueueDeclare(named, true, false, false, false, nil); err != nil {
				return result, err
			}
		}
		result.Calls++
	}
	result.Seconds = time.Since(began).Seconds()
	result.Rate = float64(result.Calls) / result.Seconds
	if kind == declareNamed {
		if _, err := ch.QueueDelete(named, false, false, false); err != nil {
			return result, err
		}
	}
	return result, ctx.Err()
}
