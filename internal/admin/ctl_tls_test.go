package admin

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/internal/pki"
)

// tlsFixture is the admin API served over HTTPS with a certificate of a
// private CA for 127.0.0.1, and the files ctl is pointed at.
type tlsFixture struct {
	addr    string // host:port
	caFile  string // the CA's certificate
	cert    string // the server's certificate and key, as listen.admin_tls names them
	key     string
	dir     string
	plainTo string // host:port of the same API over plain HTTP
}

func newTLSFixture(t *testing.T) *tlsFixture {
	t.Helper()
	plain := newFixture(t)
	dir := t.TempDir()
	ca, _, err := pki.NewCA("ctl test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(pki.Request{CommonName: "admin", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usage: pki.Server, ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := &tlsFixture{caFile: filepath.Join(dir, "ca.pem"), cert: filepath.Join(dir, "admin.pem"), key: filepath.Join(dir, "admin-key.pem"), dir: dir,
		plainTo: strings.TrimPrefix(plain.url, "http://")}
	if err := pki.WriteFiles(f.cert, certPEM, f.key, keyPEM); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	pair, err := pki.LoadKeyPair(f.cert, f.key)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(plain.server.Handler())
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	f.addr = strings.TrimPrefix(ts.URL, "https://")
	return f
}

// config writes a proxy's file serving the admin API at f.addr over
// HTTPS, with extra appended to listen.admin_tls (such as ", ca: FILE").
func (f *tlsFixture) config(t *testing.T, name, extra string) string {
	t.Helper()
	path := filepath.Join(f.dir, name)
	body := fmt.Sprintf("listen:\n  admin: %q\n  admin_tls: {cert: %q, key: %q%s}\nadmin_token: %s\nbackends: [{name: a, url: \"amqp://h/\"}]\n",
		f.addr, f.cert, f.key, extra, testToken)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCtlOverHTTPS runs ctl against the admin API over HTTPS: it trusts
// the CA it is told of and nothing else, and says which flag to use when
// the certificate or the scheme is wrong.
func TestCtlOverHTTPS(t *testing.T) {
	f := newTLSFixture(t)
	withCA := f.config(t, "with-ca.yaml", fmt.Sprintf(", ca: %q", f.caFile))
	withoutCA := f.config(t, "without-ca.yaml", "")
	notPEM := filepath.Join(f.dir, "not-a-cert.pem")
	if err := os.WriteFile(notPEM, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := f.addr[strings.LastIndex(f.addr, ":")+1:]
	tests := []struct {
		name       string
		args       []string // after list_policies
		code       int
		wantStderr []string
	}{
		{name: "config's CA", args: []string{"--config", withCA}},
		{name: "--admin-ca beside the config", args: []string{"--config", withoutCA, "--admin-ca", f.caFile}},
		{name: "--admin-ca makes a host:port https", args: []string{"--admin", f.addr, "--admin-ca", f.caFile, "--token", testToken}},
		{name: "an https URL with --admin-ca", args: []string{"--admin", "https://" + f.addr, "--admin-ca", f.caFile, "--token", testToken}},
		{
			name: "no CA: the system's roots do not know it", args: []string{"--config", withoutCA}, code: ExitUnavailable,
			wantStderr: []string{"the admin API's certificate at https://" + f.addr + " is not trusted", `signed by "ctl test CA"`, "--admin-ca FILE"},
		},
		{
			name: "an https URL without a CA", args: []string{"--admin", "https://" + f.addr, "--token", testToken}, code: ExitUnavailable,
			wantStderr: []string{"is not trusted", "--admin-ca FILE"},
		},
		{
			name: "a name the certificate does not carry", args: []string{"--admin", "https://localhost:" + port, "--admin-ca", f.caFile, "--token", testToken}, code: ExitUnavailable,
			wantStderr: []string{"is not valid for localhost: it names 127.0.0.1"},
		},
		{
			name: "plain HTTP to the HTTPS port", args: []string{"--admin", "http://" + f.addr, "--token", testToken}, code: ExitUnavailable,
			wantStderr: []string{"the admin API at http://" + f.addr + " serves HTTPS only", "https://"},
		},
		{
			name: "HTTPS to a plain HTTP port", args: []string{"--admin", f.plainTo, "--admin-ca", f.caFile, "--token", testToken}, code: ExitUnavailable,
			wantStderr: []string{"the admin API at https://" + f.plainTo + " does not speak HTTPS"},
		},
		{
			name: "a missing --admin-ca", args: []string{"--config", withoutCA, "--admin-ca", filepath.Join(f.dir, "none.pem")}, code: ExitUsage,
			wantStderr: []string{"--admin-ca: open " + filepath.Join(f.dir, "none.pem")},
		},
		{
			name: "an --admin-ca without a certificate", args: []string{"--config", withoutCA, "--admin-ca", notPEM}, code: ExitUsage,
			wantStderr: []string{"--admin-ca: " + notPEM + ": no PEM certificate found"},
		},
	}
	noEnv := func(string) string { return "" }
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Main(append([]string{"list_policies"}, tc.args...), noEnv, &out, &errOut)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d; stderr %q", code, tc.code, errOut.String())
			}
			if tc.code == 0 && !strings.Contains(out.String(), "from-file") {
				t.Errorf("stdout lacks the file policy:\n%s", out.String())
			}
			for _, want := range tc.wantStderr {
				if !strings.Contains(errOut.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
				}
			}
			if strings.Contains(out.String()+errOut.String(), testToken) {
				t.Errorf("the output shows the token:\n%s%s", out.String(), errOut.String())
			}
		})
	}
}
