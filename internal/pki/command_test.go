package pki

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommand runs `amqp-mirror tls` as an operator would: an authority,
// then each kind of certificate, then the mistakes.
func TestCommand(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := Main(args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	if code, _, stderr := run("ca", "--dir", dir); code != 0 {
		t.Fatalf("tls ca: exit %d: %s", code, stderr)
	}
	cases := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
		check      func(t *testing.T, cert *x509.Certificate)
	}{
		{name: "member", args: []string{"cert", "member", "node1", "--dir", dir},
			check: func(t *testing.T, c *x509.Certificate) {
				if err := c.VerifyHostname("member.amqp-mirror"); err != nil {
					t.Errorf("a member certificate does not name the identity: %v", err)
				}
				if len(c.ExtKeyUsage) != 2 {
					t.Errorf("a member certificate's usages: got %v, want server and client", c.ExtKeyUsage)
				}
			}},
		{name: "member with another identity", args: []string{"cert", "member", "node2", "--identity", "prod.example", "--dir", dir},
			check: func(t *testing.T, c *x509.Certificate) {
				if err := c.VerifyHostname("prod.example"); err != nil {
					t.Errorf("got %v", err)
				}
			}},
		{name: "server", args: []string{"cert", "server", "admin", "--dns", "proxy1.example", "--ip", "127.0.0.1", "--dir", dir},
			check: func(t *testing.T, c *x509.Certificate) {
				if err := c.VerifyHostname("127.0.0.1"); err != nil {
					t.Errorf("got %v", err)
				}
				if c.VerifyHostname("member.amqp-mirror") == nil {
					t.Errorf("a server certificate names the members' identity")
				}
			}},
		{name: "client", args: []string{"cert", "client", "proxy-account", "--dir", dir},
			check: func(t *testing.T, c *x509.Certificate) {
				if c.Subject.CommonName != "proxy-account" || len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
					t.Errorf("got CN %q, usages %v", c.Subject.CommonName, c.ExtKeyUsage)
				}
			}},
		{name: "never overwrites", args: []string{"cert", "member", "node1", "--dir", dir}, wantCode: 1, wantStderr: "exists"},
		{name: "authority never overwritten", args: []string{"ca", "--dir", dir}, wantCode: 1, wantStderr: "exists"},
		{name: "server without names", args: []string{"cert", "server", "admin2", "--dir", dir}, wantCode: 2, wantStderr: "--dns or --ip"},
		{name: "unknown kind", args: []string{"cert", "peer", "x", "--dir", dir}, wantCode: 2, wantStderr: `kind "peer"`},
		{name: "a path as name", args: []string{"cert", "client", "../x", "--dir", dir}, wantCode: 2, wantStderr: "plain file name"},
		{name: "no authority", args: []string{"cert", "client", "x", "--dir", t.TempDir()}, wantCode: 1, wantStderr: "amqp-mirror tls ca --dir"},
		{name: "bad ip", args: []string{"cert", "server", "s", "--ip", "nowhere", "--dir", dir}, wantCode: 2, wantStderr: `found "nowhere"`},
		{name: "no subcommand", args: nil, wantCode: 2, wantStderr: "Usage:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(tc.args...)
			if code != tc.wantCode || !strings.Contains(stderr, tc.wantStderr) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, stderr, tc.wantCode, tc.wantStderr)
			}
			if tc.check == nil {
				return
			}
			name := tc.args[2]
			pair, err := LoadKeyPair(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem"))
			if err != nil {
				t.Fatal(err)
			}
			pool, err := LoadPool(filepath.Join(dir, CAFileName))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Fatalf("the authority did not sign it: %v", err)
			}
			tc.check(t, pair.Leaf)
		})
	}
	if info, err := os.Stat(filepath.Join(dir, CAKeyFileName)); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("ca-key.pem: got %v, %v; want mode 0600", info.Mode(), err)
	}
}

// TestEnsureClusterKeys: a first run writes the gossip key, the authority
// and the members' certificates; a later run with one more member adds
// only its certificate and keeps the key and the authority.
func TestEnsureClusterKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	wrote, err := EnsureClusterKeys(dir, "first-key", "member.amqp-mirror", []string{"rabbit1", "rabbit2"})
	if err != nil || len(wrote) != 7 {
		t.Fatalf("first run: wrote %v, %v; want the key, the authority's two files and two pairs", wrote, err)
	}
	caBefore, _ := os.ReadFile(filepath.Join(dir, CAFileName))
	wrote, err = EnsureClusterKeys(dir, "second-key", "member.amqp-mirror", []string{"rabbit1", "rabbit2", "rabbit3"})
	if err != nil || len(wrote) != 2 || filepath.Base(wrote[0]) != "rabbit3.pem" {
		t.Fatalf("second run: wrote %v, %v; want rabbit3's pair alone", wrote, err)
	}
	key, err := os.ReadFile(filepath.Join(dir, GossipKeyFileName))
	if err != nil || string(key) != "first-key\n" {
		t.Errorf("gossip key: got %q, %v; want the first run's", key, err)
	}
	if caAfter, _ := os.ReadFile(filepath.Join(dir, CAFileName)); !bytes.Equal(caBefore, caAfter) {
		t.Error("the authority was replaced")
	}
	for _, name := range []string{GossipKeyFileName, CAKeyFileName, "rabbit3-key.pem"} {
		if info, err := os.Stat(filepath.Join(dir, name)); err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", name, info.Mode(), err)
		}
	}
}
