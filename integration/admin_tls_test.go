package integration

// The admin API over HTTPS (listen.admin_tls): serve presents a certificate of a private
// CA, ctl trusts it only when told of the CA, plain HTTP is refused, and the probes answer
// without the admin token.

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
)

// adminCertificates is a private CA and an admin API certificate it issued for
// 127.0.0.1, as files.
type adminCertificates struct {
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
}

func issueAdminCertificates(t *testing.T) adminCertificates {
	t.Helper()
	dir := t.TempDir()
	ca, _, err := pki.NewCA("amqp-mirror admin test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(pki.Request{
		CommonName: "admin", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		Usage: pki.Server, ValidFor: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	c := adminCertificates{caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "admin.pem"), keyFile: filepath.Join(dir, "admin-key.pem"), pool: x509.NewCertPool()}
	if err := pki.WriteFiles(c.certFile, certPEM, c.keyFile, keyPEM); err != nil {
		t.Fatal(err)
	}
	cliWriteFile(t, c.caFile, string(ca.CertPEM))
	c.pool.AddCert(ca.Cert)
	return c
}

// httpGet fetches url with client, with token as the bearer credential unless it is "".
func httpGet(client *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestAdminTLS(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	certs := issueAdminCertificates(t)
	settings := newCLIConfig(t, rabbit)
	settings.AdminTLSCert, settings.AdminTLSKey = certs.certFile, certs.keyFile
	p := cli.serveConfig(t, settings)
	p.requireRecord(t, map[string]string{"msg": "admin API listening", "scheme": "https"})
	if p.token == "" {
		t.Fatal("no admin token found in the proxy's state_dir")
	}
	// Every output of serve and ctl, which must never show the token.
	var outputs []string
	t.Cleanup(func() {
		for _, output := range append(outputs, p.stdout.String(), p.stderr.String()) {
			if strings.Contains(output, p.token) {
				t.Errorf("the admin token appears in an output:\n%s", output)
			}
		}
	})

	t.Run("ctl", func(t *testing.T) {
		tokenEnv := []string{"AMQP_MIRROR_ADMIN_TOKEN=" + p.token}
		steps := []struct {
			name     string
			env      []string
			args     []string // after ctl
			wantCode int
			wantOut  []string
			wantErr  []string
		}{
			{
				name:    "--config finds https, --admin-ca trusts the private CA",
				args:    []string{"list_policies", "--config", p.configPath, "--admin-ca", certs.caFile},
				wantOut: []string{`Listing policies for vhost "/"`, "vhost\tname\tpattern"},
			},
			{
				name:     "without --admin-ca the certificate is not trusted",
				args:     []string{"list_policies", "--config", p.configPath},
				wantCode: 69,
				wantErr:  []string{"the admin API's certificate at https://" + p.adminAddr + " is not trusted", "amqp-mirror admin test CA", "--admin-ca FILE"},
			},
			{
				name:    "an https --admin with --admin-ca, the token from the environment",
				env:     tokenEnv,
				args:    []string{"list_policies", "--admin", "https://" + p.adminAddr, "--admin-ca", certs.caFile},
				wantOut: []string{`Listing policies for vhost "/"`},
			},
			{
				name:     "a plain http --admin is refused",
				env:      tokenEnv,
				args:     []string{"list_policies", "--admin", "http://" + p.adminAddr},
				wantCode: 69,
				wantErr:  []string{"the admin API at http://" + p.adminAddr + " serves HTTPS only"},
			},
		}
		for _, step := range steps {
			t.Run(step.name, func(t *testing.T) {
				r := cli.run(t, step.env, append([]string{"ctl"}, step.args...)...)
				outputs = append(outputs, r.stdout, r.stderr)
				r.check(t, step.wantCode, step.wantOut, step.wantErr, nil)
			})
		}
	})

	t.Run("probes over https without the token", func(t *testing.T) {
		transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certs.pool, MinVersion: tls.VersionTLS12}}
		t.Cleanup(transport.CloseIdleConnections)
		client := &http.Client{Transport: transport, Timeout: 5 * time.Second}
		base := "https://" + p.adminAddr
		if status, body, err := httpGet(client, base+"/healthz", ""); err != nil || status != 200 || body != "ok\n" {
			t.Errorf("GET /healthz: %d %q %v, want 200 \"ok\"", status, body, err)
		}
		// The proxy's probe of its backend may not have answered yet.
		testutil.Eventually(t, 10*time.Second, func() error {
			if status, body, err := httpGet(client, base+"/readyz", ""); err != nil || status != 200 || body != "ok\n" {
				return fmt.Errorf("GET /readyz: %d %q %v, want 200 \"ok\"", status, body, err)
			}
			return nil
		})
		if status, body, err := httpGet(client, base+"/metrics", ""); err != nil || status != 200 || !strings.Contains(body, "amqp_mirror_backend_up") {
			t.Errorf("GET /metrics: %d %v, want 200 with the metrics", status, err)
		}
		if status, _, err := httpGet(client, base+"/api/policies", ""); err != nil || status != 401 {
			t.Errorf("GET /api/policies without the token: %d %v, want 401", status, err)
		}
		if status, _, err := httpGet(client, base+"/api/policies", p.token); err != nil || status != 200 {
			t.Errorf("GET /api/policies with the token: %d %v, want 200", status, err)
		}
	})

	t.Run("plain http is refused", func(t *testing.T) {
		transport := &http.Transport{}
		t.Cleanup(transport.CloseIdleConnections)
		client := &http.Client{Transport: transport, Timeout: 5 * time.Second}
		for _, path := range []string{"/healthz", "/api/policies"} {
			status, body, err := httpGet(client, "http://"+p.adminAddr+path, p.token)
			if err != nil || status != http.StatusBadRequest || !strings.Contains(body, "HTTP request to an HTTPS server") {
				t.Errorf("GET http://…%s: %d %q %v, want 400 refusing plain HTTP", path, status, body, err)
			}
		}
	})

	t.Run("a key file others may read stops serve", func(t *testing.T) {
		loose := filepath.Join(t.TempDir(), "admin-key.pem")
		key, err := os.ReadFile(certs.keyFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(loose, key, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(loose, 0o644); err != nil {
			t.Fatal(err)
		}
		other := newCLIConfig(t, rabbit)
		other.AdminTLSCert, other.AdminTLSKey = certs.certFile, loose
		r := cli.run(t, nil, "serve", "--config", writeCLIConfig(t, other))
		outputs = append(outputs, r.stdout, r.stderr)
		if r.code == 0 {
			t.Fatalf("serve with a loose admin key exited 0, want a refusal:\n%s", r.stderr)
		}
		r.check(t, r.code, nil, []string{"listen.admin_tls: permissions 0644 for " + loose + " are too open", "chmod 600"}, nil)
	})
}
