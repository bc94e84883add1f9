package config

import (
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
