// Command amqp-mirror is an AMQP 0-9-1 proxy that brings RabbitMQ's classic
// mirrored queues to plain, unclustered brokers: in front of several
// brokers it mirrors queues by their ha-* policies and fails over when a
// broker dies; in front of one it is a transparent proxy.
//
//	amqp-mirror serve --config amqp-mirror.example.yaml   run the proxy
//	amqp-mirror ctl list_policies --config amqp-mirror.example.yaml
//	amqp-mirror demo                                      local brokers + proxy
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
	"github.com/amqp-mirror/amqp-mirror/mirror/localbroker"
	"github.com/amqp-mirror/amqp-mirror/proxy"
	"github.com/amqp-mirror/amqp-mirror/proxy/admin"
)

const usage = `amqp-mirror: an AMQP 0-9-1 proxy meant to add RabbitMQ-style classic mirrored
queues to plain, unclustered brokers.

In front of several brokers it mirrors queues by their ha-* policies (a master
and slaves per queue, publishes fanned out, confirms from the master and the
synchronised slaves, acks trimmed from the slaves, sync) and fails over when
a broker dies (the oldest synchronised slave is promoted and consumers move to
it without the client noticing). In front of one broker it is a transparent
proxy. With cluster.bind set, a proxy beside each broker joins the others in
a sidecar cluster (serf membership, a shared raft metadata log).

Usage:
  amqp-mirror serve [--config FILE] [flags]    run the proxy
  amqp-mirror ctl COMMAND [--config FILE] ...  administer a running proxy (like rabbitmqctl)
  amqp-mirror demo [flags]                     start local RabbitMQ nodes and the proxy
  amqp-mirror help [COMMAND]                   show help

Start from amqp-mirror.example.yaml, which explains every key.
Run "amqp-mirror COMMAND --help" for the flags of a command.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return runServe(args[1:], stdout, stderr)
	case "ctl":
		return runCtl(args[1:], stdout, stderr)
	case "demo":
		return runDemo(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		if len(args) > 1 {
			return run([]string{args[1], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "amqp-mirror: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

// newFlagSet returns a flag set whose --help prints the command's usage.
func newFlagSet(name, summary string, stdout io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "%s\n\nFlags:\n%s", summary, fs.FlagUsages())
	}
	return fs
}

// parseFlags parses args and reports an exit code when the command should
// not go on (help was asked for, or the flags were wrong).
func parseFlags(fs *pflag.FlagSet, args []string, stderr io.Writer) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0, false
		}
		fmt.Fprintf(stderr, "amqp-mirror %s: %v\n", fs.Name(), err)
		return 2, false
	}
	return 0, true
}

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("serve", `Usage: amqp-mirror serve [--config FILE] [flags]

Runs the proxy: clients connect to listen.amqp (and listen.amqps with TLS).
Each client connection reaches its home backend (the node backend when it is
up, else the first one listed that is up) and, with several backends, the
others as its queues need them, with the client's own credentials. Queues
are mirrored by their policies (ctl list_policies --explain);
queue_master_locator places new masters. failover_grace is how long the
proxy's own probe of each backend waits for an answer before it counts the
backend down and its queues fail over (a reset or refused connection counts
at once). With cluster.bind set (and node), the proxy joins the sidecar
cluster: it gossips with the proxies of cluster.join and votes in their
shared metadata log.

Every config key can also be set by a flag named after its key path, or by an
environment variable AMQP_MIRROR_<KEY> (dots as underscores); flags win over
the environment, which wins over the file. amqp-mirror.example.yaml explains
every key.

Signals: SIGTERM and SIGINT shut down gracefully (clients get connection.close
320, up to shutdown_timeout). SIGHUP, or saving the file, reloads the whole
file: policies, operator policies and log.level apply live; a change to any
other key is logged as "restart required" and needs a restart. An invalid
file is refused and the running configuration stays.`, stdout)
	configPath := fs.String("config", "", "the YAML config file (amqp-mirror.example.yaml explains every key)")
	config.RegisterFlags(fs)
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	cfg, err := config.Load(*configPath, fs)
	if err != nil {
		fmt.Fprintf(stderr, "amqp-mirror serve: %v\n", err)
		return 1
	}
	level := new(slog.LevelVar)
	level.Set(cfg.Log.SlogLevel())
	logger := newLogger(cfg.Log, level, stderr)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, cfg, fs, level, logger, nil); err != nil {
		logger.Error("amqp-mirror stopped", "err", err)
		return 1
	}
	return 0
}

func newLogger(l config.Log, level *slog.LevelVar, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the proxy until ctx ends, then shuts down gracefully. ready,
// when set, receives the AMQP listener's address once it accepts.
func serve(ctx context.Context, cfg *config.Config, flags *pflag.FlagSet, level *slog.LevelVar, logger *slog.Logger, ready func(amqpAddr string)) error {
	store, err := config.OpenPolicyStore(cfg.StateDir, cfg.Policies, cfg.OperatorPolicies)
	if err != nil {
		return err
	}
	backend, err := proxyBackend(cfg)
	if err != nil {
		return err
	}
	backendWatcher := controllink.NewWatcher(watchedBackends(cfg), controllink.WatcherOptions{Grace: cfg.FailoverGrace, Logger: logger})
	defer backendWatcher.Close()
	// Closed in reverse order after the proxy's shutdown: the engine (its
	// trimmers and syncs), then the metadata store, then the watcher whose
	// connections the engine used.
	mirroring, err := startMirroring(ctx, cfg, store, backendWatcher, logger)
	if err != nil {
		return err
	}
	defer mirroring.close()
	srv, err := proxy.New(proxy.Options{
		Backend:          backend,
		Others:           mirroring.others,
		Mirror:           mirroring.mirror(),
		ClientNode:       cfg.Node,
		Logger:           logger,
		HandshakeTimeout: cfg.HandshakeTimeout,
		DialTimeout:      5 * time.Second,
		Heartbeat:        cfg.Heartbeat,
		FrameMax:         uint32(cfg.FrameMax),
		ChannelMax:       uint16(cfg.ChannelMax),
		CloseTimeout:     5 * time.Second,
	})
	if err != nil {
		return err
	}
	mirroring.countUnacked(srv.Unacked)
	mirroring.listUnrecorded(srv.UnrecordedQueues)

	var listeners []net.Listener
	closeListeners := func() {
		for _, ln := range listeners {
			ln.Close()
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen.AMQP)
	if err != nil {
		return fmt.Errorf("listen.amqp: %w", err)
	}
	listeners = append(listeners, ln)
	if cfg.Listen.TLS.Cert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.Listen.TLS.Cert, cfg.Listen.TLS.Key)
		if err != nil {
			closeListeners()
			return fmt.Errorf("listen.tls: %w", err)
		}
		tlsLn, err := tls.Listen("tcp", cfg.Listen.AMQPS, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		if err != nil {
			closeListeners()
			return fmt.Errorf("listen.amqps: %w", err)
		}
		listeners = append(listeners, tlsLn)
	}

	serveCtx, cancelServe := context.WithCancel(context.Background())
	defer cancelServe()
	if mirroring.cluster != nil {
		// pause_minority: a proxy cut off from most of its cluster stops
		// serving until it sees a majority again (main_cluster.go).
		pauseDone := make(chan struct{})
		go func() {
			defer close(pauseDone)
			cluster.PauseInMinority(serveCtx, mirroring.cluster, pausing{srv, mirroring.engine}, logger)
		}()
		defer func() { cancelServe(); <-pauseDone }()
	}
	go func() {
		if mirroring.engine != nil {
			return // the engine takes the watcher's events
		}
		// With one backend nothing acts on backend events: the watcher
		// logs them and its state feeds /metrics. Taking them keeps it
		// probing.
		for {
			select {
			case <-backendWatcher.Events():
			case <-serveCtx.Done():
				return
			}
		}
	}()
	errs := make(chan error, len(listeners)+1)
	running := 0
	if cfg.Listen.Admin != "" {
		token, err := config.EnsureAdminToken(cfg)
		if err != nil {
			closeListeners()
			return err
		}
		adminLn, err := net.Listen("tcp", cfg.Listen.Admin)
		if err != nil {
			closeListeners()
			return fmt.Errorf("listen.admin: %w", err)
		}
		var adminOpts []admin.Option
		if mirroring.engine != nil {
			adminOpts = append(adminOpts, admin.WithQueues(mirroring.engine))
		}
		adminSrv := admin.NewServer(store, token, logger, adminOpts...)
		srv.RegisterMetrics(adminSrv.Registry())
		registerBackendMetrics(adminSrv.Registry(), cfg, backendWatcher)
		running++
		go func() { errs <- adminSrv.Serve(serveCtx, adminLn) }()
		logger.Info("admin API listening", "addr", adminLn.Addr().String())
	}

	watcher := config.NewWatcher(cfg, flags, store, logger, level)
	if cfg.Path != "" {
		if err := watcher.Start(serveCtx); err != nil {
			logger.Warn("not watching the config file for changes", "err", err)
		}
	}
	defer watcher.Close()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	for _, l := range listeners {
		running++
		go func(l net.Listener) { errs <- srv.Serve(l) }(l)
		logger.Info("AMQP listening", "addr", l.Addr().String(), "backend", backend.Name, "backend_addr", backend.Addr)
	}
	if ready != nil {
		ready(ln.Addr().String())
	}

	var failure error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-hup:
			logger.Info("SIGHUP: reloading the config file", "path", cfg.Path)
			_ = watcher.Reload() // it logs its outcome, a refusal included
		case err := <-errs:
			running--
			if err != nil && !errors.Is(err, proxy.ErrServerClosed) {
				failure = err
				break loop
			}
		}
	}

	logger.Info("shutting down", "timeout", cfg.ShutdownTimeout, "connections", srv.Stats().ConnectionsOpen.Load())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Warn("shutdown timed out; remaining connections closed", "err", err)
	}
	cancelServe()
	for ; running > 0; running-- {
		<-errs
	}
	logger.Info("stopped")
	return failure
}

// The replication engine is the proxy's Mirror.
var _ proxy.Mirror = (*engine.Engine)(nil)

// mirroring is what serve runs for several backends: the metadata store
// and the engine. With one backend both are nil and the proxy passes
// frames through.
type mirroring struct {
	store  *mirror.Store
	engine *engine.Engine
	others []proxy.Backend // the backends other than the home one
	// cluster is the sidecar cluster (main_cluster.go), nil for a proxy
	// alone; it owns store then.
	cluster *cluster.Cluster
	// policyLog keeps the runtime policies in the metadata log.
	policyLog *cluster.PolicyLog
	// stopMembers ends handing serf's verdicts to the engine.
	stopMembers func()
}

// startMirroring opens the metadata store in state_dir/raft (a single
// voter: the sidecar cluster adds voters to the same log) and starts the
// engine, when more than one backend is configured.
func startMirroring(ctx context.Context, cfg *config.Config, policies *config.PolicyStore, w *controllink.Watcher, logger *slog.Logger) (*mirroring, error) {
	m := &mirroring{}
	if len(cfg.Backends) < 2 {
		return m, nil
	}
	home, err := proxyBackend(cfg)
	if err != nil {
		return nil, err
	}
	for _, b := range cfg.Backends {
		if b.Name == home.Name {
			continue
		}
		pb, err := backendAddress(b)
		if err != nil {
			return nil, err
		}
		m.others = append(m.others, pb)
	}
	nodeID := cfg.Node
	if nodeID == "" {
		nodeID = "proxy"
	}
	if sidecar(cfg) {
		// A voter of the cluster's log in state_dir/raft (main_cluster.go).
		if m.cluster, err = startCluster(ctx, cfg, logger, 30*time.Second); err != nil {
			return nil, err
		}
		m.store = m.cluster.Store()
	} else {
		m.store, err = mirror.OpenStore(mirror.StoreConfig{Dir: filepath.Join(cfg.StateDir, "raft"), NodeID: nodeID, Logger: logger})
		if err != nil {
			return nil, err
		}
		waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := m.store.WaitLeader(waitCtx); err != nil {
			m.store.Close()
			return nil, err
		}
	}
	opts := engine.Options{
		Backends: watchedBackends(cfg),
		Node:     cfg.Node,
		Locator:  cfg.QueueMasterLocator,
		Store:    m.store,
		Policies: policies,
		Watcher:  w,
		Logger:   logger,
	}
	if m.cluster != nil {
		clusterEngineOptions(&opts, m.cluster)
	}
	// Runtime policies live in the metadata log (main_cluster.go), taken
	// before the engine acts on any.
	var writer cluster.PolicyWriter = m.store
	if m.cluster != nil {
		writer = m.cluster
	}
	m.policyLog = cluster.StartPolicyLog(writer, m.store, policies, logger)
	m.engine = engine.New(opts)
	// The first placements should see which backends are up: wait a moment
	// for the watcher's first verdicts (a backend down is not an error).
	startCtx, cancelStart := context.WithTimeout(ctx, 10*time.Second)
	defer cancelStart()
	if err := m.engine.Start(startCtx); err != nil {
		m.close()
		return nil, err
	}
	if m.cluster != nil {
		m.cluster.HandleSettles(m.engine.SettleLocal)
		m.cluster.HandleRejects(m.engine.RejectLocal)
		m.cluster.HandlePurges(m.engine.PurgeLocal)
		m.cluster.HandleSyncs(m.engine.SyncLocal)
		m.cluster.HandleWaitApplied(m.engine.WaitApplied)
		m.stopMembers = cluster.WatchMembers(m.cluster, m.engine, cfg.Node)
	}
	return m, nil
}

// countUnacked lets list_queues, here and asked by other proxies, count
// the messages this proxy's clients hold unacknowledged.
func (m *mirroring) countUnacked(f func(vhost string) map[mirror.QueueID]int) {
	if m.engine != nil {
		m.engine.CountUnackedWith(f)
	}
	if m.cluster != nil {
		m.cluster.HandleUnacked(f)
	}
}

// listUnrecorded lets list_queues, here and asked by other proxies, show
// the exclusive and server-named queues this proxy's clients declared.
func (m *mirroring) listUnrecorded(f func(vhost string) []mirror.UnrecordedQueue) {
	if m.engine != nil {
		m.engine.ListUnrecordedWith(f)
	}
	if m.cluster != nil {
		m.cluster.HandleUnrecorded(f)
	}
}

// mirror returns the engine as the proxy's Mirror, nil (not a nil
// *engine.Engine) with one backend.
func (m *mirroring) mirror() proxy.Mirror {
	if m.engine == nil {
		return nil
	}
	return m.engine
}

func (m *mirroring) close() {
	if m.stopMembers != nil {
		m.stopMembers()
	}
	if m.policyLog != nil {
		m.policyLog.Close()
	}
	if m.engine != nil {
		m.engine.Close()
	}
	if m.cluster != nil {
		// Shutdown, not Leave: a stopped proxy keeps its vote and rejoins.
		m.cluster.Shutdown()
	} else if m.store != nil {
		m.store.Close()
	}
}

// proxyBackend is the backend client connections go to: the node this proxy
// sits beside, or the first backend.
func proxyBackend(cfg *config.Config) (proxy.Backend, error) {
	b := cfg.Backends[0]
	for _, candidate := range cfg.Backends {
		if candidate.Name == cfg.Node {
			b = candidate
		}
	}
	return backendAddress(b)
}

// backendAddress is where the proxy dials a backend for its clients.
func backendAddress(b config.Backend) (proxy.Backend, error) {
	u, err := url.Parse(b.URL)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		return proxy.Backend{}, fmt.Errorf("backend %s: cannot parse %s", b.Name, config.RedactURL(b.URL))
	}
	backend := proxy.Backend{Name: b.Name, Addr: u.Host}
	port := "5672"
	if u.Scheme == "amqps" {
		port = "5671"
		backend.TLS = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	}
	if u.Port() == "" {
		backend.Addr = net.JoinHostPort(u.Hostname(), port)
	}
	return backend, nil
}

// watchedBackends is every configured backend, reached with the proxy's own
// account in its URL.
func watchedBackends(cfg *config.Config) []controllink.Backend {
	out := make([]controllink.Backend, 0, len(cfg.Backends))
	for _, b := range cfg.Backends {
		wb := controllink.Backend{Name: b.Name, URL: b.URL}
		if u, err := url.Parse(b.URL); err == nil && u.Scheme == "amqps" {
			wb.TLS = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
		}
		out = append(out, wb)
	}
	return out
}

// registerBackendMetrics publishes what the backend watcher knows.
func registerBackendMetrics(m admin.Metrics, cfg *config.Config, w *controllink.Watcher) {
	for _, b := range cfg.Backends {
		labels := fmt.Sprintf("{backend=%q}", b.Name)
		m.Gauge("amqp_mirror_backend_up"+labels, "1 while the proxy's own connection to the backend is open and the broker answers its probes.",
			func() float64 {
				if w.State(b.Name) == controllink.Up {
					return 1
				}
				return 0
			})
		m.Gauge("amqp_mirror_backend_vhosts_refused"+labels, "Vhosts in which the backend refuses the proxy's own account (the vhost is missing there, or the account lacks permissions): nothing of those vhosts is mirrored there.",
			func() float64 { return float64(len(w.RefusedVHosts(b.Name))) })
		m.Counter("amqp_mirror_backend_down_total"+labels, "Times the backend was found down: connection refused or reset, clean shutdown, or no answer within failover_grace.",
			func() float64 { return float64(w.Downs(b.Name)) })
	}
}

// runCtl is `amqp-mirror ctl`; admin.Main parses its flags, which may
// stand before or after the command as in rabbitmqctl.
func runCtl(args []string, stdout, stderr io.Writer) int {
	return admin.Main(args, os.Getenv, stdout, stderr)
}

func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo", `Usage: amqp-mirror demo [flags]

Starts local, independent RabbitMQ nodes (needs rabbitmq-server installed and
root, see scripts/install-deps.sh) and, with two nodes or more, an amqp-mirror
serve beside each, joined in a sidecar cluster (--single: one proxy in front of
all of them), prints how to connect and the seed's walkthrough, and runs until
Ctrl-C; then stops everything it started.`, stdout)
	nodes := fs.Int("nodes", 3, "how many RabbitMQ nodes to start")
	listen := fs.String("listen", "127.0.0.1:5672", "the proxy's AMQP address")
	adminAddr := fs.String("admin", "127.0.0.1:15680", "the proxy's admin API address")
	dir := fs.String("dir", "", "where the nodes and the proxy keep their data (default: a temporary directory)")
	single := fs.Bool("single", false, "one proxy in front of every node instead of the sidecar cluster (a proxy beside each node, on --listen and --admin's ports + 0, 1, 2...)")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := demo(ctx, *nodes, *listen, *adminAddr, *dir, !*single && *nodes > 1, logger, stdout); err != nil {
		logger.Error("demo failed", "err", err)
		return 1
	}
	return 0
}

func demo(ctx context.Context, nodes int, listen, adminAddr, dir string, sidecars bool, logger *slog.Logger, stdout io.Writer) error {
	if nodes < 1 {
		return fmt.Errorf("--nodes %d: the demo needs at least one node", nodes)
	}
	// The proxy binds its ports only once the brokers are up, 10-20 s later: check them
	// first, so that a port in use fails at once, before any broker starts.
	addresses := []demoAddress{
		{"the proxy's AMQP address", listen, "--listen"},
		{"the admin API address", adminAddr, "--admin"},
	}
	var proxies []sidecarAddresses
	if sidecars {
		var err error
		if proxies, err = demoSidecarAddresses(nodes, listen, adminAddr); err != nil {
			return err
		}
		addresses = demoSidecarChecks(proxies)
	}
	if err := checkDemoAddresses(addresses); err != nil {
		return err
	}
	if dir == "" {
		tmp, err := os.MkdirTemp("", "amqp-mirror-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	noun := "nodes"
	if nodes == 1 {
		noun = "node"
	}
	fmt.Fprintf(stdout, "Starting %d RabbitMQ %s under %s (10-20 s)...\n", nodes, noun, dir)
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	cluster, err := localbroker.Start(startCtx, localbroker.Options{Nodes: nodes, BaseDir: filepath.Join(dir, "nodes"), Logger: logger})
	cancel()
	if err != nil {
		return err
	}
	defer cluster.Close()
	if sidecars {
		return demoSidecars(ctx, cluster, proxies, dir, logger, stdout) // main_cluster.go
	}

	cfgPath := filepath.Join(dir, "amqp-mirror.yaml")
	var yaml strings.Builder
	fmt.Fprintf(&yaml, "node: %s\nlisten:\n  amqp: %s\n  admin: %s\nstate_dir: %s\nbackends:\n",
		cluster.Nodes()[0].Name, listen, adminAddr, filepath.Join(dir, "state"))
	for _, n := range cluster.Nodes() {
		fmt.Fprintf(&yaml, "  - name: %s\n    url: %s\n", n.Name, n.URL())
	}
	yaml.WriteString("policies:\n  - name: ha-queues\n    pattern: \"^queue_\"\n    apply-to: queues\n    definition:\n      ha-mode: all\n")
	if err := os.WriteFile(cfgPath, []byte(yaml.String()), 0o644); err != nil {
		return err
	}
	cfg, err := config.Load(cfgPath, nil)
	if err != nil {
		return err
	}
	level := new(slog.LevelVar)
	self, err := os.Executable()
	if err != nil {
		self = "amqp-mirror"
	}
	ready := func(addr string) {
		fmt.Fprintf(stdout, `
amqp-mirror is running.

  brokers:   %s
  proxy:     amqp://guest:guest@%s   (in front of %s)
  config:    %s

Try it (amqp-tools):
  amqp-declare-queue --url amqp://guest:guest@%s -q queue_1
  amqp-publish --url amqp://guest:guest@%s -r queue_1 -b hello
  amqp-get --url amqp://guest:guest@%s -q queue_1
  %s ctl --config %s list_policies

Press Ctrl-C to stop.
`, describeNodes(cluster), addr, cfg.Backends[0].Name, cfgPath, addr, addr, addr, self, cfgPath)
	}
	return serve(ctx, cfg, nil, level, logger, ready)
}

// demoAddress is an address the demo's proxy listens on and the flag that sets it.
type demoAddress struct{ what, address, flag string }

// checkDemoAddresses fails when one of the addresses cannot be listened on, naming the flag
// that changes it. The listeners close again at once: serve binds the addresses later. The
// config wants fixed ports, so port 0 is refused here too rather than after the brokers.
func checkDemoAddresses(addresses []demoAddress) error {
	for _, a := range addresses {
		_, port, err := net.SplitHostPort(a.address)
		if number, convErr := strconv.Atoi(port); err != nil || convErr != nil || number < 1 || number > 65535 {
			return fmt.Errorf("%s %s has no port from 1 to 65535; set one with %s HOST:PORT", a.what, a.address, a.flag)
		}
		listener, err := net.Listen("tcp", a.address)
		if err != nil {
			return fmt.Errorf("%s %s is not available; choose another with %s HOST:PORT: %w", a.what, a.address, a.flag, err)
		}
		listener.Close()
	}
	return nil
}

func describeNodes(c *localbroker.Cluster) string {
	var parts []string
	for _, n := range c.Nodes() {
		parts = append(parts, fmt.Sprintf("%s=127.0.0.1:%d", n.Name, n.Port))
	}
	return strings.Join(parts, " ")
}
