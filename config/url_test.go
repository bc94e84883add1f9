package config

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	tests := []struct {
		name, raw, want string
	}{
		{"parseable", "amqp://mirror:s3cretpw@127.0.0.1:5681/", "amqp://mirror:xxxxx@127.0.0.1:5681/"},
		{"no password", "amqp://mirror@127.0.0.1/", "amqp://mirror@127.0.0.1/"},
		{"no userinfo", "amqps://h:5671/vhost", "amqps://h:5671/vhost"},
		{"unclosed IPv6 bracket", "amqp://mirror:s3cretpw@[::1/", "amqp://mirror:xxxxx@[::1/"},
		{"@ in the password", "amqp://mirror:s3c@retpw@h/", "amqp://mirror:xxxxx@h/"},
		{"/ in the password, read as a port by url.Parse", "amqp://mirror:12/s3cretpw@h/", "amqp://mirror:xxxxx@h/"},
		{"/ in the password, unparseable", "amqp://mirror:s3c/retpw@h/", "amqp://mirror:xxxxx@h/"},
		{"no scheme", "mirror:s3cretpw@h:5672", "mirror:xxxxx@h:5672"},
		{"bad escape in the password", "amqp://mirror:s3%zzcretpw@h/", "amqp://mirror:xxxxx@h/"},
		{"not a URL", "rabbit1", "rabbit1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := RedactURL(tc.raw); got != tc.want {
				t.Errorf("RedactURL(%q) = %q, want %q", tc.raw, got, tc.want)
			}
		})
	}
}

func TestBackendURLErrors(t *testing.T) {
	const secret = "s3cretpw"
	tests := []struct {
		name string
		url  string
		want string // "" = valid
	}{
		{"valid", "amqp://mirror:" + secret + "@127.0.0.1:5681/", ""},
		{"valid without port", "amqps://mirror:" + secret + "@broker/vhost", ""},
		{"unclosed IPv6 bracket", "amqp://mirror:" + secret + "@[::1/", `found "amqp://mirror:xxxxx@[::1/" (missing ']' in host)`},
		{"unescaped / in the password", "amqp://mirror:" + secret + "/x@h/", `found "amqp://mirror:xxxxx@h/" (a character in the user name or password`},
		{"bad escape in the password", "amqp://mirror:s3%zz" + secret + "@h/", `found "amqp://mirror:xxxxx@h/" (a character in the user name or password`},
		{"wrong scheme", "http://mirror:" + secret + "@h:1/", `found scheme "http" in "http://mirror:xxxxx@h:1/"`},
		{"no host", "amqp://mirror:" + secret + "@/", `expected a URL with a host, found "amqp://mirror:xxxxx@/"`},
		{"port too large", "amqp://mirror:" + secret + "@h:99999/", `expected a port from 1 to 65535, found 99999 in "amqp://mirror:xxxxx@h:99999/"`},
		{"port zero", "amqp://h:0/", "expected a port from 1 to 65535, found 0"},
		{"largest port", "amqp://h:65535/", ""},
		{"empty", "", `backends[0].url: expected an amqp:// or amqps:// URL, found "" (string)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeConfig(t, "backends: [{name: a, url: \""+tc.url+"\"}]\n"), nil)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Load: got %v, want no error", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load succeeded, want an error containing %q", tc.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q\ndoes not contain %q", msg, tc.want)
			}
			if strings.Contains(msg, secret) {
				t.Errorf("error %q shows the password", msg)
			}
			if n := strings.Count(msg, "backends[0].url:"); n != 1 {
				t.Errorf("got %d errors for backends[0].url, want 1: %q", n, msg)
			}
		})
	}
}

func TestBackendLogValueRedacts(t *testing.T) {
	var out bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&out, nil))
	b := Backend{Name: "rabbit1", URL: "amqp://mirror:s3cretpw@[::1/"}
	logger.Info("backend", "backend", b)
	logger.Info("backend " + b.String())
	if strings.Contains(out.String(), "s3cretpw") {
		t.Errorf("log shows the password:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "backend.url=amqp://mirror:xxxxx@[::1/") {
		t.Errorf("log lacks the redacted URL:\n%s", out.String())
	}
}
