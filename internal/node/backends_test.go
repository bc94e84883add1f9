package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

func TestBackendAddress(t *testing.T) {
	tests := []struct {
		name     string
		url      string
		wantAddr string
		wantTLS  string // the ServerName checked, "" for none
	}{
		{name: "amqp defaults to 5672", url: "amqp://u:p@broker.example", wantAddr: "broker.example:5672"},
		{name: "amqps defaults to 5671 and checks the host", url: "amqps://u:p@broker.example/vh", wantAddr: "broker.example:5671", wantTLS: "broker.example"},
		{name: "a port given is kept", url: "amqp://u:p@127.0.0.1:5681/", wantAddr: "127.0.0.1:5681"},
		{name: "an IPv6 host gets brackets", url: "amqp://[::1]", wantAddr: "[::1]:5672"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := loadHome(t, &config.Config{Backends: []config.Backend{{Name: "rabbit1", URL: tt.url}}})
			if got.Name != "rabbit1" || got.Addr != tt.wantAddr {
				t.Errorf("proxyHome(%s) = %s at %s, want rabbit1 at %s", tt.url, got.Name, got.Addr, tt.wantAddr)
			}
			gotTLS := ""
			if got.TLS != nil {
				gotTLS = got.TLS.ServerName
			}
			if gotTLS != tt.wantTLS {
				t.Errorf("TLS server name %q, want %q", gotTLS, tt.wantTLS)
			}
		})
	}
}

// url.Error quotes the whole URL; the proxy's account must not reach the log.
func TestBackendAddressErrorHidesThePassword(t *testing.T) {
	_, err := loadBackends(&config.Config{Backends: []config.Backend{{Name: "rabbit1", URL: "amqps://mirror:s3cret@host:port:bad/"}}})
	if err == nil {
		t.Fatal("no error for an unparsable URL")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error shows the password: %v", err)
	}
}

func TestProxyBackendIsTheNodeBesideTheProxy(t *testing.T) {
	backends := []config.Backend{{Name: "rabbit1", URL: "amqp://h1"}, {Name: "rabbit2", URL: "amqp://h2"}}
	tests := []struct{ node, want string }{
		{node: "rabbit2", want: "rabbit2"},
		{node: "", want: "rabbit1"},
		{node: "elsewhere", want: "rabbit1"},
	}
	for _, tt := range tests {
		if got := loadHome(t, &config.Config{Node: tt.node, Backends: backends}); got.Name != tt.want {
			t.Errorf("node %q: proxyHome = %s, want %s", tt.node, got.Name, tt.want)
		}
	}
}

// tlsFiles are PEM files of one authority (a server certificate for
// 127.0.0.1, client certificates), a second authority's certificate, and
// files that are wrong in the ways an operator's can be.
type tlsFiles struct {
	ca, otherCA                   string
	serverCert, serverKey         string
	clientCert, clientKey         string
	serverOnlyCert, serverOnlyKey string // a certificate that may not authenticate a client
	looseKey                      string // clientKey's content, readable by everyone
	missing, notPEM               string
	caPool                        *x509.CertPool
}

func newTLSFiles(t *testing.T) tlsFiles {
	t.Helper()
	dir := t.TempDir()
	f := tlsFiles{missing: filepath.Join(dir, "missing.pem"), notPEM: filepath.Join(dir, "not.pem")}
	ca, _, err := pki.NewCA("backend test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := pki.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f.ca, f.otherCA = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "other-ca.pem")
	writeFile(t, f.ca, ca.CertPEM, 0o644)
	writeFile(t, f.otherCA, other.CertPEM, 0o644)
	writeFile(t, f.notPEM, []byte("not a certificate\n"), 0o644)
	issue := func(name string, req pki.Request) (string, string) {
		t.Helper()
		certPEM, keyPEM, err := ca.Issue(req)
		if err != nil {
			t.Fatal(err)
		}
		cert, key := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		if err := pki.WriteFiles(cert, certPEM, key, keyPEM); err != nil {
			t.Fatal(err)
		}
		return cert, key
	}
	f.serverCert, f.serverKey = issue("server", pki.Request{CommonName: "broker", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usage: pki.Server, ValidFor: time.Hour})
	f.clientCert, f.clientKey = issue("client", pki.Request{CommonName: "amqp-mirror", Usage: pki.Client, ValidFor: time.Hour})
	f.serverOnlyCert, f.serverOnlyKey = issue("server-only", pki.Request{CommonName: "not a client", Usage: pki.Server, ValidFor: time.Hour})
	key, err := os.ReadFile(f.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	f.looseKey = filepath.Join(dir, "loose-key.pem")
	writeFile(t, f.looseKey, key, 0o644)
	f.caPool = x509.NewCertPool()
	f.caPool.AddCert(ca.Cert)
	return f
}

func writeFile(t *testing.T, path string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil { // past the umask
		t.Fatal(err)
	}
}

func loadHome(t *testing.T, cfg *config.Config) proxy.Backend {
	t.Helper()
	bs, err := loadBackends(cfg)
	if err != nil {
		t.Fatal(err)
	}
	home, err := bs.proxyHome()
	if err != nil {
		t.Fatal(err)
	}
	return home
}

func TestBackendTLS(t *testing.T) {
	f := newTLSFiles(t)
	tests := []struct {
		name           string
		url            string
		tls            config.BackendTLS
		wantNil        bool
		wantServerName string
		wantRoots      bool // RootCAs is the private authority
		wantClientCert bool
	}{
		{name: "amqp has none", url: "amqp://h/", wantNil: true},
		{name: "amqps alone checks the URL's host against the system's roots", url: "amqps://broker.example/", wantServerName: "broker.example"},
		{name: "server_name replaces the host", url: "amqps://10.0.0.5/", tls: config.BackendTLS{ServerName: "rabbit2.internal"}, wantServerName: "rabbit2.internal"},
		{name: "ca replaces the system's roots", url: "amqps://127.0.0.1:5671/", tls: config.BackendTLS{CA: f.ca}, wantServerName: "127.0.0.1", wantRoots: true},
		{name: "a client certificate", url: "amqps://h/", tls: config.BackendTLS{Cert: f.clientCert, Key: f.clientKey}, wantServerName: "h", wantClientCert: true},
		{name: "everything", url: "amqps://h/", tls: config.BackendTLS{CA: f.ca, Cert: f.clientCert, Key: f.clientKey, ServerName: "n"}, wantServerName: "n", wantRoots: true, wantClientCert: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := backendTLS(0, config.Backend{Name: "rabbit1", URL: tc.url, TLS: tc.tls})
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantNil {
				if got != nil {
					t.Errorf("got a TLS configuration for %s, want none", tc.url)
				}
				return
			}
			if got.ServerName != tc.wantServerName {
				t.Errorf("ServerName: got %q, want %q", got.ServerName, tc.wantServerName)
			}
			if got.MinVersion != tls.VersionTLS12 {
				t.Errorf("MinVersion: got %x, want TLS 1.2", got.MinVersion)
			}
			if gotRoots := got.RootCAs != nil && got.RootCAs.Equal(f.caPool); gotRoots != tc.wantRoots {
				t.Errorf("RootCAs is the private authority: got %v, want %v", gotRoots, tc.wantRoots)
			}
			if gotCert := len(got.Certificates) == 1; gotCert != tc.wantClientCert {
				t.Errorf("client certificate: got %d, want one: %v", len(got.Certificates), tc.wantClientCert)
			}
		})
	}
}

// A file that cannot be used stops the start with the backend's name and
// the key that names the file.
func TestBackendTLSRefusesBadFiles(t *testing.T) {
	f := newTLSFiles(t)
	tests := []struct {
		name string
		tls  config.BackendTLS
		want []string
	}{
		{"ca missing", config.BackendTLS{CA: f.missing}, []string{"backend rabbit2: backends[1].tls.ca: ", f.missing, "no such file"}},
		{"ca not PEM", config.BackendTLS{CA: f.notPEM}, []string{"backends[1].tls.ca: ", f.notPEM, "no PEM certificate found"}},
		{"cert missing", config.BackendTLS{Cert: f.missing, Key: f.clientKey}, []string{"backend rabbit2: backends[1].tls.cert: ", f.missing, "no such file"}},
		{"key missing", config.BackendTLS{Cert: f.clientCert, Key: f.missing}, []string{"backend rabbit2: backends[1].tls.key: ", f.missing, "no such file"}},
		{"key readable by others", config.BackendTLS{Cert: f.clientCert, Key: f.looseKey}, []string{"backend rabbit2: backends[1].tls.key: ", "permissions 0644 for " + f.looseKey + " are too open"}},
		{"key of another certificate", config.BackendTLS{Cert: f.clientCert, Key: f.serverKey}, []string{"backend rabbit2: backends[1].tls.cert and tls.key: ", "private key does not match public key"}},
		{"a server's certificate", config.BackendTLS{Cert: f.serverOnlyCert, Key: f.serverOnlyKey}, []string{"backends[1].tls.cert: ", f.serverOnlyCert + " is not a client certificate"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &config.Config{Backends: []config.Backend{
				{Name: "rabbit1", URL: "amqp://h1/"},
				{Name: "rabbit2", URL: "amqps://mirror:s3cret@h2/", TLS: tc.tls},
			}}
			_, err := loadBackends(cfg)
			if err == nil {
				t.Fatalf("loadBackends succeeded, want an error naming %q", tc.want)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q\ndoes not contain %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

// Every connection to a backend uses the one configuration: the clients'
// links (home or other) and the proxy's own (the watcher, and the
// engine's trimmers and syncs, which take the watcher's backends).
func TestEveryConnectionSharesTheBackendsTLS(t *testing.T) {
	f := newTLSFiles(t)
	cfg := &config.Config{Node: "rabbit2", Backends: []config.Backend{
		{Name: "rabbit1", URL: "amqps://h1/", TLS: config.BackendTLS{CA: f.ca}},
		{Name: "rabbit2", URL: "amqps://h2/", TLS: config.BackendTLS{CA: f.ca, Cert: f.clientCert, Key: f.clientKey}},
		{Name: "rabbit3", URL: "amqp://h3/"},
	}}
	bs, err := loadBackends(cfg)
	if err != nil {
		t.Fatal(err)
	}
	clients := map[string]*tls.Config{}
	home, err := bs.proxyHome()
	if err != nil {
		t.Fatal(err)
	}
	clients[home.Name] = home.TLS
	others, err := bs.proxyOthers()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range others {
		clients[o.Name] = o.TLS
	}
	watched := bs.watched()
	if len(clients) != 3 || len(watched) != 3 {
		t.Fatalf("got %d client backends and %d watched, want 3 of each", len(clients), len(watched))
	}
	for _, w := range watched {
		if clients[w.Name] != w.TLS {
			t.Errorf("backend %s: the clients' links and the proxy's own connections have different TLS configurations", w.Name)
		}
		if (w.TLS == nil) != (w.Name == "rabbit3") {
			t.Errorf("backend %s: TLS configuration %v, want one exactly for amqps://", w.Name, w.TLS != nil)
		}
	}
}

// The configuration meets a broker that asks for a client certificate of
// its authority (verify_peer, fail_if_no_peer_cert) and refuses a broker
// whose certificate another authority signed.
func TestBackendTLSHandshake(t *testing.T) {
	f := newTLSFiles(t)
	serverPair, err := tls.LoadX509KeyPair(f.serverCert, f.serverKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{serverPair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    f.caPool,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			// The handshake, then one byte back, so the client sees a
			// refusal of its certificate (TLS 1.3 sends it after the
			// client's handshake has returned).
			if conn.(*tls.Conn).Handshake() == nil {
				conn.Write([]byte{1})
			}
			conn.Close()
		}
	}()
	url := "amqps://" + ln.Addr().String() + "/"
	tests := []struct {
		name    string
		tls     config.BackendTLS
		wantErr string // "" for a handshake that succeeds
	}{
		{"the CA and a client certificate", config.BackendTLS{CA: f.ca, Cert: f.clientCert, Key: f.clientKey}, ""},
		{"no client certificate", config.BackendTLS{CA: f.ca}, "certificate required"},
		{"another CA", config.BackendTLS{CA: f.otherCA, Cert: f.clientCert, Key: f.clientKey}, "certificate signed by unknown authority"},
		{"the system's roots", config.BackendTLS{Cert: f.clientCert, Key: f.clientKey}, "certificate signed by unknown authority"},
		{"a name the certificate lacks", config.BackendTLS{CA: f.ca, Cert: f.clientCert, Key: f.clientKey, ServerName: "elsewhere.example"}, "wanted to match elsewhere.example"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := backendTLS(0, config.Backend{Name: "rabbit1", URL: url, TLS: tc.tls})
			if err != nil {
				t.Fatal(err)
			}
			err = roundTrip(ln.Addr().String(), c)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("handshake: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("handshake: got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// roundTrip completes a handshake and reads the server's byte.
func roundTrip(addr string, c *tls.Config) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, c)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(conn, make([]byte, 1))
	if errors.Is(err, io.EOF) {
		return errors.New("closed without a byte")
	}
	return err
}
