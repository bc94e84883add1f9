package config

import (
	"path/filepath"
	"strings"
	"testing"
)

// tlsBackends is a config whose second backend is amqps:// with the
// given tls mapping, and whose first is plain amqp://.
func tlsBackends(tls string) string {
	return `
backends:
  - name: rabbit1
    url: amqp://mirror:secret@127.0.0.1:5681/
  - name: rabbit2
    url: amqps://mirror:secret@127.0.0.1:5682/
    tls: ` + tls + "\n"
}

func TestLoadBackendTLS(t *testing.T) {
	tests := []struct {
		name string
		tls  string
		want func(dir string) BackendTLS
	}{
		{
			name: "relative files are relative to the config file",
			tls:  "{ca: ca.pem, cert: certs/client.pem, key: certs/client.key, server_name: broker.internal}",
			want: func(dir string) BackendTLS {
				return BackendTLS{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "certs/client.pem"),
					Key: filepath.Join(dir, "certs/client.key"), ServerName: "broker.internal"}
			},
		},
		{
			name: "absolute files are kept",
			tls:  "{ca: /etc/ssl/private-ca.pem}",
			want: func(string) BackendTLS { return BackendTLS{CA: "/etc/ssl/private-ca.pem"} },
		},
		{
			name: "a client certificate without a private CA",
			tls:  "{cert: /c.pem, key: /c.key}",
			want: func(string) BackendTLS { return BackendTLS{Cert: "/c.pem", Key: "/c.key"} },
		},
		{
			name: "only the name checked",
			tls:  "{server_name: 10.0.0.5}",
			want: func(string) BackendTLS { return BackendTLS{ServerName: "10.0.0.5"} },
		},
		{
			name: "empty strings leave keys unset",
			tls:  `{ca: "", cert: "", key: "", server_name: ""}`,
			want: func(string) BackendTLS { return BackendTLS{} },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tlsBackends(tc.tls))
			c, err := Load(path, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got, want := c.Backends[1].TLS, tc.want(filepath.Dir(path)); got != want {
				t.Errorf("backends[1].tls: got %+v, want %+v", got, want)
			}
			if got := c.Backends[0].TLS; !got.IsZero() {
				t.Errorf("backends[0].tls: got %+v, want none", got)
			}
		})
	}
}

func TestLoadBackendTLSValidation(t *testing.T) {
	tests := []struct {
		name string
		body string
		path string // key path the error must name
		want string // expectation the error must state
	}{
		{"cert without key", tlsBackends("{cert: c.pem}"), "backends[1].tls.key", "expected the key file of backends[1].tls.cert, found none"},
		{"key without cert", tlsBackends("{ca: ca.pem, key: c.key}"), "backends[1].tls.cert", "expected the certificate file that goes with backends[1].tls.key, found none"},
		{"unknown key", tlsBackends("{ca: ca.pem, cacert: x.pem}"), "backends[1].tls.cacert", "unknown key; expected one of the backend tls keys: [ca cert key server_name]"},
		{"not a mapping", tlsBackends("true"), "backends[1].tls", "expected a mapping with keys [ca cert key server_name], found true (boolean)"},
		{"file not a string", tlsBackends("{ca: [a.pem, b.pem]}"), "backends[1].tls.ca", "expected a PEM file of CA certificates, found a list of 2 items"},
		{"null file", tlsBackends("{key: null, cert: c.pem}"), "backends[1].tls.key", "expected a PEM key file, found nothing (null)"},
		{"server_name with a port", tlsBackends("{server_name: \"broker:5671\"}"), "backends[1].tls.server_name", "without port or scheme, found \"broker:5671\""},
		{"server_name not a string", tlsBackends("{server_name: 5}"), "backends[1].tls.server_name", "expected a host name or IP address, found 5 (integer)"},
		{"ca on amqp://", "backends: [{name: a, url: \"amqp://h/\", tls: {ca: ca.pem}}]\n", "backends[0].tls.ca", "expected backends[0].url to be an amqps:// URL for a TLS setting, found scheme \"amqp\""},
		{"server_name on amqp://", "backends: [{name: a, url: \"amqp://h/\", tls: {server_name: h}}]\n", "backends[0].tls.server_name", "amqps:// URL for a TLS setting"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.body)
			_, err := Load(path, nil)
			if err == nil {
				t.Fatalf("Load succeeded, want an error at %s", tc.path)
			}
			msg := err.Error()
			for _, want := range []string{"config file " + path + ": " + tc.path + ": ", tc.want} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q\ndoes not contain %q", msg, want)
				}
			}
		})
	}
}

// Every tls key on a plain backend is named, not only the first, so that
// one run shows the operator all there is to fix.
func TestLoadBackendTLSOnPlainURLNamesEveryKey(t *testing.T) {
	path := writeConfig(t, "backends: [{name: a, url: \"amqp://h/\", tls: {ca: a, cert: b, key: c}}]\n")
	_, err := Load(path, nil)
	if err == nil {
		t.Fatal("Load succeeded, want errors")
	}
	for _, key := range []string{"backends[0].tls.ca: ", "backends[0].tls.cert: ", "backends[0].tls.key: "} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error %q\ndoes not name %s", err, key)
		}
	}
}
