package controllink

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

func TestPlainURL(t *testing.T) {
	pinned := &tls.Config{ServerName: "rabbit.example", MinVersion: tls.VersionTLS13}
	tests := []struct {
		name           string
		backend        Backend
		wantURL        string
		wantTLS        bool
		wantServerName string
	}{
		{
			name:    "amqp is dialled as it is",
			backend: Backend{URL: "amqp://u:p@host:5672/vh?heartbeat=5"},
			wantURL: "amqp://u:p@host:5672/vh?heartbeat=5",
		},
		{
			name:           "amqps without a port gets 5671 and the host's name",
			backend:        Backend{URL: "amqps://u:p@host/vh?auth_mechanism=external"},
			wantURL:        "amqp://u:p@host:5671/vh?auth_mechanism=external",
			wantTLS:        true,
			wantServerName: "host",
		},
		{
			name:           "amqps keeps its port and the configured server name",
			backend:        Backend{URL: "amqps://u:p@10.0.0.1:5999/", TLS: pinned},
			wantURL:        "amqp://u:p@10.0.0.1:5999/",
			wantTLS:        true,
			wantServerName: "rabbit.example",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, config, err := plainURL(tt.backend)
			if err != nil {
				t.Fatal(err)
			}
			if url != tt.wantURL {
				t.Errorf("url = %q, want %q", url, tt.wantURL)
			}
			if got := config != nil; got != tt.wantTLS {
				t.Fatalf("TLS configured = %v, want %v", got, tt.wantTLS)
			}
			if config != nil && config.ServerName != tt.wantServerName {
				t.Errorf("ServerName = %q, want %q", config.ServerName, tt.wantServerName)
			}
		})
	}
	if pinned.ServerName != "rabbit.example" || pinned.MinVersion != tls.VersionTLS13 {
		t.Errorf("the backend's own TLS config was changed: %+v", pinned)
	}
}

// TestWatcherOverTLS: over AMQPS the watcher sets TLS up beneath the socket
// it reads, so that it still sees the broker's connection.close in clear.
func TestWatcherOverTLS(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath, pool := selfSignedPEMFiles(t, dir)
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.StartTimeout)
	defer cancel()
	cluster, err := localbroker.Start(ctx, localbroker.Options{
		Names:   []string{"controllink-tls"},
		BaseDir: filepath.Join(dir, "nodes"),
		ExtraConfig: fmt.Sprintf("listeners.ssl.default = 127.0.0.1:%d\n"+
			"ssl_options.cacertfile = %s\nssl_options.certfile = %s\nssl_options.keyfile = %s\n"+
			"ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n",
			port, certPath, certPath, keyPath),
	})
	if err != nil {
		t.Fatalf("starting a node with a TLS listener: %v", err)
	}
	t.Cleanup(func() { cluster.Close() })
	node := cluster.Nodes()[0]
	url := fmt.Sprintf("amqps://guest:guest@127.0.0.1:%d/", port)

	t.Run("a certificate the watcher does not trust is refused", func(t *testing.T) {
		w := NewWatcher([]Backend{{Name: "rabbit1", URL: url}}, WatcherOptions{Grace: testGrace, Logger: quietLogger()})
		defer w.Close()
		ev := expectEvent(t, w, 10*time.Second, Down, CauseLost)
		var unknown x509.UnknownAuthorityError
		if !errors.As(ev.Err, &unknown) {
			t.Errorf("down event's error = %v, want the unknown certificate authority", ev.Err)
		}
	})

	t.Run("a clean stop is a shutdown", func(t *testing.T) {
		// No ServerName: the URL's host, an IP address the certificate
		// names, is checked.
		backend := Backend{Name: "rabbit1", URL: url, TLS: &tls.Config{RootCAs: pool}}
		w := NewWatcher([]Backend{backend}, WatcherOptions{Grace: testGrace, Logger: quietLogger()})
		defer w.Close()
		expectEvent(t, w, 10*time.Second, Up, CauseNone)
		// A second connection dialled as the watcher dials, to look at
		// what its observer read.
		conn, observed, err := w.dial(backend, "test")
		if err != nil {
			t.Fatalf("dialling as the watcher does: %v", err)
		}
		defer conn.Close()
		writeUntilClosed(t, w)
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := node.Stop(stopCtx); err != nil {
			t.Fatal(err)
		}
		ev := expectEvent(t, w, 35*time.Second, Down, CauseShutdown)
		t.Logf("down: %v", ev.Err)
		testutil.Eventually(t, 5*time.Second, func() error {
			if got := observed.BrokerClose(); got == nil || got.ReplyCode != frames.ConnectionForced {
				return fmt.Errorf("the observer above TLS read the broker's close as %+v, want 320", got)
			}
			return nil
		})
	})
}

// selfSignedPEMFiles writes a certificate for 127.0.0.1 and its key where
// RabbitMQ can read them, and returns a pool that trusts the certificate.
func selfSignedPEMFiles(t *testing.T, dir string) (certPath, keyPath string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true,

		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for path, block := range map[string]*pem.Block{
		certPath: {Type: "CERTIFICATE", Bytes: der},
		keyPath:  {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		// The node runs as root here, as every node of the tests.
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certPath, keyPath, pool
}

// freePort returns a loopback port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
