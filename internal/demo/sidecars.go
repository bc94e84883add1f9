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
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
)

// sidecarAddresses are the addresses of one of the demo's proxies.
type sidecarAddresses struct{ AMQP, Admin, Gossip, Raft string }

// sidecarAddressesFor gives the demo's proxy beside node i (from 0) the ports of --listen
// and --admin plus i, and free loopback ports for gossip and raft.
func sidecarAddressesFor(nodes int, listen, admin string) ([]sidecarAddresses, error) {
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

// sidecarChecks are the addresses of the demo's proxies, for holdAddresses. Gossip and
// raft have no flag: their ports were free a moment ago and are held from here on.
func sidecarChecks(proxies []sidecarAddresses) []address {
	var out []address
	for i, p := range proxies {
		out = append(out,
			address{fmt.Sprintf("the AMQP address of node %d's proxy (--listen's port + %d)", i+1, i), p.AMQP, "--listen"},
			address{fmt.Sprintf("the admin address of node %d's proxy (--admin's port + %d)", i+1, i), p.Admin, "--admin"},
			address{fmt.Sprintf("the gossip address of node %d's proxy", i+1), p.Gossip, ""},
			address{fmt.Sprintf("the raft address of node %d's proxy", i+1), p.Raft, ""})
	}
	return out
}

// runSidecars runs the sidecar topology: an `amqp-mirror serve` process beside each
// broker (so that one node, broker and proxy, can be stopped on its own), prints the
// walkthrough of mirrored queues, and stops the proxies when ctx ends.
func runSidecars(ctx context.Context, brokers *localbroker.Cluster, proxies []sidecarAddresses, dir string, logger *slog.Logger, stdout io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to run the proxies: %w", err)
	}
	nodes := brokers.Nodes()
	var children []*proxyProcess
	var configs []string
	defer func() {
		for _, c := range children {
			c.stop(logger)
		}
	}()
	// Gossip is encrypted and raft runs mutual TLS, as they should
	// wherever it is cheap: one key for the demo's cluster, in each
	// proxy's config file (mode 0600), and an authority of its own in
	// dir/tls that issues each proxy's member certificate.
	key, err := cluster.NewGossipKey()
	if err != nil {
		return err
	}
	tlsDir := filepath.Join(dir, "tls")
	if err := pki.CreateCA(tlsDir, "amqp-mirror demo CA", pki.DefaultCAValidity); err != nil {
		return fmt.Errorf("the demo's certificate authority: %w", err)
	}
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
		member, err := pki.CreateCert(tlsDir, pki.CertRequest{Kind: "member", Name: n.Name, Identity: config.DefaultClusterIdentity, ValidFor: pki.DefaultCertValidity})
		if err != nil {
			return fmt.Errorf("%s's member certificate: %w", n.Name, err)
		}
		fmt.Fprintf(&yaml, "cluster:\n  bind: %s\n  raft_bind: %s\n  bootstrap_expect: %d\n  join: [%s]\n  encrypt: %s\n  tls: {ca: %s, cert: %s, key: %s}\n  require_encryption: true\nbackends:\n",
			proxies[i].Gossip, proxies[i].Raft, len(nodes), strings.Join(join, ", "), key, member.CA, member.Cert, member.Key)
		for _, b := range nodes {
			fmt.Fprintf(&yaml, "  - name: %s\n    url: %s\n", b.Name, b.URL())
		}
		configPath := filepath.Join(home, "amqp-mirror.yaml")
		if err := os.WriteFile(configPath, []byte(yaml.String()), 0o600); err != nil {
			return err
		}
		if _, err := config.Load(configPath, nil); err != nil {
			return err
		}
		c, err := startProxy(n.Name, filepath.Join(home, "serve.log"), self, "serve", "--config", configPath)
		if err != nil {
			return err
		}
		children = append(children, c)
		configs = append(configs, configPath)
	}
	for i, c := range children {
		if err := c.awaitListening(ctx, proxies[i].AMQP, 90*time.Second); err != nil {
			return err
		}
	}

	fmt.Fprintf(stdout, "\namqp-mirror is running: %d nodes, each a RabbitMQ broker with an amqp-mirror beside it,\njoined in a sidecar cluster\n(gossip encrypted, raft under mutual TLS: the authority and certificates are in %s).\n\n", len(nodes), tlsDir)
	for i, c := range children {
		fmt.Fprintf(stdout, "  node %d: broker %s=127.0.0.1:%d (pid %d)\n          proxy:     amqp://guest:guest@%s   (pid %d)\n          config:    %s\n          log:       %s\n",
			i+1, nodes[i].Name, nodes[i].Port, nodes[i].PID(), proxies[i].AMQP, c.pid(), configs[i], c.logPath)
	}
	ctl := func(i int) string { return fmt.Sprintf("%s ctl --config %s", self, configs[i]) }
	url := func(i int) string { return "amqp://guest:guest@" + proxies[i].AMQP }
	fmt.Fprintf(stdout, "\nA walkthrough of mirrored queues (amqp-tools):\n")
	for i := range min(3, len(nodes)) {
		fmt.Fprintf(stdout, "  amqp-declare-queue --url %s -d -q queue_%d      # mastered on %s (client-local)\n", url(i), i+1, nodes[i].Name)
	}
	fmt.Fprintf(stdout, "  %s set_policy ha-all \"^queue_\" '{\"ha-mode\":\"all\"}'\n", ctl(0))
	fmt.Fprintf(stdout, "  %s list_queues name master slaves\n", ctl(0))
	if len(nodes) >= 3 {
		fmt.Fprintf(stdout, "  for i in $(seq 10); do amqp-publish --url %s -r queue_2 -p -b \"message $i\"; done\n", url(0))
		fmt.Fprintf(stdout, "  kill %d %d      # stops node 2: its proxy, then its broker\n", children[1].pid(), nodes[1].PID())
		fmt.Fprintf(stdout, "  %s list_queues name master slaves messages   # queue_2 on %s now\n", ctl(0), nodes[2].Name)
		fmt.Fprintf(stdout, "  amqp-get --url %s -q queue_2\n", url(2))
	}
	fmt.Fprintf(stdout, "\nPress Ctrl-C to stop.\n")
	<-ctx.Done()
	return nil
}
