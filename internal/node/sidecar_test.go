package node

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// TestCheckProtected: gossip or raft beyond loopback without its keys is
// a warning, or with cluster.require_encryption a refusal naming what to
// set; loopback, or both keys, is neither.
func TestCheckProtected(t *testing.T) {
	tlsFiles := config.ClusterTLS{CA: "ca.pem", Cert: "member.pem", Key: "member-key.pem", Identity: config.DefaultClusterIdentity}
	cases := []struct {
		name      string
		bind      string
		encrypt   string
		tls       config.ClusterTLS
		require   bool
		wantError []string // substrings of the refusal; nil: no refusal
		wantWarn  bool
	}{
		{name: "loopback, nothing set", bind: "127.0.0.1:7946"},
		{name: "loopback, required", bind: "127.0.0.1:7946", require: true},
		{name: "open, both set, required", bind: "10.0.0.1:7946", encrypt: "k", tls: tlsFiles, require: true},
		{name: "open, nothing set", bind: "10.0.0.1:7946", wantWarn: true},
		{name: "open, nothing set, required", bind: "10.0.0.1:7946", require: true,
			wantError: []string{"cluster.require_encryption", "cluster.encrypt", "cluster.tls"}},
		{name: "open, only gossip key, required", bind: "10.0.0.1:7946", encrypt: "k", require: true,
			wantError: []string{"raft on 10.0.0.1:7947 is plaintext"}},
		{name: "open, only TLS, required", bind: "10.0.0.1:7946", tls: tlsFiles, require: true,
			wantError: []string{"gossip on 10.0.0.1:7946 is not encrypted"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.StateDir = t.TempDir()
			cfg.Cluster.Bind = tc.bind
			cfg.Cluster.Encrypt = tc.encrypt
			cfg.Cluster.TLS = tc.tls
			cfg.Cluster.RequireEncryption = tc.require
			raftBind, _ := cfg.Cluster.RaftAddresses()
			var log strings.Builder
			err := checkProtected(cfg, raftBind, slog.New(slog.NewTextHandler(io.MultiWriter(&log), nil)))
			switch {
			case tc.wantError == nil && err != nil:
				t.Fatalf("got the refusal %q, want none", err)
			case tc.wantError != nil && err == nil:
				t.Fatalf("got no refusal, want one naming %q", tc.wantError)
			}
			for _, want := range tc.wantError {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q does not name %q", err, want)
				}
			}
			if warned := strings.Contains(log.String(), "NOT protected"); warned != tc.wantWarn {
				t.Errorf("warned: got %v, want %v; log: %s", warned, tc.wantWarn, log.String())
			}
		})
	}
}
