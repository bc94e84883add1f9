package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecretValuesNotShown checks that a problem with a key holding a
// secret names the key and what was found without the secret itself.
func TestSecretValuesNotShown(t *testing.T) {
	const backends = "backends: [{name: a, url: \"amqp://h/\"}]\n"
	tests := []struct {
		name   string
		body   string
		secret string   // must not appear in the error
		want   []string // must appear in the error
	}{
		{"admin_token integer", backends + "admin_token: 123456789012\n", "123456789012",
			[]string{"admin_token: expected a non-empty string, found an integer (value not shown: admin_token is a secret)"}},
		{"cluster.encrypt integer", backends + "node: rabbit1\ncluster:\n  bind: 127.0.0.1:7946\n  encrypt: 123456789012\n", "123456789012",
			[]string{"cluster.encrypt: expected a non-empty string, found an integer (value not shown"}},
		{"cluster.encrypt not base64", backends + "node: rabbit1\ncluster:\n  bind: 127.0.0.1:7946\n  encrypt: \"s3cr3t-g0ssip!\"\n", "s3cr3t-g0ssip!",
			[]string{"cluster.encrypt: expected a base64 32-byte key", "not base64"}},
		{"admin_token number", backends + "admin_token: 98765.4321\n", "98765.4321",
			[]string{"admin_token", "found a number (value not shown"}},
		{"admin_token boolean", backends + "admin_token: true\n", "true",
			[]string{"admin_token", "found a boolean (value not shown"}},
		{"admin_token list", backends + "admin_token: [s3cr3t-tok3n]\n", "s3cr3t-tok3n",
			[]string{"admin_token", "found a list of 1 items (value not shown"}},
		{"admin_token mapping", backends + "admin_token: {s3cr3t-tok3n: x}\n", "s3cr3t-tok3n",
			[]string{"admin_token", "found a mapping (value not shown"}},
		{"backend url wrong scheme", "backends: [{name: a, url: \"http://mirror:s3cretpw@h/\"}]\n", "s3cretpw",
			[]string{"backends[0].url", `"http://mirror:xxxxx@h/"`}},
		{"backend url no host", "backends: [{name: a, url: \"amqp://mirror:s3cretpw@/\"}]\n", "s3cretpw",
			[]string{"backends[0].url", `"amqp://mirror:xxxxx@/"`}},
		{"backend url unparseable", "backends: [{name: a, url: \"amqp://mirror:s3cretpw@[::1/\"}]\n", "s3cretpw",
			[]string{"backends[0].url", `"amqp://mirror:xxxxx@[::1/"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeConfig(t, tc.body), nil)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			msg := err.Error()
			if strings.Contains(msg, tc.secret) {
				t.Errorf("error shows the secret %q: %s", tc.secret, msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
		})
	}
}

func TestKind(t *testing.T) {
	tests := []struct {
		v    any
		want string
	}{
		{nil, "nothing (null)"},
		{"", "an empty string"},
		{"x", "a string"},
		{int64(7), "an integer"},
		{1.5, "a number"},
		{false, "a boolean"},
		{[]any{1, 2}, "a list of 2 items"},
		{map[string]any{}, "a mapping"},
	}
	for _, tc := range tests {
		if got := kind(tc.v); got != tc.want {
			t.Errorf("kind(%#v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

// TestEncryptFile: the gossip key can come from a private file, never
// shown in an error, and not beside cluster.encrypt.
func TestEncryptFile(t *testing.T) {
	const cluster = "backends: [{name: rabbit1, url: \"amqp://h/\"}]\nnode: rabbit1\ncluster:\n  bind: 127.0.0.1:7946\n"
	const goodKey = "q8DL7UOHbGf2oBFMs6t0a9x2nUZ1vN3a+3mY1y0Q9y4="
	dir := t.TempDir()
	write := func(name, body string, perm os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), perm); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := write("good.key", goodKey+"\n", 0o600)
	short := write("short.key", "c2hvcnQ=\n", 0o600)
	loose := write("loose.key", goodKey+"\n", 0o644)
	tests := []struct {
		name string
		body string
		want string // "" = loads, with the key of good.key
	}{
		{"file", cluster + "  encrypt_file: " + good + "\n", ""},
		{"short key", cluster + "  encrypt_file: " + short + "\n", "cluster.encrypt_file: expected a base64 32-byte key (amqp-mirror keygen prints one), found a 5-byte key"},
		{"loose permissions", cluster + "  encrypt_file: " + loose + "\n", "too open"},
		{"missing", cluster + "  encrypt_file: " + filepath.Join(dir, "none") + "\n", "no such file"},
		{"both", cluster + "  encrypt_file: " + good + "\n  encrypt: " + goodKey + "\n", "expected cluster.encrypt or cluster.encrypt_file, found both"},
		{"without the cluster", "backends: [{name: a, url: \"amqp://h/\"}]\ncluster:\n  encrypt_file: " + good + "\n", "cluster.encrypt_file: expected cluster.bind to be set too"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(writeConfig(t, tc.body), nil)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if key, err := cfg.Cluster.GossipKey(); err != nil || key != goodKey {
					t.Fatalf("GossipKey: got a key of %d bytes, %v; want the file's", len(key), err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), goodKey) {
				t.Errorf("the error shows the key: %v", err)
			}
		})
	}
}
