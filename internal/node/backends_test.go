package node

import (
	"strings"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
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
			got, err := backendAddress(config.Backend{Name: "rabbit1", URL: tt.url})
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != "rabbit1" || got.Addr != tt.wantAddr {
				t.Errorf("backendAddress(%s) = %s at %s, want rabbit1 at %s", tt.url, got.Name, got.Addr, tt.wantAddr)
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
	_, err := backendAddress(config.Backend{Name: "rabbit1", URL: "amqp://mirror:s3cret@host:port:bad/"})
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
		got, err := proxyBackend(&config.Config{Node: tt.node, Backends: backends})
		if err != nil {
			t.Fatal(err)
		}
		if got.Name != tt.want {
			t.Errorf("node %q: proxyBackend = %s, want %s", tt.node, got.Name, tt.want)
		}
	}
}
