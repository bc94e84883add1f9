package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
)

// adminPKI is a private CA and an admin API certificate it signed for
// 127.0.0.1, written into a temporary directory.
type adminPKI struct {
	tls  config.AdminTLS
	pool *x509.CertPool
}

func newAdminPKI(t *testing.T) adminPKI {
	t.Helper()
	dir := t.TempDir()
	ca, _, err := pki.NewCA("amqp-mirror test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(pki.Request{CommonName: "admin", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usage: pki.Server, ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	a := adminPKI{tls: config.AdminTLS{Cert: filepath.Join(dir, "admin.pem"), Key: filepath.Join(dir, "admin-key.pem")}, pool: x509.NewCertPool()}
	if err := pki.WriteFiles(a.tls.Cert, certPEM, a.tls.Key, keyPEM); err != nil {
		t.Fatal(err)
	}
	a.pool.AddCert(ca.Cert)
	return a
}

func TestAdminTLSConfig(t *testing.T) {
	good := newAdminPKI(t)
	loose := newAdminPKI(t)
	if err := os.Chmod(loose.tls.Key, 0o640); err != nil {
		t.Fatal(err)
	}
	missing := config.AdminTLS{Cert: filepath.Join(t.TempDir(), "none.pem"), Key: filepath.Join(t.TempDir(), "none-key.pem")}
	swapped := config.AdminTLS{Cert: good.tls.Key, Key: good.tls.Cert}
	if err := os.Chmod(good.tls.Cert, 0o600); err != nil { // the cert as a key must pass the permission check
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		files   config.AdminTLS
		wantNil bool
		wantErr []string // fragments of the error; none means no error
	}{
		{name: "unset: plain HTTP", wantNil: true},
		{name: "a pair", files: good.tls},
		{name: "a key group may read", files: loose.tls, wantErr: []string{"listen.admin_tls: ", "permissions 0640 for " + loose.tls.Key + " are too open", "chmod 600"}},
		{name: "missing files", files: missing, wantErr: []string{"listen.admin_tls: ", missing.Key}},
		{name: "cert and key swapped", files: swapped, wantErr: []string{"listen.admin_tls: ", swapped.Cert, swapped.Key}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := adminTLSConfig(tc.files)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("adminTLSConfig succeeded, want an error with %q", tc.wantErr)
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q lacks %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("adminTLSConfig: %v", err)
			}
			if (got == nil) != tc.wantNil {
				t.Fatalf("adminTLSConfig = %v, want nil: %v", got, tc.wantNil)
			}
			if got != nil && got.MinVersion != tls.VersionTLS12 {
				t.Errorf("MinVersion %x, want TLS 1.2", got.MinVersion)
			}
		})
	}
}

// TestRunServesTheAdminAPIOverHTTPS runs a proxy whose backend is down
// with listen.admin_tls: the probes answer over HTTPS without a token
// (/readyz saying why it is not ready), and plain HTTP gets no answer but
// the refusal.
func TestRunServesTheAdminAPIOverHTTPS(t *testing.T) {
	cfg := oneBackendConfig(t)
	cfg.Listen.Admin = "127.0.0.1:0"
	certs := newAdminPKI(t)
	cfg.Listen.AdminTLS = certs.tls
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, Options{Level: new(slog.LevelVar), Logger: slog.New(slog.NewTextHandler(logs, nil))})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	listening := regexp.MustCompile(`msg="admin API listening" addr=(\S+) scheme=https`)
	var addr string
	testutil.Eventually(t, 15*time.Second, func() error {
		m := listening.FindStringSubmatch(logs.String())
		if m == nil {
			return fmt.Errorf("no \"admin API listening\" line with scheme=https yet:\n%s", logs)
		}
		addr = m[1]
		return nil
	})

	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certs.pool, MinVersion: tls.VersionTLS12}}
	t.Cleanup(transport.CloseIdleConnections)
	httpsClient := &http.Client{Transport: transport, Timeout: 5 * time.Second}
	get := func(client *http.Client, url string) (int, string, error) {
		resp, err := client.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}

	if status, body, err := get(httpsClient, "https://"+addr+"/healthz"); err != nil || status != 200 || body != "ok\n" {
		t.Errorf("GET /healthz over HTTPS: %d %q %v, want 200 \"ok\"", status, body, err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		status, body, err := get(httpsClient, "https://"+addr+"/readyz")
		if err != nil || status != 503 || body != "not ready: backend rabbit1, which serves this proxy's clients, is down\n" {
			return fmt.Errorf("GET /readyz over HTTPS: %d %q %v, want 503 naming the backend down", status, body, err)
		}
		return nil
	})

	plain := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	status, body, err := get(plain, "http://"+addr+"/healthz")
	if err != nil || status != http.StatusBadRequest || !strings.Contains(body, "HTTP request to an HTTPS server") {
		t.Errorf("GET /healthz over plain HTTP: %d %q %v, want 400 refusing plain HTTP", status, body, err)
	}

	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certs.pool, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}}, Timeout: 5 * time.Second}
	if _, _, err := get(old, "https://"+addr+"/healthz"); err == nil {
		t.Error("a TLS 1.1 client was served, want TLS 1.2 at least")
	} else if !strings.Contains(err.Error(), "protocol version") {
		t.Errorf("a TLS 1.1 client: %v, want a protocol version alert", err)
	}
}
