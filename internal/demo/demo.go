// Package demo runs amqp-mirror's demo: local, independent RabbitMQ nodes
// (internal/localbroker) and either one proxy in front of them, in this
// process, or an `amqp-mirror serve` process beside each, joined in a
// sidecar cluster, until its context ends; then it stops everything it
// started.
package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/internal/node"
)

// Options are the demo's flags, and where it writes.
type Options struct {
	// Nodes is how many RabbitMQ nodes to start, at least one.
	Nodes int
	// Listen and Admin are the proxy's AMQP and admin API addresses; in
	// the sidecar cluster, those of node 1's proxy, the others' ports
	// following.
	Listen, Admin string
	// Dir holds the nodes' and the proxies' data; "" for a temporary
	// directory, removed at the end.
	Dir string
	// Sidecars runs a proxy process beside each node instead of one proxy
	// in front of all of them.
	Sidecars bool
	Logger   *slog.Logger
	// Stdout receives how to connect and the walkthrough.
	Stdout io.Writer
	// NotifyReload is node.Options.NotifyReload for the proxy run in this
	// process.
	NotifyReload func(reload chan<- os.Signal) (stop func())
}

// Run starts the brokers and the proxies, prints how to use them, and
// runs until ctx ends.
func Run(ctx context.Context, opts Options) error {
	nodes, listen, adminAddr, dir := opts.Nodes, opts.Listen, opts.Admin, opts.Dir
	if nodes < 1 {
		return fmt.Errorf("--nodes %d: the demo needs at least one node", nodes)
	}
	// The proxy binds its ports only once the brokers are up, 10-20 s later: hold them
	// first, so that a port in use fails at once, before any broker starts, and so that
	// no broker is given one of them while it starts.
	addresses := []address{
		{"the proxy's AMQP address", listen, "--listen"},
		{"the admin API address", adminAddr, "--admin"},
	}
	var proxies []sidecarAddresses
	if opts.Sidecars {
		var err error
		if proxies, err = sidecarAddressesFor(nodes, listen, adminAddr); err != nil {
			return err
		}
		addresses = sidecarChecks(proxies)
	}
	held, err := holdAddresses(addresses)
	if err != nil {
		return err
	}
	defer held.release()
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
	fmt.Fprintf(opts.Stdout, "Starting %d RabbitMQ %s under %s (10-20 s)...\n", nodes, noun, dir)
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	cluster, err := localbroker.Start(startCtx, localbroker.Options{Nodes: nodes, BaseDir: filepath.Join(dir, "nodes"), Logger: opts.Logger})
	cancel()
	held.release()
	if err != nil {
		return err
	}
	defer cluster.Close()
	if opts.Sidecars {
		return runSidecars(ctx, cluster, proxies, dir, opts.Logger, opts.Stdout)
	}
	return runSingle(ctx, cluster, dir, opts)
}

// runSingle runs one proxy, in this process, in front of every broker.
func runSingle(ctx context.Context, cluster *localbroker.Cluster, dir string, opts Options) error {
	cfgPath := filepath.Join(dir, "amqp-mirror.yaml")
	var yaml strings.Builder
	fmt.Fprintf(&yaml, "node: %s\nlisten:\n  amqp: %s\n  admin: %s\nstate_dir: %s\nbackends:\n",
		cluster.Nodes()[0].Name, opts.Listen, opts.Admin, filepath.Join(dir, "state"))
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
		fmt.Fprintf(opts.Stdout, `
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
	return node.Run(ctx, cfg, node.Options{Level: level, Logger: opts.Logger, Ready: ready, NotifyReload: opts.NotifyReload})
}

// address is an address the demo's proxy listens on and the flag that sets it.
type address struct{ what, address, flag string }

// heldAddresses are listeners on the proxies' addresses, open while the brokers start
// so that the brokers' free-port picks cannot land on them.
type heldAddresses []net.Listener

// release closes the listeners so that the proxies can bind the addresses. It may be
// called more than once.
func (h *heldAddresses) release() {
	for _, listener := range *h {
		listener.Close()
	}
	*h = nil
}

// holdAddresses listens on every address, or fails naming the flag that changes the one
// that cannot be listened on. The config wants fixed ports, so port 0 is refused here
// too rather than after the brokers.
func holdAddresses(addresses []address) (*heldAddresses, error) {
	held := new(heldAddresses)
	for _, a := range addresses {
		_, port, err := net.SplitHostPort(a.address)
		if number, convErr := strconv.Atoi(port); err != nil || convErr != nil || number < 1 || number > 65535 {
			held.release()
			return nil, fmt.Errorf("%s %s has no port from 1 to 65535; set one with %s HOST:PORT", a.what, a.address, a.flag)
		}
		listener, err := net.Listen("tcp", a.address)
		if err != nil {
			held.release()
			if a.flag == "" {
				return nil, fmt.Errorf("%s %s is not available: %w", a.what, a.address, err)
			}
			return nil, fmt.Errorf("%s %s is not available; choose another with %s HOST:PORT: %w", a.what, a.address, a.flag, err)
		}
		*held = append(*held, listener)
	}
	return held, nil
}

func describeNodes(c *localbroker.Cluster) string {
	var parts []string
	for _, n := range c.Nodes() {
		parts = append(parts, fmt.Sprintf("%s=127.0.0.1:%d", n.Name, n.Port))
	}
	return strings.Join(parts, " ")
}
