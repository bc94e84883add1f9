package main

// The sidecar cluster in serve: with cluster.bind set, the proxy joins the
// other proxies (mirror/cluster: serf membership, a raft voter of the
// metadata log) instead of keeping a single-voter log of its own, hands
// its engine the cluster's forwarding writes and settle delivery, and
// keeps its runtime policies in the metadata log (as a proxy alone does in
// its single-voter log).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
	"github.com/amqp-mirror/amqp-mirror/mirror/localbroker"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// sidecar reports whether cfg makes this proxy a member of a sidecar
// cluster.
func sidecar(cfg *config.Config) bool { return cfg.Cluster.Bind != "" }

// startCluster joins the sidecar cluster: the metadata log in
// state_dir/raft with a voter per node. It waits up to leaderWait for the
// log to have a leader; a proxy without one still starts (its mirrored
// queues cannot be declared or failed over until a majority is there).
func startCluster(ctx context.Context, cfg *config.Config, logger *slog.Logger, leaderWait time.Duration) (*cluster.Cluster, error) {
	raftBind, raftAdvertise := cfg.Cluster.RaftAddresses()
	c, err := cluster.Start(cluster.Config{
		NodeName:        cfg.Node,
		Bind:            cfg.Cluster.Bind,
		Advertise:       cfg.Cluster.Advertise,
		Join:            cfg.Cluster.Join,
		RaftBind:        raftBind,
		RaftAdvertise:   raftAdvertise,
		DataDir:         filepath.Join(cfg.StateDir, "raft"),
		BootstrapExpect: cfg.Cluster.BootstrapExpect,
		AMQP:            cfg.Listen.AMQP,
		Admin:           cfg.Listen.Admin,
		Backend:         cfg.Node,
		Logger:          logger,
	})
	if err != nil {
		return nil, fmt.Errorf("cluster.bind %s: %w", cfg.Cluster.Bind, err)
	}
	logger.Info("sidecar cluster: waiting for the metadata log's leader", "node", cfg.Node, "bind", cfg.Cluster.Bind, "raft", raftBind, "join", cfg.Cluster.Join, "bootstrap_expect", cfg.Cluster.BootstrapExpect)
	waitCtx, cancel := context.WithTimeout(ctx, leaderWait)
	defer cancel()
	if err := c.Store().WaitLeader(waitCtx); err != nil {
		if ctx.Err() != nil {
			c.Shutdown()
			return nil, err
		}
		logger.Warn("sidecar cluster: no metadata leader yet; serving, but mirrored queues cannot change until a majority of the proxies is up", "waited", leaderWait)
	} else {
		leader, _ := c.Leader()
		logger.Info("sidecar cluster: metadata log ready", "leader", leader.Name, "members", len(c.Members()))
	}
	return c, nil
}

// minorityCheck is how often a sidecar proxy counts the members it sees.
const minorityCheck = 250 * time.Millisecond

// pauseInMinority pauses srv while this proxy sees no more than half of its
// cluster's members alive (serf: a failed member still counts as a member),
// and resumes it when a majority is back, as RabbitMQ's pause_minority
// pauses a node. Two sides of a partition can then never both serve a
// mirrored queue: at most one side has a majority. A member serf declared
// failed whose raft port still completes a TCP handshake (answering) counts
// as alive here: it is starved, not gone or cut off. While paused, the
// engine records no backend loss (engine.SetPaused). It returns when ctx
// ends.
func pauseInMinority(ctx context.Context, c *cluster.Cluster, srv *proxy.Server, eng *engine.Engine, logger *slog.Logger) {
	ticker := time.NewTicker(minorityCheck)
	defer ticker.Stop()
	paused, spared := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		alive, total := 0, 0
		var failed []cluster.Member
		for _, m := range c.Members() {
			switch m.Status {
			case cluster.StatusAlive:
				alive++
				total++
			case cluster.StatusFailed:
				failed = append(failed, m)
				total++
			case cluster.StatusLeaving:
				total++
			}
		}
		if 2*alive <= total {
			// With a node down, one false verdict on a live peer (a host so
			// loaded that the peer missed serf's probes for a moment) would
			// otherwise pause this proxy and disconnect its clients.
			before := alive
			alive += answering(failed)
			if !spared && !paused && 2*before <= total && 2*alive > total {
				logger.Warn("sidecar cluster: serf declares proxies failed that still answer on their raft port; not pausing", "alive", before, "answering", alive-before, "members", total)
			}
			spared = 2*alive > total
		} else {
			spared = false
		}
		minority := total > 0 && 2*alive <= total
		switch {
		case minority && !paused:
			logger.Warn("sidecar cluster: this proxy sees a minority of the proxies; pausing (clients disconnected, new ones refused) until a majority is back", "alive", alive, "members", total)
			eng.SetPaused(true)
			srv.Pause()
			paused = true
		case !minority && paused:
			// Not before this proxy's copy of the log has caught up: while it
			// was cut off the majority may have promoted away from its node,
			// and serving from the metadata of before would route publishes
			// and consumers to a master since replaced.
			wait, cancel := context.WithTimeout(ctx, resumeCatchUp)
			err := c.Store().WaitLeader(wait)
			cancel()
			if err != nil {
				logger.Warn("sidecar cluster: a majority of the proxies is back, but this proxy's metadata log has not caught up with the leader; staying paused", "alive", alive, "members", total, "err", err)
				continue
			}
			logger.Info("sidecar cluster: a majority of the proxies is back and the metadata log caught up; serving again", "alive", alive, "members", total)
			srv.Resume()
			eng.SetPaused(false)
			paused = false
		}
	}
}

// resumeCatchUp bounds one wait for the metadata log to catch up before a
// paused proxy serves again; it tries again at the next check.
const resumeCatchUp = 5 * time.Second

// answerTimeout bounds answering's handshake with one member.
const answerTimeout = 200 * time.Millisecond

// answering counts the members whose raft port completes a TCP handshake
// within answerTimeout, all asked at once. The kernel answers for the
// proxy, so a proxy that is alive but starved of CPU answers, one that is
// gone refuses, and one cut off by a partition does not answer at all.
func answering(members []cluster.Member) int {
	answers := make(chan bool, len(members))
	for _, m := range members {
		go func() {
			conn, err := net.DialTimeout("tcp", m.Raft, answerTimeout)
			if err == nil {
				conn.Close()
			}
			answers <- err == nil
		}()
	}
	count := 0
	for range members {
		if <-answers {
			count++
		}
	}
	return count
}

// memberCheck is how often a sidecar proxy hands serf's verdicts on the
// other proxies to its engine: serf's own detection takes about a second
// (mirror/cluster's doc), this adds at most a tenth of that.
const memberCheck = 100 * time.Millisecond

// memberFailedFor is how long serf must hold a proxy failed before its
// node counts as failed. On an overloaded host serf declares live proxies
// failed now and then and they refute it within a few hundred
// milliseconds (seen: 0.1-0.3 s under a load of 40 on two cores); acting
// on those would move masters away from healthy nodes. A real failure
// stays, and is acted on about half a second after serf's verdict.
const memberFailedFor = 500 * time.Millisecond

// memberVerdicts is what watchMembers needs of the engine.
type memberVerdicts interface {
	MemberFailed(backend string)
	MemberAlive(backend string)
}

// watchMembers hands serf's verdicts on the other proxies to the engine
// until stop is called: a proxy serf holds failed for memberFailedFor
// means its node (proxy and broker) failed, so its backend counts as down
// on every survivor (engine.MemberFailed), and as the watcher sees it
// again once serf sees the proxy alive. A member that left gracefully or
// was forgotten leaves the verdict to the watcher.
func watchMembers(c *cluster.Cluster, verdicts memberVerdicts, self string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(memberCheck)
		defer ticker.Stop()
		failedSince := map[string]time.Time{} // serf holds them failed, since
		reported := map[string]bool{}         // told the engine they failed
		for {
			now := time.Now()
			failedNow := map[string]bool{}
			for _, m := range c.Members() {
				if m.Name != self && m.Backend != "" && m.Status == cluster.StatusFailed {
					failedNow[m.Backend] = true
					if _, ok := failedSince[m.Backend]; !ok {
						failedSince[m.Backend] = now
					}
				}
			}
			for backend := range failedSince {
				if !failedNow[backend] { // alive again, left, or forgotten
					delete(failedSince, backend)
				}
			}
			for backend, since := range failedSince {
				if !reported[backend] && now.Sub(since) >= memberFailedFor {
					verdicts.MemberFailed(backend)
					reported[backend] = true
				}
			}
			for backend := range reported {
				if _, failed := failedSince[backend]; !failed {
					verdicts.MemberAlive(backend)
					delete(reported, backend)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// clusterEngineOptions wires the engine to the cluster: writes forwarded
// to the leader, settles for other nodes' slaves delivered to them.
func clusterEngineOptions(opts *engine.Options, c *cluster.Cluster) {
	opts.Writer = c
	opts.Peers = c
}

// The engine's settles arrive through the cluster, and the cluster gives
// the engine those of other proxies.
var (
	_ engine.MetaWriter = (*cluster.Cluster)(nil)
	_ engine.Peers      = (*cluster.Cluster)(nil)
)

// policyWriter records a change of the runtime policies in the metadata
// log: the Store itself for a proxy alone, the cluster (which forwards it
// to the leader) in a sidecar cluster. Both return once this proxy has
// applied the change.
type policyWriter interface {
	ChangePolicies(ctx context.Context, change mirror.PolicyChange) (mirror.PolicyResult, error)
}

// policyLogTimeout bounds one runtime policy change (ctl set_policy and
// friends): a proxy that cannot reach a majority answers with an error
// within it instead of waiting for one.
const policyLogTimeout = 5 * time.Second

// policyLog keeps the runtime policies (set_policy, set_operator_policy
// and their clears) in the metadata log, so that every proxy of a cluster
// has the same ones, changed in the log's order, and a proxy alone keeps
// them across restarts in its single-voter log. It is the PolicyStore's
// PolicyLog; its goroutine hands the log's policies to the PolicyStore
// whenever the log changes. Policies of the config file stay each proxy's
// own.
type policyLog struct {
	writer   policyWriter
	store    *mirror.Store
	policies *config.PolicyStore
	log      *slog.Logger

	// importMu serialises the import with changes made through this
	// proxy, so that none of them can reach the log before it.
	importMu sync.Mutex
	// pending are state_dir's runtime policies while they are still to be
	// imported; nil once the log has runtime policies.
	pending *mirror.RuntimePolicies
}

var _ config.PolicyLog = (*policyLog)(nil)

// startPolicyLog moves the runtime policies of policies into the log
// (store, written through writer). When the log has never recorded any,
// those policies loaded from state_dir are imported once: at once when
// the log has a leader (always for a proxy alone), else in the background
// until it has, and in any case before a change made through this proxy.
// Whichever proxy's import or change reaches the log first wins; a later
// import is refused. stop ends the goroutine.
func startPolicyLog(writer policyWriter, store *mirror.Store, policies *config.PolicyStore, logger *slog.Logger) (stop func()) {
	l := &policyLog{writer: writer, store: store, policies: policies, log: logger.With("component", "runtime-policies")}
	if filePolicies, fileOperator := policies.Runtime(); len(filePolicies)+len(fileOperator) > 0 {
		l.pending = &mirror.RuntimePolicies{Policies: filePolicies, OperatorPolicies: fileOperator}
	}
	policies.UseLog(l)
	changes, unsubscribe := store.Changes()
	l.sync()
	first, cancelFirst := context.WithTimeout(context.Background(), time.Second)
	l.importPending(first)
	cancelFirst()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer unsubscribe()
		retry := time.NewTicker(time.Second)
		defer retry.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-changes:
				if !ok {
					return
				}
				l.sync()
			case <-retry.C:
				attempt, cancelAttempt := context.WithTimeout(ctx, policyLogTimeout)
				l.importPending(attempt)
				cancelAttempt()
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// importPending writes the runtime policies loaded from state_dir to the
// log if it has none yet, and then renames the file. An error leaves them
// pending.
func (l *policyLog) importPending(ctx context.Context) error {
	l.importMu.Lock()
	defer l.importMu.Unlock()
	if l.pending == nil {
		return nil
	}
	imported := false
	if l.store.Policies().Index == 0 {
		res, err := l.writer.ChangePolicies(ctx, mirror.PolicyChange{Op: mirror.PolicyImport, Import: l.pending})
		if err != nil {
			l.log.Debug("cannot import state_dir's runtime policies into the log yet; retrying", "err", err)
			return fmt.Errorf("importing state_dir's runtime policies into the log: %w", err)
		}
		imported = res.Changed
	}
	if imported {
		l.log.Info("runtime policies imported from state_dir into the metadata log", "policies", len(l.pending.Policies), "operator_policies", len(l.pending.OperatorPolicies))
	} else {
		l.log.Info("the metadata log already has runtime policies; state_dir's are not imported")
	}
	l.pending = nil
	l.sync()
	// Renamed, so that a restart cannot show the file's policies, stale
	// by then, while the log is read.
	if retired, err := l.policies.RetireFile(); err != nil {
		l.log.Warn("cannot rename the runtime policies file, which the log replaces", "err", err)
	} else if retired != "" {
		l.log.Info("runtime policies file renamed; the metadata log holds them now", "file", retired)
	}
	return nil
}

// sync hands the log's runtime policies to the PolicyStore. A log that has
// never recorded any leaves the store as it is (state_dir's until the
// import).
func (l *policyLog) sync() {
	rp := l.store.Policies()
	if rp.Index == 0 {
		return
	}
	if err := l.policies.SetRuntime(rp.Index, rp.Policies, rp.OperatorPolicies); err != nil {
		l.log.Warn("some runtime policies of the log cannot be applied here", "err", err)
	}
}

// policyRetry is how long a change waits before it tries again when the
// log had no leader.
const policyRetry = 100 * time.Millisecond

// changeRetrying records c, trying again while the log has no leader
// until ctx ends: an election (a leader lost, a loaded host) lasts about a
// second, and a ctl command during one should wait for it rather than
// fail. A proxy on a minority side fails when ctx ends. A change the log
// refused without committing is tried again; one that may have committed
// (ErrLeadershipLost is also ErrNotLeader) is one that a second attempt
// repeats harmlessly for a set, and for a clear finds the policy already
// gone (ErrPolicyNotFound, as for a clear made twice).
func (l *policyLog) changeRetrying(ctx context.Context, c mirror.PolicyChange) error {
	for {
		_, err := l.writer.ChangePolicies(ctx, c)
		if err == nil || !errors.Is(err, mirror.ErrNotLeader) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(policyRetry):
		}
	}
}

// importPendingRetrying imports state_dir's policies before a change
// made here, trying again while the log has no leader until ctx ends.
func (l *policyLog) importPendingRetrying(ctx context.Context) error {
	for {
		err := l.importPending(ctx)
		if err == nil || !errors.Is(err, mirror.ErrNotLeader) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(policyRetry):
		}
	}
}

// SetPolicy records a runtime policy in the log.
func (l *policyLog) SetPolicy(p config.Policy, operator bool) error {
	return l.change(mirror.PolicyChange{Op: mirror.PolicySet, Policy: &p, Operator: operator})
}

// ClearPolicy removes a runtime policy from the log.
func (l *policyLog) ClearPolicy(vhost, name string, operator bool) error {
	return l.change(mirror.PolicyChange{Op: mirror.PolicyClear, VHost: vhost, Name: name, Operator: operator})
}

func (l *policyLog) change(c mirror.PolicyChange) error {
	ctx, cancel := context.WithTimeout(context.Background(), policyLogTimeout)
	defer cancel()
	err := l.importPendingRetrying(ctx)
	if err == nil {
		err = l.changeRetrying(ctx, c)
	}
	if err != nil {
		switch {
		case errors.Is(err, mirror.ErrNotLeader):
			return fmt.Errorf("%w: runtime policies live in the proxies' replicated log, and this proxy cannot reach a majority of the proxies; nothing was changed (%v)", config.ErrNoMajority, err)
		case errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("%w: no answer from the proxies' replicated log within %v; the change may or may not be made, list the policies to see (%v)", config.ErrNoMajority, policyLogTimeout, err)
		}
		return err
	}
	// The writer returns once this proxy applied the change: the store
	// shows it before the ctl command returns.
	l.sync()
	return nil
}

// sidecarAddresses are the addresses of one demo proxy.
type sidecarAddresses struct{ AMQP, Admin, Gossip, Raft string }

// demoSidecarAddresses gives the demo's proxy beside node i (from 0) the ports of --listen
// and --admin plus i, and free loopback ports for gossip and raft.
func demoSidecarAddresses(nodes int, listen, admin string) ([]sidecarAddresses, error) {
	shift := func(address, flag string, i int) (string, error) {
		host, port, err := net.SplitHostPort(address)
		number, convErr := strconv.Atoi(port)
		if err != nil || convErr != nil || number < 1 || number+i > 65535 {
			return "", fmt.Errorf("%s %s: the sidecar demo needs %d ports from there on (one per node); set another with %s HOST:PORT", flag, address, nodes, flag)
		}
		return net.JoinHostPort(host, strconv.Itoa(number+i)), nil
	}
	out := make([]sidecarAddresses, nodes)
	for i := range out {
		var err error
		if out[i].AMQP, err = shift(listen, "--listen", i); err != nil {
			return nil, err
		}
		if out[i].Admin, err = shift(admin, "--admin", i); err != nil {
			return nil, err
		}
		for _, a := range []*string{&out[i].Gossip, &out[i].Raft} {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, fmt.Errorf("finding a free port for the cluster: %w", err)
			}
			*a = ln.Addr().String()
			defer ln.Close() // held until all are chosen, so no two are the same
		}
	}
	return out, nil
}

// demoSidecarChecks are the client-facing addresses of the demo's proxies, for
// checkDemoAddresses.
func demoSidecarChecks(proxies []sidecarAddresses) []demoAddress {
	var out []demoAddress
	for i, p := range proxies {
		out = append(out,
			demoAddress{fmt.Sprintf("the AMQP address of node %d's proxy (--listen's port + %d)", i+1, i), p.AMQP, "--listen"},
			demoAddress{fmt.Sprintf("the admin address of node %d's proxy (--admin's port + %d)", i+1, i), p.Admin, "--admin"})
	}
	return out
}

// demoChild is one `amqp-mirror serve` the demo runs.
type demoChild struct {
	name, configPath, logPath string
	cmd                       *exec.Cmd
	done                      chan struct{}
}

// demoSidecars runs the sidecar topology: an `amqp-mirror serve` process beside each
// broker (so that one node, broker and proxy, can be stopped on its own), prints the
// seed's walkthrough, and stops the proxies when ctx ends.
func demoSidecars(ctx context.Context, brokers *localbroker.Cluster, proxies []sidecarAddresses, dir string, logger *slog.Logger, stdout io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to run the proxies: %w", err)
	}
	nodes := brokers.Nodes()
	var children []*demoChild
	defer func() {
		for _, c := range children {
			c.stop(logger)
		}
	}()
	for i, n := range nodes {
		var join []string
		for j, p := range proxies {
			if j != i {
				join = append(join, p.Gossip)
			}
		}
		home := filepath.Join(dir, "proxy"+strconv.Itoa(i+1))
		if err := os.MkdirAll(home, 0o755); err != nil {
			return err
		}
		var yaml strings.Builder
		fmt.Fprintf(&yaml, "node: %s\nlisten:\n  amqp: %s\n  admin: %s\nstate_dir: %s\nqueue_master_locator: client-local\nshutdown_timeout: 5s\n",
			n.Name, proxies[i].AMQP, proxies[i].Admin, filepath.Join(home, "state"))
		fmt.Fprintf(&yaml, "cluster:\n  bind: %s\n  raft_bind: %s\n  bootstrap_expect: %d\n  join: [%s]\nbackends:\n",
			proxies[i].Gossip, proxies[i].Raft, len(nodes), strings.Join(join, ", "))
		for _, b := range nodes {
			fmt.Fprintf(&yaml, "  - name: %s\n    url: %s\n", b.Name, b.URL())
		}
		c := &demoChild{name: n.Name, configPath: filepath.Join(home, "amqp-mirror.yaml"), logPath: filepath.Join(home, "serve.log"), done: make(chan struct{})}
		if err := os.WriteFile(c.configPath, []byte(yaml.String()), 0o644); err != nil {
			return err
		}
		if _, err := config.Load(c.configPath, nil); err != nil {
			return err
		}
		if err := c.start(self); err != nil {
			return err
		}
		children = append(children, c)
	}
	for i, c := range children {
		if err := c.awaitListening(ctx, proxies[i].AMQP, 90*time.Second); err != nil {
			return err
		}
	}

	fmt.Fprintf(stdout, "\namqp-mirror is running: %d nodes, each a RabbitMQ broker with an amqp-mirror beside it,\njoined in a sidecar cluster.\n\n", len(nodes))
	for i, c := range children {
		fmt.Fprintf(stdout, "  node %d: broker %s=127.0.0.1:%d (pid %d)\n          proxy:     amqp://guest:guest@%s   (pid %d)\n          config:    %s\n          log:       %s\n",
			i+1, nodes[i].Name, nodes[i].Port, nodes[i].PID(), proxies[i].AMQP, c.cmd.Process.Pid, c.configPath, c.logPath)
	}
	ctl := func(i int) string { return fmt.Sprintf("%s ctl --config %s", self, children[i].configPath) }
	url := func(i int) string { return "amqp://guest:guest@" + proxies[i].AMQP }
	fmt.Fprintf(stdout, "\nThe seed's walkthrough (amqp-tools):\n")
	for i := range min(3, len(nodes)) {
		fmt.Fprintf(stdout, "  amqp-declare-queue --url %s -d -q queue_%d      # mastered on %s (client-local)\n", url(i), i+1, nodes[i].Name)
	}
	fmt.Fprintf(stdout, "  %s set_policy ha-all \"^queue_\" '{\"ha-mode\":\"all\"}'\n", ctl(0))
	fmt.Fprintf(stdout, "  %s list_queues name master slaves\n", ctl(0))
	if len(nodes) >= 3 {
		fmt.Fprintf(stdout, "  for i in $(seq 10); do amqp-publish --url %s -r queue_2 -p -b \"message $i\"; done\n", url(0))
		fmt.Fprintf(stdout, "  kill %d %d      # stops node 2: its proxy, then its broker\n", children[1].cmd.Process.Pid, nodes[1].PID())
		fmt.Fprintf(stdout, "  %s list_queues name master slaves messages   # queue_2 on %s now\n", ctl(0), nodes[2].Name)
		fmt.Fprintf(stdout, "  amqp-get --url %s -q queue_2\n", url(2))
	}
	fmt.Fprintf(stdout, "\nPress Ctrl-C to stop.\n")
	<-ctx.Done()
	return nil
}

// start runs `self serve --config` with its output in the log file. The child gets SIGTERM
// if the demo dies (Pdeathsig); that signal follows the thread that started the child, so
// the goroutine keeps its thread locked until the child has exited.
func (c *demoChild) start(self string) error {
	logFile, err := os.Create(c.logPath)
	if err != nil {
		return err
	}
	c.cmd = exec.Command(self, "serve", "--config", c.configPath)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := c.cmd.Start()
		started <- err
		if err == nil {
			c.cmd.Wait()
		}
		logFile.Close()
		close(c.done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("starting the proxy beside %s: %w", c.name, err)
	}
	return nil
}

// awaitListening waits until the proxy accepts AMQP connections at addr.
func (c *demoChild) awaitListening(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("the proxy beside %s exited (%v); its log: %s", c.name, c.cmd.ProcessState, c.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the proxy beside %s does not listen on %s after %v; its log: %s", c.name, addr, timeout, c.logPath)
		}
	}
}

// stop ends the proxy gracefully, or kills it after 15 s.
func (c *demoChild) stop(logger *slog.Logger) {
	select {
	case <-c.done:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		logger.Warn("a proxy did not stop within 15s; killing it", "node", c.name)
		c.cmd.Process.Kill()
		<-c.done
	}
}
