package admin

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeTokenFile(t *testing.T, content string, perm os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTokenResolutionOrder checks that --token wins over --token-file,
// which wins over the environment, which wins over the config.
func TestTokenResolutionOrder(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "amqp-mirror.yaml")
	body := "admin_token: from-config\nbackends: [{name: a, url: \"amqp://h/\"}]\n"
	if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "admin.token"), []byte("from-state-dir\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stateCfg := filepath.Join(dir, "state.yaml")
	if err := os.WriteFile(stateCfg, []byte("state_dir: state\nbackends: [{name: a, url: \"amqp://h/\"}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := writeTokenFile(t, "  from-file\n\n", 0o600)
	env := func(v string) func(string) string {
		return func(name string) string {
			if name == TokenEnv {
				return v
			}
			return ""
		}
	}
	tests := []struct {
		name string
		conn connection
		env  string
		want string
	}{
		{"--token first", connection{token: "from-flag", tokenFile: file, configPath: cfgPath}, "from-env", "from-flag"},
		{"--token-file before the environment", connection{tokenFile: file, configPath: cfgPath}, "from-env", "from-file"},
		{"environment before the config", connection{configPath: stateCfg}, "from-env", "from-env"},
		{"config's admin_token", connection{configPath: cfgPath}, "", "from-config"},
		{"config's state_dir/admin.token", connection{configPath: stateCfg}, "", "from-state-dir"},
		{"none", connection{}, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, code, err := tc.conn.client(env(tc.env), true)
			if err != nil {
				t.Fatalf("client: %v (exit %d)", err, code)
			}
			if c.Token != tc.want {
				t.Errorf("token: got %q, want %q", c.Token, tc.want)
			}
		})
	}
}

func TestReadTokenFile(t *testing.T) {
	t.Run("trimmed", func(t *testing.T) {
		got, err := readTokenFile(writeTokenFile(t, "\t s3cr3t \n", 0o600))
		if err != nil || got != "s3cr3t" {
			t.Errorf("got %q, %v; want s3cr3t", got, err)
		}
	})
	t.Run("owner read-only", func(t *testing.T) {
		if _, err := readTokenFile(writeTokenFile(t, "s3cr3t", 0o400)); err != nil {
			t.Errorf("got %v, want no error", err)
		}
	})
	for _, perm := range []os.FileMode{0o644, 0o640, 0o604, 0o620, 0o602} {
		t.Run("too open "+perm.String(), func(t *testing.T) {
			path := writeTokenFile(t, "s3cr3t", perm)
			_, err := readTokenFile(path)
			want := "permissions " + octal(perm) + " for " + path + " are too open"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("got %v, want an error containing %q", err, want)
			}
			if err != nil && strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "none")
		_, err := readTokenFile(path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "--token-file") {
			t.Errorf("got %v, want an error naming --token-file and %s", err, path)
		}
	})
	t.Run("empty", func(t *testing.T) {
		path := writeTokenFile(t, " \n", 0o600)
		_, err := readTokenFile(path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "empty") {
			t.Errorf("got %v, want an empty-file error naming %s", err, path)
		}
	})
	t.Run("directory", func(t *testing.T) {
		path := t.TempDir()
		if err := os.Chmod(path, 0o700); err != nil {
			t.Fatal(err)
		}
		_, err := readTokenFile(path)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("got %v, want an error naming %s", err, path)
		}
	})
}

const anyFailure = -1

func octal(perm os.FileMode) string {
	const digits = "01234567"
	p := uint32(perm.Perm())
	return string([]byte{'0', digits[p>>6&7], digits[p>>3&7], digits[p&7]})
}

// TestCtlNeverPrintsTheToken runs ctl the ways that fail (a wrong token,
// an unreachable admin API, a refused token file, a bad config, a token
// the HTTP client refuses) and checks that the token appears nowhere in
// what ctl prints.
func TestCtlNeverPrintsTheToken(t *testing.T) {
	f := newFixture(t)
	admin := strings.TrimPrefix(f.url, "http://")
	const secret = "tok-5ecr3t-0123456789"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	badCfg := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badCfg, []byte("admin_token: 123456789012\nbackends: [{name: a, url: \"amqp://h/\"}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	openFile := writeTokenFile(t, secret+"\n", 0o644)
	goodFile := writeTokenFile(t, secret+"\n", 0o600)
	tests := []struct {
		name   string
		args   []string
		env    string
		secret string
		code   int // anyFailure: any code but ExitOK
	}{
		{"wrong --token", []string{"list_policies", "--admin", admin, "--token", secret}, "", secret, ExitNoPerm},
		{"wrong --token-file", []string{"list_policies", "--admin", admin, "--token-file", goodFile}, "", secret, ExitNoPerm},
		{"wrong environment token", []string{"list_policies", "--admin", admin}, secret, secret, ExitNoPerm},
		{"wrong token, set_policy", []string{"set_policy", "--admin", admin, "--token", secret, "p", "^x", `{"ha-mode":"all"}`}, "", secret, ExitNoPerm},
		{"unreachable admin API", []string{"list_queues", "--admin", closed, "--token", secret}, "", secret, ExitUnavailable},
		{"token file too open", []string{"list_policies", "--admin", admin, "--token-file", openFile}, "", secret, ExitNoPerm},
		{"numeric admin_token in the config", []string{"list_policies", "--config", badCfg}, "", "123456789012", ExitUsage},
		{"token the HTTP client refuses", []string{"list_policies", "--admin", admin, "--token", secret + "\n" + secret}, "", secret, anyFailure},
		{"usage error", []string{"list_policies", "extra", "--token", secret}, "", secret, ExitUsage},
		{"--help", []string{"list_policies", "--token", secret, "--help"}, "", secret, ExitOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(name string) string {
				if name == TokenEnv {
					return tc.env
				}
				return ""
			}
			var out, errOut bytes.Buffer
			code := Main(tc.args, getenv, &out, &errOut)
			if code != tc.code && (tc.code != anyFailure || code == ExitOK) {
				t.Errorf("exit code: got %d, want %d; stderr %q", code, tc.code, errOut.String())
			}
			if errOut.Len() == 0 && out.Len() == 0 {
				t.Errorf("ctl printed nothing")
			}
			for name, s := range map[string]string{"stdout": out.String(), "stderr": errOut.String()} {
				if strings.Contains(s, tc.secret) {
					t.Errorf("%s shows the token:\n%s", name, s)
				}
			}
		})
	}
}
