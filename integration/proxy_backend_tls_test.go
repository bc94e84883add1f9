package integration

import (
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// TestProxyDialsTLSBackends: a backend reached over AMQPS (a RabbitMQ node
// of its own with a TLS listener) serves plain clients of the proxy.
func TestProxyDialsTLSBackends(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath, pool := selfSignedPEMFiles(t, dir)
	tlsPort := freePort(t)

	ctx := testContext(t, testutil.StartTimeout)
	cluster, err := localbroker.Start(ctx, localbroker.Options{
		Names:   []string{"tlsnode"},
		BaseDir: filepath.Join(dir, "nodes"),
		ExtraConfig: fmt.Sprintf("listeners.ssl.default = 127.0.0.1:%d\n"+
			"ssl_options.cacertfile = %s\nssl_options.certfile = %s\nssl_options.keyfile = %s\n"+
			"ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n",
			tlsPort, certPath, certPath, keyPath),
	})
	if err != nil {
		t.Fatalf("start a node with a TLS listener: %v", err)
	}
	t.Cleanup(func() { cluster.Close() })

	url, _ := startProxy(t, cluster.Nodes()[0], func(o *proxy.Options) {
		o.Backend.Addr = fmt.Sprintf("127.0.0.1:%d", tlsPort)
		o.Backend.TLS = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	})
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	q, err := ch.QueueDeclare(queueName(t), false, true, false, false, nil)
	if err != nil {
		t.Fatalf("queue.declare through a TLS backend: %v", err)
	}
	if err := ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("via amqps")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	awaitMessage(t, ch, q.Name, "via amqps")
}

// freePort returns a loopback port nothing listens on right now.
func freePort(t testing.TB) int {
	t.Helper()
	return freePorts(t, 1)[0]
}

// freePorts returns n distinct loopback ports nothing listens on right now. They lie below
// the kernel's ephemeral range: a test hands them to a process that binds them seconds
// later, and in the meantime a bind to port 0 anywhere on the machine (a broker's, in
// this or another test binary) never returns them. Each listener stays open until all n
// are picked, so no two are the same.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	const lowest = 10000
	highest := ephemeralLow() - 1
	ports := make([]int, 0, n)
	for attempt := 0; len(ports) < n; attempt++ {
		if attempt == 1000 {
			t.Fatalf("no free port from %d to %d after %d attempts", lowest, highest, attempt)
		}
		port := lowest + rand.IntN(highest-lowest+1)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		defer ln.Close()
		ports = append(ports, port)
	}
	return ports
}

// ephemeralLow is the first port of the kernel's ephemeral range, which binds to port 0
// draw from; Linux's default when the range cannot be read.
func ephemeralLow() int {
	const linuxDefault = 32768
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	fields := strings.Fields(string(raw))
	if len(fields) != 2 {
		return linuxDefault
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil || low <= 10001 {
		return linuxDefault
	}
	return low
}
