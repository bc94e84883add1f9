package integration

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// startProxy runs a proxy in front of node on a fresh loopback port and
// returns the AMQP URL clients use to reach the node through it. The proxy is
// closed when the test ends.
func startProxy(t testing.TB, n *localbroker.Node, tweak ...func(*proxy.Options)) (string, *proxy.Server) {
	t.Helper()
	p := serveProxy(t, n, tweak...)
	return p.url, p.srv
}

// runningProxy is a proxy in front of one node, as the error tests use it.
type runningProxy struct {
	url  string // amqp://guest:guest@host:port/
	addr string // host:port, for raw clients
	srv  *proxy.Server

	closeOnce sync.Once
	served    chan error
}

// serveProxy is startProxy with a bounded Close: several tests here exist to
// catch connections that never end, and Close waits for every connection.
func serveProxy(t testing.TB, n *localbroker.Node, tweak ...func(*proxy.Options)) *runningProxy {
	t.Helper()
	opts := proxy.DefaultOptions(proxy.Backend{Name: n.Name, Addr: nodeAddr(n)})
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
	p := &runningProxy{
		url:    amqpURL(ln.Addr().String(), "guest", "guest", "/"),
		addr:   ln.Addr().String(),
		srv:    srv,
		served: make(chan error, 1),
	}
	go func() { p.served <- srv.Serve(ln) }()
	t.Cleanup(func() { p.close(t) })
	return p
}

// close closes the server and waits, boundedly, for Serve to return.
func (p *runningProxy) close(t testing.TB) {
	t.Helper()
	p.closeOnce.Do(func() {
		closed := make(chan struct{})
		go func() {
			p.srv.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(proxyCloseBound):
			t.Errorf("Server.Close did not return within %v: %d connections never ended",
				proxyCloseBound, p.srv.Stats().ConnectionsOpen.Load())
			return
		}
		if err := <-p.served; err != proxy.ErrServerClosed {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
}

// closedBy is the proxy's count of connections that ended for reason.
func (p *runningProxy) closedBy(reason proxy.CloseReason) uint64 {
	return p.srv.Stats().ClosedByReason[reason].Load()
}

// allClosed is a condition for Eventually: every client connection ended.
func (p *runningProxy) allClosed() error {
	if open := p.srv.Stats().ConnectionsOpen.Load(); open != 0 {
		return fmt.Errorf("the proxy counts %d connections open, want 0", open)
	}
	return nil
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
