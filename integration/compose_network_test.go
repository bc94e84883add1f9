package integration

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sys/unix"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// TestComposeTopologyOnNetworkNamespaces runs what docker-compose.yml would
// run, without Docker: each proxy in a network namespace of its own on the
// address the compose file gives it, with the config the compose file mounts,
// unchanged, and the brokers reachable by their service hostnames on the
// official image's port. The proxies must form their sidecar cluster from
// those configs alone, pass the compose file's own healthcheck command, and
// mirror a queue declared through one of them on all three brokers. Only the
// image and the state volume (a temporary directory, through the
// AMQP_MIRROR_STATE_DIR override) are not what Docker would give.
func TestComposeTopologyOnNetworkNamespaces(t *testing.T) {
	compose := loadCompose(t)
	configPath := loadDockerfile(t).configPath(t)
	network := newComposeNetwork(t, compose)

	binary := newCLI(t)
	keys := composeClusterKeys(t, compose, configPath)
	proxies := composeProxyNames()
	users := map[string]bool{}
	stateDirs := map[string]string{}
	for _, proxy := range proxies {
		file := filepath.Join(repositoryRoot, mountedFile(t, compose.Services[proxy], configPath))
		for _, variable := range keys[proxy] {
			name, value, _ := strings.Cut(variable, "=")
			t.Setenv(name, value)
		}
		cfg, err := config.Load(file, nil)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		// The brokers of the compose file create the account of the backend
		// URLs (RABBITMQ_DEFAULT_USER); the shared nodes get it for this test.
		for _, b := range cfg.Backends {
			u, err := url.Parse(b.URL)
			if err != nil {
				t.Fatal(err)
			}
			password, _ := u.User.Password()
			if key := b.Name + " " + u.User.Username(); !users[key] {
				users[key] = true
				cliAddUser(t, node(t, b.Name), u.User.Username(), password)
			}
		}
		stateDirs[proxy] = filepath.Join(t.TempDir(), "state")
		network.start(t, proxy, append([]string{config.EnvName("state_dir") + "=" + stateDirs[proxy]}, keys[proxy]...), binary.path, "serve", "--config", file)
	}

	// The compose file's healthcheck, run as Docker would run it in the
	// container: healthy once the cluster has formed and the proxy serves.
	for _, proxy := range proxies {
		test := compose.Services[proxy].Healthcheck.Test[1:]
		if test[0] != "amqp-mirror" {
			t.Fatalf("%s: healthcheck %v does not run amqp-mirror", proxy, test)
		}
		args := slices.Clone(test[1:])
		file := filepath.Join(repositoryRoot, mountedFile(t, compose.Services[proxy], configPath))
		args[slices.Index(args, configPath)] = file
		env := append([]string{config.EnvName("state_dir") + "=" + stateDirs[proxy]}, keys[proxy]...)
		awaitCondition(t, 90*time.Second, func() error {
			if output, err := network.run(t, proxy, env, binary.path, args...); err != nil {
				return fmt.Errorf("%s healthcheck: %v\n%s", proxy, err, output)
			}
			return nil
		})
	}

	// A client of the first proxy declares a queue the files' policy
	// mirrors; client-local places its master beside that proxy.
	first, firstNode := proxies[0], composeProxies[proxies[0]]
	queue := fmt.Sprintf("queue_compose_%d", time.Now().UnixNano())
	conn := network.dialAMQP(t, first, "app", "app")
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("declare %s through %s: %v", queue, first, err)
	}
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			t.Errorf("delete %s: %v", queue, err)
		}
	})
	var slaves []string
	for _, broker := range composeBrokers {
		if broker != firstNode {
			slaves = append(slaves, broker)
		}
	}
	file := filepath.Join(repositoryRoot, mountedFile(t, compose.Services[first], configPath))
	env := append([]string{config.EnvName("state_dir") + "=" + stateDirs[first]}, keys[first]...)
	want := fmt.Sprintf("%s\t%s\t[%s]", queue, firstNode, strings.Join(slaves, ", "))
	awaitCondition(t, 30*time.Second, func() error {
		output, err := network.run(t, first, env, binary.path, "ctl", "--config", file, "list_queues", "name", "master", "synchronised_slaves")
		if err != nil || !strings.Contains(output, want) {
			return fmt.Errorf("list_queues through %s: %v; want a line %q, got:\n%s", first, err, want, output)
		}
		return nil
	})
	// And each broker holds its copy, as those records say.
	for _, broker := range composeBrokers {
		direct, err := amqp.Dial(node(t, broker).URL())
		if err != nil {
			t.Fatal(err)
		}
		directChannel, err := direct.Channel()
		if err == nil {
			_, err = directChannel.QueueDeclarePassive(queue, false, false, false, false, nil)
		}
		direct.Close()
		if err != nil {
			t.Errorf("%s on %s itself: %v", queue, broker, err)
		}
	}
}

// composeProxyNames returns the compose file's proxies in name order.
func composeProxyNames() []string {
	return slices.Sorted(maps.Keys(composeProxies))
}

// composeNetwork is the compose file's network made of network namespaces:
// one holding a bridge and the brokers' addresses, and one per proxy joined
// to the bridge by a veth pair, on the proxy's fixed address. Every address
// stays inside the namespaces; the brokers' addresses forward to the shared
// RabbitMQ nodes of the test package.
type composeNetwork struct {
	prefix     string
	namespaces []string
	brokerIPs  map[string]string // broker service -> its address on the bridge
	proxyIPs   map[string]string // proxy service -> its fixed address

	mu          sync.Mutex
	listeners   []net.Listener
	connections map[net.Conn]bool // nil once close has begun
	forwarders  sync.WaitGroup
}

func newComposeNetwork(t *testing.T, compose composeFile) *composeNetwork {
	t.Helper()
	n := &composeNetwork{
		prefix:      fmt.Sprintf("amqpm%d", os.Getpid()),
		brokerIPs:   map[string]string{},
		proxyIPs:    map[string]string{},
		connections: map[net.Conn]bool{},
	}
	t.Cleanup(n.close)
	bridge := n.namespace(t, "b")
	n.ip(t, "-n", bridge, "link", "set", "lo", "up")
	n.ip(t, "-n", bridge, "link", "add", "br0", "type", "bridge")
	n.ip(t, "-n", bridge, "link", "set", "br0", "up")

	for proxy := range composeProxies {
		n.proxyIPs[proxy] = serviceAddress(t, compose, proxy)
	}
	// serviceAddress checked that each proxy has one network with a subnet.
	var subnet *net.IPNet
	for network := range compose.Services[composeProxyNames()[0]].Networks.(map[string]any) {
		_, parsed, err := net.ParseCIDR(compose.Networks[network].IPAM.Config[0].Subnet)
		if err != nil {
			t.Fatal(err)
		}
		subnet = parsed
	}
	prefixLength, _ := subnet.Mask.Size()
	// The brokers take the subnet's first addresses the proxies do not have
	// (Docker would give them any), from .2 on: Docker keeps .1, the gateway.
	ip := subnet.IP.To4()
	for _, broker := range composeBrokers {
		for {
			ip = net.IPv4(ip[0], ip[1], ip[2], ip[3]+1).To4()
			if ip[3] >= 2 && !slices.Contains(slices.Collect(maps.Values(n.proxyIPs)), ip.String()) {
				break
			}
		}
		n.brokerIPs[broker] = ip.String()
	}
	for _, broker := range composeBrokers {
		n.ip(t, "-n", bridge, "addr", "add", fmt.Sprintf("%s/%d", n.brokerIPs[broker], prefixLength), "dev", "br0")
		n.forward(t, bridge, net.JoinHostPort(n.brokerIPs[broker], brokerAMQPPort), node(t, broker).URL())
	}
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1 localhost\n")
	for _, broker := range composeBrokers {
		fmt.Fprintf(&hosts, "%s %s\n", n.brokerIPs[broker], compose.Services[broker].Hostname)
	}
	i := 0
	for proxy, address := range n.proxyIPs {
		i++
		ns := n.namespace(t, proxy)
		peer := fmt.Sprintf("v%d", i)
		n.ip(t, "-n", ns, "link", "set", "lo", "up")
		n.ip(t, "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", bridge)
		n.ip(t, "-n", ns, "addr", "add", fmt.Sprintf("%s/%d", address, prefixLength), "dev", "eth0")
		n.ip(t, "-n", ns, "link", "set", "eth0", "up")
		n.ip(t, "-n", bridge, "link", "set", peer, "master", "br0")
		n.ip(t, "-n", bridge, "link", "set", peer, "up")
		// ip netns exec mounts /etc/netns/NAME/hosts over /etc/hosts: the
		// service hostnames, as Docker's DNS would answer them.
		directory := filepath.Join("/etc/netns", ns)
		if err := os.MkdirAll(directory, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(directory, "hosts"), []byte(hosts.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// namespace creates the network namespace named after the service; close
// deletes it.
func (n *composeNetwork) namespace(t *testing.T, service string) string {
	t.Helper()
	name := n.prefix + "-" + service
	n.ip(t, "netns", "add", name)
	n.namespaces = append(n.namespaces, name)
	return name
}

func (n *composeNetwork) ip(t *testing.T, args ...string) {
	t.Helper()
	if output, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, output)
	}
}

// start runs a long-lived command in the proxy's namespace until the test
// ends; its output is shown when the test failed.
func (n *composeNetwork) start(t *testing.T, proxy string, env []string, name string, args ...string) {
	t.Helper()
	ns := n.prefix + "-" + proxy
	command := exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
	command.Env = cliEnvironment(env)
	output := &cliOutput{}
	command.Stdout, command.Stderr = output, output
	if err := command.Start(); err != nil {
		t.Fatalf("start %s in %s: %v", name, ns, err)
	}
	done := make(chan struct{})
	go func() {
		command.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		// ip netns exec execs the command: the process is the proxy itself.
		command.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("%s %s in %s:\n%s", name, strings.Join(args, " "), ns, output)
		}
	})
}

// run runs a command to its end in the proxy's namespace.
func (n *composeNetwork) run(t *testing.T, proxy string, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	command := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.prefix + "-" + proxy, name}, args...)...)
	command.Env = cliEnvironment(env)
	output, err := command.CombinedOutput()
	return string(output), err
}

// dialAMQP connects to the proxy's AMQP port from inside its namespace, as
// a client of the published port would reach it.
func (n *composeNetwork) dialAMQP(t *testing.T, proxy, user, password string) *amqp.Connection {
	t.Helper()
	ns := n.prefix + "-" + proxy
	address := net.JoinHostPort(n.proxyIPs[proxy], "5672")
	conn, err := amqp.DialConfig(fmt.Sprintf("amqp://%s:%s@%s/", user, password, address), amqp.Config{
		Dial: func(network, address string) (net.Conn, error) {
			var conn net.Conn
			err := inNetworkNamespace(ns, func() (err error) {
				conn, err = net.DialTimeout(network, address, 10*time.Second)
				return err
			})
			return conn, err
		},
	})
	if err != nil {
		t.Fatalf("connect to %s at %s: %v", proxy, address, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// forward accepts connections on address inside namespace ns and joins each
// to a new connection to the broker of url, outside it.
func (n *composeNetwork) forward(t *testing.T, ns, address, brokerURL string) {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := inNetworkNamespace(ns, func() (err error) {
		ln, err = net.Listen("tcp", address)
		return err
	}); err != nil {
		t.Fatalf("listen on %s in %s: %v", address, ns, err)
	}
	n.mu.Lock()
	n.listeners = append(n.listeners, ln)
	n.mu.Unlock()
	n.forwarders.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			broker, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
			if err != nil {
				client.Close()
				continue
			}
			if !n.track(client) || !n.track(broker) {
				client.Close()
				broker.Close()
				return
			}
			for _, pair := range [][2]net.Conn{{client, broker}, {broker, client}} {
				n.forwarders.Go(func() {
					io.Copy(pair[0], pair[1])
					pair[0].Close()
					pair[1].Close()
				})
			}
		}
	})
}

// track registers c to be closed by close; false once close has begun.
func (n *composeNetwork) track(c net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.connections == nil {
		return false
	}
	n.connections[c] = true
	return true
}

// close stops the forwarders and deletes the namespaces and their hosts files.
func (n *composeNetwork) close() {
	n.mu.Lock()
	listeners, connections := n.listeners, n.connections
	n.connections = nil
	n.mu.Unlock()
	for _, ln := range listeners {
		ln.Close()
	}
	for c := range connections {
		c.Close()
	}
	n.forwarders.Wait()
	for _, ns := range n.namespaces {
		exec.Command("ip", "netns", "del", ns).Run()
		os.RemoveAll(filepath.Join("/etc/netns", ns))
	}
}

// inNetworkNamespace runs f on an OS thread that entered the network
// namespace ns, so that the sockets f opens belong to it (a socket stays in
// the namespace it was made in). The thread is never unlocked: the runtime
// ends it with the goroutine instead of handing it, still in ns, to other
// goroutines.
func inNetworkNamespace(ns string, f func() error) error {
	result := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		handle, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			result <- err
			return
		}
		defer handle.Close()
		if err := unix.Setns(int(handle.Fd()), unix.CLONE_NEWNET); err != nil {
			result <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		result <- f()
	}()
	return <-result
}
