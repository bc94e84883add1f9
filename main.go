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
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/admin"
	"github.com/amqp-mirror/amqp-mirror/internal/demo"
	"github.com/amqp-mirror/amqp-mirror/internal/gcpace"
	"github.com/amqp-mirror/amqp-mirror/internal/node"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/internal/version"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
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
  amqp-mirror keygen                           print a new gossip encryption key
  amqp-mirror tls ca|cert ...                  issue the certificates of the cluster's TLS
  amqp-mirror version                          print the version (also --version)
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
	case "keygen":
		return runKeygen(args[1:], stdout, stderr)
	case "tls":
		return pki.Main(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, version.Read())
		return 0
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
file is refused and the running configuration stays.

Memory: unless GOGC or GOMEMLIMIT is set in the environment, the garbage
collector lets the heap grow 64 MiB past its live data before it collects,
and as Go's default (GOGC=100) once the live heap is larger than that.`, stdout)
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
	defer paceGC(ctx)()
	if err := node.Run(ctx, cfg, node.Options{Flags: fs, Level: level, Logger: logger, NotifyReload: notifyReload}); err != nil {
		logger.Error("amqp-mirror stopped", "err", err)
		return 1
	}
	return 0
}

// paceGC runs gcpace.Pace until the returned function is called, unless
// the operator set GOGC or GOMEMLIMIT.
func paceGC(ctx context.Context) (stop func()) {
	if !gcpace.Wanted(os.Getenv) {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		gcpace.Pace(ctx, gcpace.DefaultHeadroom, time.Second)
	}()
	return func() { cancel(); <-done }
}

// notifyReload relays SIGHUP to reload, for node.Options.NotifyReload.
func notifyReload(reload chan<- os.Signal) (stop func()) {
	signal.Notify(reload, syscall.SIGHUP)
	return func() { signal.Stop(reload) }
}

func newLogger(l config.Log, level *slog.LevelVar, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
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
all of them), prints how to connect and a walkthrough of mirrored queues, and
runs until Ctrl-C; then stops everything it started.`, stdout)
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
	opts := demo.Options{
		Nodes: *nodes, Listen: *listen, Admin: *adminAddr, Dir: *dir, Sidecars: !*single && *nodes > 1,
		Logger: logger, Stdout: stdout, NotifyReload: notifyReload,
	}
	if err := demo.Run(ctx, opts); err != nil {
		logger.Error("demo failed", "err", err)
		return 1
	}
	return 0
}

func runKeygen(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("keygen", `Usage: amqp-mirror keygen [--dir DIR [--members NAME,...]]

Prints a new random 32-byte key, base64-encoded, for cluster.encrypt (the
sidecar cluster's gossip encryption) or for "ctl keys install". Give every
proxy of a cluster the same key.

With --dir it prints nothing secret: it writes the key to DIR/gossip.key
(mode 0600, for cluster.encrypt_file) and, with --members, a certificate
authority and a member certificate for each name (for cluster.tls, as
"amqp-mirror tls" makes them). It only adds what is missing, so a deployment
can run it at every start (docker-compose.yml does).`, stdout)
	dir := fs.String("dir", "", "write the key to DIR/gossip.key instead of printing it")
	members := fs.StringSlice("members", nil, "with --dir: the proxies (node names) to issue member certificates for")
	identity := fs.String("identity", config.DefaultClusterIdentity, "with --members: the identity the member certificates name (cluster.tls.identity)")
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 || (*dir == "" && len(*members) > 0) {
		fmt.Fprintf(stderr, "amqp-mirror keygen: takes no arguments, and --members only with --dir; found %q\n", fs.Args())
		return 2
	}
	key, err := cluster.NewGossipKey()
	if err != nil {
		fmt.Fprintf(stderr, "amqp-mirror keygen: %v\n", err)
		return 1
	}
	if *dir == "" {
		fmt.Fprintln(stdout, key)
		return 0
	}
	wrote, err := pki.EnsureClusterKeys(*dir, key, *identity, *members)
	for _, f := range wrote {
		fmt.Fprintf(stdout, "wrote %s\n", f)
	}
	if err != nil {
		fmt.Fprintf(stderr, "amqp-mirror keygen: %v\n", err)
		return 1
	}
	return 0
}
