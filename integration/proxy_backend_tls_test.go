package integration

import (
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
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

// freePorts returns n distinct loopback ports nothing listens on right
// now. Each listener stays open until all n are picked: a port freed at
// once can come back from the next pick.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}
