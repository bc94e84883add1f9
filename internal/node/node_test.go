package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// syncBuffer is a log that the test reads while Run writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// closedPort is an address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	return closedPorts(t, 1)[0]
}

// closedPorts are n distinct addresses nothing listens on. Each listener
// stays open until all n are picked: a port freed at once can come back
// from the next pick, and two listeners of one Run on the same port fail
// it.
func closedPorts(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// oneBackendConfig is a drop-in proxy in front of one backend that is
// down, listening on a free loopback port, without the admin API.
func oneBackendConfig(t *testing.T) *config.Config {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "amqp-mirror.yaml")
	yaml := fmt.Sprintf("listen:\n  amqp: 127.0.0.1:5672\n  admin: \"\"\nstate_dir: %s\nshutdown_timeout: 2s\nbackends:\n  - name: rabbit1\n    url: amqp://guest:guest@%s/\n",
		filepath.Join(dir, "state"), closedPort(t))
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen.AMQP = "127.0.0.1:0" // the file wants a fixed port
	return cfg
}

// Run accepts clients once Ready is called, reloads the file on each
// value of the reload channel, and when ctx ends stops accepting, stops
// relaying reloads and returns nil.
func TestRunServesReloadsAndStops(t *testing.T) {
	cfg := oneBackendConfig(t)
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	ready := make(chan string, 1)
	reloads := make(chan chan<- os.Signal, 1)
	stopped := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, Options{
			Level:  new(slog.LevelVar),
			Logger: logger,
			Ready:  func(addr string) { ready <- addr },
			NotifyReload: func(reload chan<- os.Signal) func() {
				reloads <- reload
				return func() { close(stopped) }
			},
		})
	}()

	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("Run returned before it was ready: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("Run not ready within 15s")
	}
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("dialing the proxy at %s once ready: %v", addr, err)
	}
	conn.Close()

	(<-reloads) <- os.Interrupt
	testutil.Eventually(t, 5*time.Second, func() error {
		if !strings.Contains(logs.String(), "reloading the config file") {
			return fmt.Errorf("no reload in the log:\n%s", logs.String())
		}
		return nil
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after ctx ended = %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15s of ctx ending")
	}
	select {
	case <-stopped:
	default:
		t.Error("Run returned without stopping the reload relay")
	}
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Errorf("the proxy still accepts at %s after Run returned", addr)
	}
}

// A listener that cannot start fails Run at once, with the key to fix,
// and leaves no port of it open.
func TestRunRefusesAMissingCertificate(t *testing.T) {
	cfg := oneBackendConfig(t)
	ports := closedPorts(t, 2)
	cfg.Listen.AMQP, cfg.Listen.AMQPS = ports[0], ports[1]
	cfg.Listen.TLS = config.TLS{Cert: filepath.Join(t.TempDir(), "missing.pem"), Key: filepath.Join(t.TempDir(), "missing.key")}
	err := Run(context.Background(), cfg, Options{Level: new(slog.LevelVar), Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.HasPrefix(err.Error(), "listen.tls:") {
		t.Fatalf("Run with a missing certificate = %v, want a listen.tls error", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen.AMQP)
	if err != nil {
		t.Fatalf("listen.amqp's port stays taken after the failure: %v", err)
	}
	ln.Close()
}
