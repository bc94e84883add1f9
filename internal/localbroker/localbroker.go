// Package localbroker runs local, independent RabbitMQ nodes for the demo, the benchmark
// and the tests: the CLI's demo command, integration/bench and the integration tests all
// start their brokers through it, so the product does not depend on its test tree.
//
// Each node is /usr/lib/rabbitmq/bin/rabbitmq-server run directly (the /usr/sbin wrapper
// switches user and drops the environment), with its own Erlang node name, loopback ports,
// data, logs and config under one base directory; see DESIGN.md section 8.
//
// Lifetime: every node runs under a small sh wrapper that leads the node's process group
// and holds the read end of a pipe whose write end only this process keeps. When this
// process exits for any reason, kill -9 included, the kernel closes the pipe and the wrapper
// kills the group, so no broker outlives the program that started it. The Erlang helpers
// erl_child_setup and inet_gethost start their own sessions, so a group kill does not reach
// them; they exit by themselves as soon as beam.smp is gone. epmd, the Erlang port mapper,
// is shared by every Erlang node on the machine and is deliberately left running.
//
// The package handles no signals and never exits the process: callers decide that (the
// test helper in integration/testutil, internal/demo for the CLI's demo).
//
// # What survives Kill
//
// Kill is kill -9 of the whole node. What RabbitMQ 3.10.8 (OTP 25, mnesia 4.21) has on disk
// at that moment, read from its code and measured with kill -9 right after the replies:
//
//   - A persistent message that a publisher confirm acknowledged, in a durable queue that
//     itself survives: the classic queue confirms only after its index journal or message
//     store was fsynced.
//   - The queue's record, only once its transaction's outcome reached the metadata log, up
//     to about two seconds after queue.declare-ok. RabbitMQ logs the commit and fsyncs the
//     log (mnesia_sync) before answering, but the "committed" decision that follows is
//     handed to the log by mnesia_recover asynchronously, into disk_log's in-memory write
//     cache, which a timer writes out after two seconds. A node killed in between finds a
//     commit without its decision at boot, treats the transaction as aborted, and the queue
//     is gone (404 NOT_FOUND) with the confirmed messages it held. Killed right after the
//     confirm, 5 of 48 freshly booted nodes lost the queue this way. The same holds, from
//     the code, for every transaction that writes a RAM table and a disk table together
//     (mnesia's asym_trans): declaring or deleting durable queues, exchanges and bindings.
//     Vhosts, users and policies live in disk tables only: their commits carry their own
//     outcome, in the log RabbitMQ fsyncs before it replies.
//
// So a test that kills a node and expects what it declared there to come back calls
// Node.FlushMetadata after the declarations and before Kill; waiting for the timer instead
// would be a sleep with no bound under load. Stop, a graceful shutdown, loses nothing.
package localbroker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"time"
)

// DefaultServerPath is where the Debian package installs the broker's start script.
const DefaultServerPath = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// Options say what Start runs.
type Options struct {
	// Nodes is how many nodes to start. Zero means len(Names), or 1 when Names is empty.
	Nodes int
	// Names are the logical node names ("rabbit1"...), used in logs, directory names and
	// Erlang node names. Default rabbit1..rabbitN.
	Names []string
	// BaseDir holds one directory per node. Empty means a new temporary directory, which
	// Close removes; a directory given here is left in place, logs and all.
	BaseDir string
	// Logger receives progress and unexpected node exits. Nil discards.
	Logger *slog.Logger
	// ServerPath overrides DefaultServerPath.
	ServerPath string
	// ExtraConfig is appended to every node's rabbitmq.conf (new-style key = value lines).
	ExtraConfig string
}

// Cluster is a set of independent nodes started together. It is not a RabbitMQ cluster:
// the nodes know nothing of each other, which is what amqp-mirror expects of its backends.
type Cluster struct {
	nodes       []*Node
	baseDir     string
	ownsBaseDir bool
	logger      *slog.Logger

	closeOnce sync.Once
	closeErr  error
}

var validName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Start starts the nodes in parallel and returns once every one accepts AMQP connections.
// On error nothing it started is left running.
func Start(ctx context.Context, options Options) (*Cluster, error) {
	logger := options.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	serverPath := options.ServerPath
	if serverPath == "" {
		serverPath = DefaultServerPath
	}
	if _, err := os.Stat(serverPath); err != nil {
		return nil, fmt.Errorf("rabbitmq-server not found at %s: apt-get install -y rabbitmq-server", serverPath)
	}
	names, err := nodeNames(options)
	if err != nil {
		return nil, err
	}
	if err := ensureErlangCookie(); err != nil {
		return nil, err
	}
	ensureEPMD(ctx, logger)

	cluster := &Cluster{baseDir: options.BaseDir, logger: logger}
	if cluster.baseDir == "" {
		cluster.baseDir, err = os.MkdirTemp("", "amqp-mirror-localbroker-")
		if err != nil {
			return nil, fmt.Errorf("localbroker: %w", err)
		}
		cluster.ownsBaseDir = true
	}
	for _, name := range names {
		node, err := newNode(name, cluster.baseDir, serverPath, options.ExtraConfig, logger)
		if err != nil {
			cluster.Close()
			return nil, err
		}
		cluster.nodes = append(cluster.nodes, node)
	}

	began := time.Now()
	errs := make([]error, len(cluster.nodes))
	var group sync.WaitGroup
	for i, node := range cluster.nodes {
		group.Go(func() { errs[i] = node.startFirstTime(ctx) })
	}
	group.Wait()
	if err := errors.Join(errs...); err != nil {
		cluster.Close()
		return nil, err
	}
	logger.Info("rabbitmq nodes started", "nodes", len(cluster.nodes), "elapsed", time.Since(began).Round(time.Millisecond))
	return cluster, nil
}

func nodeNames(options Options) ([]string, error) {
	count := options.Nodes
	if count == 0 {
		count = max(len(options.Names), 1)
	}
	if len(options.Names) > 0 && len(options.Names) != count {
		return nil, fmt.Errorf("localbroker: %d names given for %d nodes", len(options.Names), count)
	}
	names := options.Names
	if len(names) == 0 {
		for i := 1; i <= count; i++ {
			names = append(names, fmt.Sprintf("rabbit%d", i))
		}
	}
	seen := map[string]bool{}
	for _, name := range names {
		if !validName.MatchString(name) {
			return nil, fmt.Errorf("localbroker: node name %q: use letters, digits, '-' and '_'", name)
		}
		if seen[name] {
			return nil, fmt.Errorf("localbroker: node name %q given twice", name)
		}
		seen[name] = true
	}
	return names, nil
}

// Nodes returns the nodes in the order they were named.
func (c *Cluster) Nodes() []*Node { return append([]*Node(nil), c.nodes...) }

// Node returns the node with the logical name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, node := range c.nodes {
		if node.Name == name {
			return node
		}
	}
	return nil
}

// URLs returns every node's AMQP URL, in node order.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.nodes))
	for i, node := range c.nodes {
		urls[i] = node.URL()
	}
	return urls
}

// BaseDir is the directory holding the nodes' data, logs and config.
func (c *Cluster) BaseDir() string { return c.baseDir }

// Close kills every node (teardown needs no graceful stop), waits for the processes to go
// and removes the base directory if Start created it. Calling it again returns the first
// result.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		errs := make([]error, len(c.nodes))
		var group sync.WaitGroup
		for i, node := range c.nodes {
			group.Go(func() { errs[i] = node.Kill() })
		}
		group.Wait()
		if c.ownsBaseDir {
			errs = append(errs, os.RemoveAll(c.baseDir))
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// ensureErlangCookie creates $HOME/.erlang.cookie when it is missing. Erlang would create it
// at node start too, but nodes starting in parallel on a fresh machine race to write it, and
// rabbitmqctl must later read the same cookie. Linking a finished temporary file into place
// is atomic, so a concurrent test binary sees either no cookie or a whole one.
func ensureErlangCookie() error {
	home, err := os.UserHomeDir()
	if err != nil {
		return fmt.Errorf("localbroker: no home directory for the Erlang cookie: %w", err)
	}
	path := filepath.Join(home, ".erlang.cookie")
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	const letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	cookie := make([]byte, 20)
	rand.Read(cookie)
	for i := range cookie {
		cookie[i] = letters[int(cookie[i])%len(letters)]
	}
	temporary, err := os.CreateTemp(home, ".erlang.cookie.")
	if err != nil {
		return fmt.Errorf("localbroker: Erlang cookie: %w", err)
	}
	defer os.Remove(temporary.Name())
	_, err = temporary.Write(cookie)
	err = errors.Join(err, temporary.Chmod(0o400), temporary.Close())
	if err != nil {
		return fmt.Errorf("localbroker: Erlang cookie: %w", err)
	}
	if err := os.Link(temporary.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("localbroker: Erlang cookie: %w", err)
	}
	return nil
}

// ensureEPMD starts the Erlang port mapper when nothing listens on its port, so that nodes
// starting in parallel do not each try to launch it. Failure is only logged: every node
// starts epmd itself when it finds none.
func ensureEPMD(ctx context.Context, logger *slog.Logger) {
	const address = "127.0.0.1:4369"
	if epmdListening(address) {
		return
	}
	path, err := exec.LookPath("epmd")
	if err != nil {
		return
	}
	// epmd -daemon forks, detaches and returns; it must not inherit our output pipes.
	if err := exec.CommandContext(ctx, path, "-daemon").Run(); err != nil {
		logger.Warn("starting epmd", "error", err)
		return
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if epmdListening(address) {
			logger.Info("started epmd; it is shared by all Erlang nodes and left running")
			return
		}
	}
}

func epmdListening(address string) bool {
	connection, err := net.DialTimeout("tcp", address, time.Second)
	if err != nil {
		return false
	}
	connection.Close()
	return true
}
