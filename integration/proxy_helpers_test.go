package integration

import (
	"fmt"
	"log/slog"
	"net"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/harness"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// startProxy runs a proxy in front of node on a fresh loopback port and
// returns the AMQP URL clients use to reach the node through it. The proxy is
// closed when the test ends.
func startProxy(t testing.TB, n *harness.Node, tweak ...func(*proxy.Options)) (string, *proxy.Server) {
	t.Helper()
	opts := proxy.DefaultOptions(proxy.Backend{Name: n.Name, Addr: fmt.Sprintf("127.0.0.1:%d", n.Port)})
	opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	for _, f := range tweak {
		f(&opts)
	}
	srv, err := proxy.New(opts)
	if err != nil {
		t.Fatalf("proxy.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; err != proxy.ErrServerClosed {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return fmt.Sprintf("amqp://guest:guest@%s/", ln.Addr()), srv
}

// dialURL opens an amqp091-go connection and closes it when the test ends.
func dialURL(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
