package integration

// End-to-end tests of what serve makes of its configuration: errors naming file, key and
// expectation, any file name, flag overrides, and the shipped example.

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/config"
)

func TestCLIServeConfigErrors(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	cases := []struct {
		name string
		file string // "" runs without --config
		env  []string
		args []string
		// want are the lines stderr must have, each naming the source, key path and
		// what was expected; all of them come from a single run.
		want []string
	}{
		{
			name: "several errors in the file",
			file: `
listen:
  amqp: 127.0.0.1:5672
  admn: 127.0.0.1:15680
backends:
  - {name: rabbit1, url: "amqp://guest:guest@127.0.0.1:1/"}
  - {name: rabbit1, url: "amqp://guest:guest@127.0.0.1:2/"}
policies:
  - {name: bad-regex, pattern: "^(unclosed", definition: {ha-mode: all}}
  - {name: no-params, pattern: "^q", definition: {ha-mode: exactly}}
`,
			want: []string{
				"listen.admn: unknown key; expected one of the listen keys: [admin admin_tls amqp amqps tls]",
				`backends[1].name: expected a unique backend name, found "rabbit1" again (already backends[0])`,
				`policies[0].pattern: expected a regular expression, found "^(unclosed"`,
				`policies[1].definition.ha-params: ha-mode "exactly" needs ha-params, a positive integer (the number of copies); found no ha-params`,
			},
		},
		{
			name: "wrong types, and a backend password is not shown",
			file: `
heartbeat: 1500ms
frame_max: 100
backends:
  - {name: rabbit1, url: "http://u1:` + cliSecret + `@127.0.0.1:1/"}
`,
			want: []string{
				`heartbeat: expected a duration of whole seconds from 0s (off) to 65535s, such as 60s, found "1500ms" (string)`,
				"frame_max: expected an integer from 4096 to 4294967295, found 100, below the minimum 4096",
				`backends[0].url: expected an amqp:// or amqps:// URL, found scheme "http" in "http://u1:xxxxx@127.0.0.1:1/"`,
			},
		},
		{
			name: "an unparseable backend URL is shown without its password",
			file: `
backends:
  - {name: rabbit1, url: "amqp://mirror:` + cliSecret + `@[::1/"}
  - {name: rabbit2, url: "amqp://mirror:` + cliSecret + `/x@127.0.0.1/"}
`,
			want: []string{
				`backends[0].url: expected an amqp:// or amqps:// URL, found "amqp://mirror:xxxxx@[::1/" (missing ']' in host)`,
				`backends[1].url: expected an amqp:// or amqps:// URL, found "amqp://mirror:xxxxx@127.0.0.1/" (a character in the user name or password`,
			},
		},
		{
			name: "ports outside 1-65535",
			file: `
listen:
  admin: 127.0.0.1:70000
backends:
  - {name: rabbit1, url: "amqp://mirror:` + cliSecret + `@127.0.0.1:99999/"}
`,
			args: []string{"--listen.amqp", "127.0.0.1:0"},
			want: []string{
				`backends[0].url: expected a port from 1 to 65535, found 99999 in "amqp://mirror:xxxxx@127.0.0.1:99999/"`,
				`listen.admin: expected an address host:port such as 0.0.0.0:5672 with a port from 1 to 65535, found "127.0.0.1:70000"`,
				`flag --listen.amqp: listen.amqp: expected an address host:port such as 0.0.0.0:5672 with a port from 1 to 65535, found "127.0.0.1:0"`,
			},
		},
		{
			name: "a YAML syntax error names its line",
			file: "node: rabbit1\nbackends: [{name: rabbit1, url: \"amqp://mirror:" + cliSecret + "@127.0.0.1/\"}\n",
			want: []string{`line 2: did not find expected ',' or ']' (YAML syntax)`},
		},
		{
			name: "a number flag is judged as a number",
			file: "backends: [{name: rabbit1, url: \"" + rabbit.URL() + "\"}]\n",
			args: []string{"--frame_max", "100", "--channel_max", "many"},
			want: []string{
				"flag --frame_max: frame_max: expected an integer from 4096 to 4294967295, found 100, below the minimum 4096",
				`flag --channel_max: channel_max: expected an integer from 1 to 65535, found "many"`,
			},
		},
		{
			name: "environment and flag values are named by their source",
			file: "backends: [{name: rabbit1, url: \"" + rabbit.URL() + "\"}]\n",
			env:  []string{"AMQP_MIRROR_CHANNEL_MAX=0"},
			args: []string{"--listen.amqp", "nowhere"},
			want: []string{
				`environment AMQP_MIRROR_CHANNEL_MAX: channel_max: expected an integer from 1 to 65535, found 0, below the minimum 1`,
				`flag --listen.amqp: listen.amqp: expected an address host:port such as 0.0.0.0:5672, found "nowhere"`,
			},
		},
		{
			name: "a backend without a url gets one error",
			file: "backends: [{name: rabbit1}]\n",
			want: []string{"backends[0].url: expected an amqp:// or amqps:// URL, found nothing (null)"},
		},
		{
			name: "no config file and no backend",
			want: []string{"config (no file): backends: at least one backend is required"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"serve"}
			var path string
			if tc.file != "" {
				path = filepath.Join(t.TempDir(), "amqp-mirror.yaml")
				cliWriteFile(t, path, tc.file)
				args = append(args, "--config", path)
			}
			args = append(args, tc.args...)
			// The listeners are valid, free addresses, so that only the wanted errors occur.
			env := append([]string{"AMQP_MIRROR_STATE_DIR=" + t.TempDir()}, tc.env...)
			if !slices.Contains(tc.args, "--listen.amqp") {
				env = append(env, "AMQP_MIRROR_LISTEN_AMQP="+cliFreeAddr(t), "AMQP_MIRROR_LISTEN_ADMIN="+cliFreeAddr(t))
			}
			r := cli.run(t, env, args...)
			if r.code == 0 {
				t.Fatalf("serve exited 0, want non-zero; stderr:\n%s", r.stderr)
			}
			for _, want := range tc.want {
				if path != "" && !strings.HasPrefix(want, "environment") && !strings.HasPrefix(want, "flag") {
					want = "config file " + path + ": " + want
				}
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr lacks %q; got:\n%s", want, r.stderr)
				}
			}
			if strings.Contains(r.stderr, cliSecret) {
				t.Errorf("stderr shows the backend password:\n%s", r.stderr)
			}
			// One error per key, and text from a flag or the environment is not called a string.
			for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
				if (strings.Contains(line, "flag --") || strings.Contains(line, "environment ")) && strings.Contains(line, "(string)") {
					t.Errorf("a flag or environment value is called a string: %s", line)
				}
			}
			for _, key := range cliErrorKeys(r.stderr) {
				if n := strings.Count(r.stderr, key+": "); n > 1 {
					t.Errorf("%d errors for %s, want one:\n%s", n, key, r.stderr)
				}
			}
		})
	}
}

func TestCLIServeReadsYAMLWhateverTheFileName(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	for _, name := range []string{"amqp-mirror.yaml", "amqp-mirror.yml", "amqp-mirror.conf", "amqp-mirror"} {
		t.Run(name, func(t *testing.T) {
			settings := newCLIConfig(t, rabbit)
			path := filepath.Join(t.TempDir(), name)
			cliWriteFile(t, path, settings.yaml())
			p := cli.serve(t, path, nil)
			if p.amqpAddr != settings.AMQP {
				t.Errorf("AMQP listening on %s, want listen.amqp %s", p.amqpAddr, settings.AMQP)
			}
			cli.run(t, nil, "ctl", "--config", path, "list_policies").check(t, 0, []string{"vhost\tname\t"}, nil, nil)
			p.stop(t, syscall.SIGTERM)
		})
	}
}

func TestCLIListenOverrides(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	fileAddr, envAddr, flagAddr := cliFreeAddr(t), cliFreeAddr(t), cliFreeAddr(t)
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{name: "the file", want: fileAddr},
		{name: "the environment over the file", env: []string{"AMQP_MIRROR_LISTEN_AMQP=" + envAddr}, want: envAddr},
		{name: "a flag over the environment", env: []string{"AMQP_MIRROR_LISTEN_AMQP=" + envAddr}, args: []string{"--listen.amqp=" + flagAddr}, want: flagAddr},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			settings := newCLIConfig(t, rabbit)
			settings.AMQP = fileAddr
			p := cli.serve(t, writeCLIConfig(t, settings), tc.env, tc.args...)
			if p.amqpAddr != tc.want {
				t.Errorf("AMQP listening on %s, want %s", p.amqpAddr, tc.want)
			}
			conn, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@%s/", tc.want))
			if err != nil {
				t.Fatalf("dial %s: %v", tc.want, err)
			}
			conn.Close()
			for _, other := range []string{fileAddr, envAddr, flagAddr} {
				if other == tc.want {
					continue
				}
				if c, err := net.DialTimeout("tcp", other, time.Second); err == nil {
					c.Close()
					t.Errorf("something listens on %s too; want only %s", other, tc.want)
				}
			}
			p.stop(t, syscall.SIGTERM)
		})
	}
}

// TestCLIServesTheShippedExample runs the real binary on the example file the README
// points at, with only the listeners and state_dir moved by environment variables.
func TestCLIServesTheShippedExample(t *testing.T) {
	cli := newCLI(t)
	example, err := filepath.Abs("../amqp-mirror.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	p := cli.serve(t, example, []string{
		"AMQP_MIRROR_LISTEN_AMQP=" + cliFreeAddr(t),
		"AMQP_MIRROR_LISTEN_ADMIN=" + cliFreeAddr(t),
		"AMQP_MIRROR_STATE_DIR=" + stateDir,
	})
	token, err := os.ReadFile(filepath.Join(stateDir, config.AdminTokenFile))
	if err != nil {
		t.Fatalf("the admin token: %v", err)
	}
	cli.run(t, nil, "ctl", "list_policies", "--admin", p.adminAddr, "--token", strings.TrimSpace(string(token))).
		check(t, 0, []string{"/\tha-queues\t^queue_\tqueues\t{\"ha-mode\":\"exactly\",\"ha-params\":2,\"ha-sync-mode\":\"automatic\"}\t0\tfile\n"}, nil, nil)
	p.stop(t, syscall.SIGTERM)
}
