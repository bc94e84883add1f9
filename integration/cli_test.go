package integration

// End-to-end tests of the amqp-mirror binary: the real executable, started the way an
// operator starts it (serve --config FILE, ctl, signals, file edits), in front of the
// package's RabbitMQ nodes. What the tests know of the process is what an operator sees:
// exit codes, stdout, stderr and the AMQP and admin listeners.

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/pflag"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// The account the tests create on rabbit1. The password is distinctive enough that
// finding it anywhere in the proxy's output means the proxy leaked it.
const (
	cliUser   = "u1"
	cliSecret = "Sup3rSecretPw"
)

func TestCLIServeLogsConnectionsWithoutPasswords(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	cliAddUser(t, rabbit, cliUser, cliSecret)

	logins := []struct {
		name        string
		auth        amqp.Authentication
		wantRefusal int // 0: the login works
	}{
		{"PLAIN", &amqp.PlainAuth{Username: cliUser, Password: cliSecret}, 0},
		{"AMQPLAIN", &amqp.AMQPlainAuth{Username: cliUser, Password: cliSecret}, 0},
		// The wrong password contains the right one, so the check below covers both.
		{"wrong password", &amqp.PlainAuth{Username: cliUser, Password: cliSecret + "-wrong"}, amqp.AccessRefused},
	}
	for _, format := range []string{"text", "json"} {
		t.Run("log.format="+format, func(t *testing.T) {
			settings := newCLIConfig(t, rabbit)
			settings.LogFormat = format
			// The backend account carries the secret too: it must not leak either.
			settings.BackendURL = fmt.Sprintf("amqp://%s:%s@127.0.0.1:%d/", cliUser, cliSecret, rabbit.Port)
			p := cli.serveConfig(t, settings)

			for _, login := range logins {
				if login.wantRefusal != 0 && format != "text" {
					continue // a refusal costs 3s (RabbitMQ delays its silent close); once is enough
				}
				t.Run(login.name, func(t *testing.T) {
					conn, err := amqp.DialConfig("amqp://"+p.amqpAddr+"/", amqp.Config{SASL: []amqp.Authentication{login.auth}, Vhost: "/"})
					if login.wantRefusal != 0 {
						if code, text := amqpErrorDetails(err); code != login.wantRefusal {
							t.Fatalf("dial: got %d %s, want %d", code, text, login.wantRefusal)
						}
						p.awaitRecord(t, "a refusal", map[string]string{"msg": "connection refused", "user": cliUser, "reason": "handshake_failed"})
						return
					}
					if err != nil {
						t.Fatalf("dial through the proxy: %v", err)
					}
					client := conn.LocalAddr().String()
					cliPublishAndGet(t, conn, queueName(t), "hello through "+login.name)
					if err := conn.Close(); err != nil {
						t.Fatalf("close: %v", err)
					}

					opened := p.awaitRecord(t, "connection opened", map[string]string{"msg": "connection opened", "client": client})
					closed := p.awaitRecord(t, "connection closed", map[string]string{"msg": "connection closed", "client": client})
					checks := []struct {
						record cliRecord
						key    string
						want   string
					}{
						{opened, "user", cliUser},
						{opened, "vhost", "/"},
						{opened, "backend", rabbit.Name},
						{closed, "user", cliUser},
						{closed, "vhost", "/"},
						{closed, "reason", "client_closed"},
					}
					for _, c := range checks {
						if got := c.record.text(c.key); got != c.want {
							t.Errorf("%q line: got %s=%q, want %q\n%v", c.record.text("msg"), c.key, got, c.want, c.record)
						}
					}
					if d, ok := closed.duration("duration"); !ok || d <= 0 {
						t.Errorf("connection closed line: got duration %v (%v), want a positive duration\n%v", closed["duration"], ok, closed)
					}
				})
			}

			if code, _ := p.stop(t, syscall.SIGTERM); code != 0 {
				t.Errorf("exit code after SIGTERM: got %d, want 0", code)
			}
			for stream, output := range map[string]string{"stderr": p.stderr.String(), "stdout": p.stdout.String()} {
				if strings.Contains(output, cliSecret) {
					t.Errorf("the password %q appears in the proxy's %s:\n%s", cliSecret, stream, output)
				}
			}
		})
	}
}

func TestCLIShutdownSignals(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	cases := []struct {
		name            string
		signal          syscall.Signal
		shutdownTimeout time.Duration
		// stall makes the client stop reading once connected, so that it never answers
		// the proxy's connection.close: shutdown must give up at shutdown_timeout.
		stall       bool
		wantMinimum time.Duration // the shutdown must take at least this long
	}{
		{name: "SIGTERM", signal: syscall.SIGTERM, shutdownTimeout: 5 * time.Second},
		{name: "SIGINT", signal: syscall.SIGINT, shutdownTimeout: 5 * time.Second},
		{name: "SIGTERM, client never answers the close", signal: syscall.SIGTERM, shutdownTimeout: time.Second, stall: true, wantMinimum: time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			settings := newCLIConfig(t, rabbit)
			settings.ShutdownTimeout = tc.shutdownTimeout
			p := cli.serveConfig(t, settings)

			var stalling *cliStallingConn
			conn, err := amqp.DialConfig(p.url("guest", "guest"), amqp.Config{
				Dial: func(network, addr string) (net.Conn, error) {
					c, err := net.DialTimeout(network, addr, 5*time.Second)
					if err != nil {
						return nil, err
					}
					stalling = &cliStallingConn{Conn: c}
					return stalling, nil
				},
			})
			if err != nil {
				t.Fatalf("dial through the proxy: %v", err)
			}
			t.Cleanup(func() {
				stalling.release()
				conn.Close()
			})
			closed := conn.NotifyClose(make(chan *amqp.Error, 1))
			cliPublishAndGet(t, conn, queueName(t), "before the signal")
			if tc.stall {
				stalling.stall()
			}

			code, elapsed := p.stop(t, tc.signal)
			if code != 0 {
				t.Errorf("exit code after %v: got %d, want 0\n%s", tc.signal, code, p.stderr)
			}
			if elapsed > tc.shutdownTimeout+time.Second || elapsed < tc.wantMinimum {
				t.Errorf("the process exited %v after %v; want between %v and shutdown_timeout %v (+1s)", elapsed, tc.signal, tc.wantMinimum, tc.shutdownTimeout)
			}
			// A stalled client reads the close the proxy sent once it reads again.
			stalling.release()
			select {
			case e := <-closed:
				if e == nil || e.Code != amqp.ConnectionForced || !e.Server || !strings.Contains(e.Reason, "shutdown") {
					t.Errorf("NotifyClose: got %v, want a server-sent 320 CONNECTION_FORCED naming the shutdown", e)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("NotifyClose: nothing within 5s of the exit")
			}
			p.requireRecord(t, map[string]string{"msg": "connection closed", "reason": "shutdown"})
			p.requireRecord(t, map[string]string{"msg": "stopped"})
			if tc.stall {
				p.requireRecord(t, map[string]string{"msg": "shutdown timed out; remaining connections closed"})
			}
		})
	}
}

func TestCLICtlManagesPolicies(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	settings := newCLIConfig(t, rabbit)
	settings.Extra = `
policies:
  - {name: ha-file, pattern: "^file_", apply-to: queues, definition: {ha-mode: all}}
operator_policies:
  - {name: op-file, pattern: "^file_", definition: {message-ttl: 60000}}
`
	p := cli.serveConfig(t, settings)
	closedPort := cliFreeAddr(t)
	// The same admin address, but a state_dir the proxy never used: no token there.
	otherState := newCLIConfig(t, rabbit)
	otherState.Admin = p.adminAddr
	otherStatePath := writeCLIConfig(t, otherState)

	const twoCopies = `{"ha-mode":"exactly","ha-params":2}`
	// The steps run in order against one proxy: each sees what the earlier ones did.
	steps := []struct {
		name     string
		args     []string // after "ctl --config FILE"; a later --config, --admin or --token wins
		wantCode int
		wantOut  []string
		wantErr  []string
		notOut   []string
	}{
		{
			name:    "set_policy",
			args:    []string{"set_policy", "--priority", "1", "--apply-to", "queues", "ha-two", `^q\.`, twoCopies},
			wantOut: []string{`Setting policy "ha-two" for pattern "^q\\." to "{\"ha-mode\":\"exactly\",\"ha-params\":2}" with priority "1" for vhost "/"`},
		},
		{
			name: "list_policies shows the runtime policy next to the file's",
			args: []string{"list_policies"},
			wantOut: []string{
				"vhost\tname\tpattern\tapply-to\tdefinition\tpriority\tsource\n",
				"/\tha-two\t^q\\.\tqueues\t" + twoCopies + "\t1\truntime\n",
				"/\tha-file\t^file_\tqueues\t{\"ha-mode\":\"all\"}\t0\tfile\n",
			},
		},
		{
			name: "list_policies --explain a queue the runtime policy matches",
			args: []string{"list_policies", "--explain", "q.orders"},
			wantOut: []string{
				`queue "q.orders" in vhost "/"`,
				"* ha-two\tpriority 1\truntime\tmatches; highest priority (1)",
				`ha-file	priority 0	file	pattern "^file_" does not match "q.orders"`,
				"applies: policy ha-two, operator policy (none)",
				`effective definition: {"ha-mode":"exactly","ha-params":2,`,
			},
		},
		{
			name:    "list_policies --explain a queue the file policy matches",
			args:    []string{"list_policies", "--explain", "file_invoices"},
			wantOut: []string{"* ha-file\tpriority 0\tfile\tmatches", "applies: policy ha-file, operator policy op-file", `"message-ttl":60000`},
		},
		{
			name:    "set_policy -p sets it in another vhost",
			args:    []string{"set_policy", "-p", "/staging", "ha-staging", ".*", `{"ha-mode":"all"}`},
			wantOut: []string{`for vhost "/staging"`},
		},
		{
			name:    "list_policies -p lists only that vhost",
			args:    []string{"list_policies", "-p", "/staging"},
			wantOut: []string{`Listing policies for vhost "/staging"`, "/staging\tha-staging\t.*\tall\t{\"ha-mode\":\"all\"}\t0\truntime\n"},
			notOut:  []string{"ha-two", "ha-file"},
		},
		{
			name:    "-p before the command, as rabbitmqctl takes it",
			args:    []string{"-p", "/staging", "list_policies"},
			wantOut: []string{"/staging\tha-staging\t"},
			notOut:  []string{"ha-two"},
		},
		{
			name:   "list_policies without -p lists the default vhost",
			args:   []string{"list_policies"},
			notOut: []string{"ha-staging"},
		},
		{
			name:     "clear_policy looks in the default vhost without -p",
			args:     []string{"clear_policy", "ha-staging"},
			wantCode: 65,
			wantErr:  []string{`policy not found: "ha-staging" in vhost "/"`},
		},
		{
			name:    "clear_policy -p",
			args:    []string{"clear_policy", "-p", "/staging", "ha-staging"},
			wantOut: []string{`Clearing policy "ha-staging" on vhost "/staging"`},
		},
		{
			name:     "clear_policy refuses a file policy",
			args:     []string{"clear_policy", "ha-file"},
			wantCode: 65,
			wantErr:  []string{`policy is defined in the config file: "ha-file" in vhost "/"; change the config file and reload`},
		},
		{
			name: "set_operator_policy",
			args: []string{"set_operator_policy", "--apply-to", "queues", "op-cap", `^q\.`, `{"ha-mode":"exactly","ha-params":3,"max-length":1000}`},
		},
		{
			name: "list_operator_policies",
			args: []string{"list_operator_policies"},
			wantOut: []string{
				"/\top-cap\t^q\\.\tqueues\t{\"ha-mode\":\"exactly\",\"ha-params\":3,\"max-length\":1000}\t0\toperator-runtime\n",
				"/\top-file\t^file_\tall\t{\"message-ttl\":60000}\t0\toperator-file\n",
			},
		},
		{
			name:    "--explain merges the operator policy",
			args:    []string{"list_policies", "--explain", "q.orders"},
			wantOut: []string{"applies: policy ha-two, operator policy op-cap", `"ha-params":3`, `"max-length":1000`},
		},
		{
			name: "clear_operator_policy",
			args: []string{"clear_operator_policy", "op-cap"},
		},
		{
			name:   "the operator policy is gone",
			args:   []string{"list_operator_policies"},
			notOut: []string{"op-cap"},
		},
		{
			name:     "clear_operator_policy of an unknown policy",
			args:     []string{"clear_operator_policy", "op-cap"},
			wantCode: 65,
			wantErr:  []string{`policy not found: "op-cap" in vhost "/"`},
		},
		{
			name:     "invalid JSON",
			args:     []string{"set_policy", "p-bad", "^x", `{"ha-mode":`},
			wantCode: 65,
			wantErr:  []string{`definition: expected a JSON object such as '{"ha-mode":"all"}', found "{\"ha-mode\":"`},
		},
		{
			name:     "ha-params missing for exactly",
			args:     []string{"set_policy", "p-bad", "^x", `{"ha-mode":"exactly"}`},
			wantCode: 65,
			wantErr:  []string{`definition.ha-params: ha-mode "exactly" needs ha-params`},
		},
		{
			name:     "unknown definition key",
			args:     []string{"set_policy", "p-bad", "^x", `{"ha-mode":"all","ha-mood":"all"}`},
			wantCode: 65,
			wantErr:  []string{"definition.ha-mood: unknown key; expected one of the policy definition keys"},
		},
		{
			name:     "bad regex",
			args:     []string{"set_policy", "p-bad", "^(x", `{"ha-mode":"all"}`},
			wantCode: 65,
			wantErr:  []string{`pattern: expected a regular expression, found "^(x"`},
		},
		{
			name:     "bad apply-to",
			args:     []string{"set_policy", "--apply-to", "topics", "p-bad", "^x", `{"ha-mode":"all"}`},
			wantCode: 65,
			wantErr:  []string{`apply-to: expected one of queues, exchanges, all, found "topics"`},
		},
		{
			name:     "a key operator policies do not take",
			args:     []string{"set_operator_policy", "op-bad", "^x", `{"alternate-exchange":"ae"}`},
			wantCode: 65,
			wantErr:  []string{"definition.alternate-exchange: unknown key; expected one of the operator policy definition keys"},
		},
		{
			name:    "refused policies were not stored",
			args:    []string{"list_policies"},
			wantOut: []string{"ha-two", "ha-file"},
			notOut:  []string{"p-bad"},
		},
		{
			name:     "missing arguments",
			args:     []string{"set_policy", "p-bad", "^x"},
			wantCode: 64,
			wantErr:  []string{"expected 3 argument(s), found 2", "Usage: amqp-mirror ctl set_policy"},
		},
		{
			name:     "unknown command",
			args:     []string{"set_polcy"},
			wantCode: 64,
			wantErr:  []string{`unknown command "set_polcy"`},
		},
		{
			name:     "wrong token",
			args:     []string{"--token", "not-the-token", "list_policies"},
			wantCode: 77,
			wantErr:  []string{"missing or wrong admin token"},
		},
		{
			name:     "no token in the state_dir of --config",
			args:     []string{"--config", otherStatePath, "list_policies"},
			wantCode: 77,
			wantErr:  []string{"admin token:", config.AdminTokenFile},
		},
		{
			name:     "admin API unreachable",
			args:     []string{"--admin", closedPort, "list_policies"},
			wantCode: 69,
			wantErr:  []string{"connection refused"},
		},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			r := cli.run(t, nil, append([]string{"ctl", "--config", p.configPath}, step.args...)...)
			r.check(t, step.wantCode, step.wantOut, step.wantErr, step.notOut)
		})
	}

	// Runtime policies live in state_dir: a restarted proxy still has them.
	run := func(args ...string) cliResult {
		return cli.run(t, nil, append([]string{"ctl", "--config", p.configPath}, args...)...)
	}
	run("set_operator_policy", "op-keep", "^keep", `{"max-length":10}`).check(t, 0, nil, nil, nil)
	if code, _ := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code after SIGTERM: got %d, want 0\n%s", code, p.stderr)
	}
	cli.serve(t, p.configPath, nil)
	run("list_policies").check(t, 0, []string{
		"/\tha-two\t^q\\.\tqueues\t" + twoCopies + "\t1\truntime\n",
		"/\tha-file\t^file_\tqueues\t{\"ha-mode\":\"all\"}\t0\tfile\n",
	}, nil, nil)
	run("list_operator_policies").check(t, 0, []string{"/\top-keep\t^keep\tall\t{\"max-length\":10}\t0\toperator-runtime\n"}, nil, nil)
}

func TestCLIReloadAppliesPolicyChanges(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	const added = `
policies:
  - {name: ha-added, pattern: "^added_", apply-to: queues, definition: {ha-mode: exactly, ha-params: 2}}
`
	cases := []struct {
		name string
		// symlinked puts the config file in another directory behind a symlink, where
		// the watch of the link's directory does not see edits: only SIGHUP reloads.
		symlinked bool
		edit      func(t *testing.T, path, content string)
		sighup    bool
		wantLog   map[string]string
	}{
		{
			name:    "file watch: edited in place",
			edit:    func(t *testing.T, path, content string) { cliWriteFile(t, path, content) },
			wantLog: map[string]string{"msg": "config reloaded", "applied": "policies"},
		},
		{
			name: "file watch: replaced by rename, as editors save",
			edit: func(t *testing.T, path, content string) {
				temporary := path + ".swp"
				cliWriteFile(t, temporary, content)
				if err := os.Rename(temporary, path); err != nil {
					t.Fatal(err)
				}
			},
			wantLog: map[string]string{"msg": "config reloaded", "applied": "policies"},
		},
		{
			name:      "SIGHUP",
			symlinked: true,
			edit:      func(t *testing.T, path, content string) { cliWriteFile(t, path, content) },
			sighup:    true,
			wantLog:   map[string]string{"msg": "SIGHUP: reloading the config file"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			settings := newCLIConfig(t, rabbit)
			path := filepath.Join(t.TempDir(), "amqp-mirror.yaml")
			target := path
			if tc.symlinked {
				target = filepath.Join(t.TempDir(), "real.yaml")
				if err := os.Symlink(target, path); err != nil {
					t.Fatal(err)
				}
			}
			cliWriteFile(t, target, settings.yaml())
			p := cli.serve(t, path, nil)
			client := newCLIClient(t, p)

			tc.edit(t, target, settings.yaml()+added)
			if tc.sighup {
				p.signal(t, syscall.SIGHUP)
			}
			testutil.Eventually(t, 5*time.Second, func() error {
				return p.ctl(t, "list_policies").contains("/\tha-added\t^added_\tqueues\t{\"ha-mode\":\"exactly\",\"ha-params\":2}\t0\tfile\n")
			})
			p.requireRecord(t, tc.wantLog)
			client.requireUsable(t)
		})
	}
}

func TestCLIReloadRefusesWhatItCannotApply(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	settings := newCLIConfig(t, rabbit)
	settings.Extra = `
policies:
  - {name: ha-old, pattern: "^old_", definition: {ha-mode: all}}
`
	p := cli.serveConfig(t, settings)
	oldAddr := p.amqpAddr
	client := newCLIClient(t, p)
	oldPolicy := "/\tha-old\t^old_\tall\t{\"ha-mode\":\"all\"}\t0\tfile\n"

	refused := map[string]string{"msg": "config reload refused; the running configuration stays", "file": p.configPath}
	// Each step rewrites the file, sends SIGHUP if asked, and waits for the log lines.
	steps := []struct {
		name     string
		content  func() string
		sighup   bool
		wantLogs []map[string]string
		// wantError are fragments of the last wanted line's error attribute.
		wantError []string
		wantOut   []string // in list_policies
		notOut    []string
	}{
		{
			name:      "unknown key: refused, old policies stay",
			content:   func() string { return settings.yaml() + "listen_amqp: 127.0.0.1:1\n" },
			wantLogs:  []map[string]string{refused},
			wantError: []string{"config file " + p.configPath + ": listen_amqp: unknown key; expected one of the top-level keys"},
			wantOut:   []string{oldPolicy},
		},
		{
			name: "unknown key inside a policy, on SIGHUP: refused, old policies stay",
			content: func() string {
				return strings.Replace(settings.yaml(), "ha-mode: all", "ha-mode: all, ha-mood: all", 1)
			},
			sighup:    true,
			wantLogs:  []map[string]string{{"msg": "SIGHUP: reloading the config file"}, refused},
			wantError: []string{"config file " + p.configPath + ": policies[0].definition.ha-mood: unknown key"},
			wantOut:   []string{oldPolicy},
		},
		{
			name: "listen.amqp changed: restart required, the policy part applies",
			content: func() string {
				moved := settings
				moved.AMQP = cliFreeAddr(t)
				moved.Extra = strings.Replace(settings.Extra, "ha-old", "ha-new", 1)
				return moved.yaml()
			},
			wantLogs: []map[string]string{
				{"msg": "listen.amqp changed: restart required", "key": "listen.amqp", "file": p.configPath},
				{"msg": "config reloaded", "applied": "policies"},
			},
			wantOut: []string{"/\tha-new\t^old_\t"},
			notOut:  []string{"ha-old"},
		},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			mark := p.stderr.Len()
			cliWriteFile(t, p.configPath, step.content())
			if step.sighup {
				p.signal(t, syscall.SIGHUP)
			}
			var record cliRecord
			for _, want := range step.wantLogs {
				record = p.awaitRecordAfter(t, mark, step.name, want)
			}
			for _, fragment := range step.wantError {
				if got := record.text("error"); !strings.Contains(got, fragment) {
					t.Errorf("log line %q: got error %q, want it to contain %q", record.text("msg"), got, fragment)
				}
			}
			// ctl --config cannot read an invalid file; --admin and --token can.
			p.ctl(t, "list_policies").check(t, 0, step.wantOut, nil, step.notOut)
			client.requireUsable(t)
		})
	}
	// The listener stays where it was until a restart.
	conn, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@%s/", oldAddr))
	if err != nil {
		t.Fatalf("dial the old listen.amqp %s after the refused change: %v", oldAddr, err)
	}
	conn.Close()
}

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
				"listen.admn: unknown key; expected one of the listen keys: [admin amqp amqps tls]",
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

func TestCLIHelp(t *testing.T) {
	cli := newCLI(t)
	serveFlags := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	config.RegisterFlags(serveFlags)
	wantServe := []string{"config"}
	serveFlags.VisitAll(func(f *pflag.Flag) { wantServe = append(wantServe, f.Name) })
	ctlFlags := []string{"config", "admin", "token", "timeout", "vhost", "quiet", "formatter"}

	cases := []struct {
		name      string
		args      []string
		wantFlags []string
		wantOut   []string
	}{
		{name: "serve --help", args: []string{"serve", "--help"}, wantFlags: wantServe, wantOut: []string{"Usage: amqp-mirror serve", "SIGHUP"}},
		{name: "help serve", args: []string{"help", "serve"}, wantFlags: wantServe, wantOut: []string{"Usage: amqp-mirror serve"}},
		{name: "ctl --help", args: []string{"ctl", "--help"}, wantFlags: ctlFlags, wantOut: []string{"Usage: amqp-mirror ctl"}},
		{name: "help ctl", args: []string{"help", "ctl"}, wantFlags: ctlFlags, wantOut: []string{"Usage: amqp-mirror ctl", "before or after the command"}},
		{name: "demo --help", args: []string{"demo", "--help"}, wantFlags: []string{"nodes", "listen", "admin", "dir"}, wantOut: []string{"Usage: amqp-mirror demo"}},
		{name: "ctl help", args: []string{"ctl", "help"}, wantFlags: ctlFlags},
		{name: "ctl help set_policy", args: []string{"ctl", "help", "set_policy"}, wantOut: []string{"Usage: amqp-mirror ctl set_policy [-p VHOST]"}},
		{name: "ctl set_policy --help", args: []string{"ctl", "set_policy", "--help"}, wantFlags: []string{"vhost", "quiet", "help", "priority", "apply-to"}},
		{name: "ctl list_policies --help", args: []string{"ctl", "list_policies", "--help"}, wantFlags: []string{"vhost", "quiet", "help", "explain", "formatter", "config", "admin", "token"}},
		{name: "help", args: []string{"help"}, wantOut: []string{"amqp-mirror serve", "amqp-mirror ctl", "amqp-mirror demo"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := cli.run(t, nil, tc.args...)
			r.check(t, 0, tc.wantOut, nil, nil)
			described := cliFlagDescriptions(r.stdout)
			for _, name := range tc.wantFlags {
				if description, ok := described[name]; !ok {
					t.Errorf("--%s is not listed; got:\n%s", name, r.stdout)
				} else if description == "" {
					t.Errorf("--%s has no description; got:\n%s", name, r.stdout)
				}
			}
			for name, description := range described {
				if description == "" {
					t.Errorf("--%s has no description", name)
				}
			}
		})
	}

	// help ctl lists every command, one line each: the name, then what it does.
	for _, args := range [][]string{{"help", "ctl"}, {"ctl", "help"}, {"ctl", "--help"}} {
		r := cli.run(t, nil, args...)
		for _, command := range []string{"set_policy", "clear_policy", "list_policies", "set_operator_policy", "clear_operator_policy", "list_operator_policies", "help"} {
			if !regexp.MustCompile(`(?m)^  ` + command + `\s{2,}\w.*$`).MatchString(r.stdout) {
				t.Errorf("%s: no line for %s with what it does; got:\n%s", strings.Join(args, " "), command, r.stdout)
			}
		}
	}

	// Help and README tell the same story: what is not used yet, and what a reload does.
	r := cli.run(t, nil, "help", "serve")
	described := cliFlagDescriptions(r.stdout)
	for _, name := range []string{"cluster.bind", "cluster.join"} {
		if strings.Contains(described[name], config.NotUsedYet) {
			t.Errorf("--%s: description %q still says %q; serve starts the sidecar cluster", name, described[name], config.NotUsedYet)
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	flat := func(s string) string { return strings.Join(strings.Fields(strings.ReplaceAll(s, "`", "")), " ") }
	for _, same := range []string{
		"reloads the whole file",
		"policies, operator policies and log.level apply live",
		"cluster.bind set (and node), the proxy joins the sidecar cluster",
		"failover_grace is how long the proxy's own probe of each backend waits",
	} {
		if !strings.Contains(flat(r.stdout), same) {
			t.Errorf("help serve does not say %q; got:\n%s", same, r.stdout)
		}
		if !strings.Contains(strings.ToLower(flat(string(readme))), strings.ToLower(same)) {
			t.Errorf("README does not say %q", same)
		}
	}
	if strings.Contains(r.stdout, "reloads the policies") {
		t.Errorf("help serve still says SIGHUP reloads only the policies:\n%s", r.stdout)
	}

	failures := []struct {
		name    string
		args    []string
		wantErr []string
	}{
		{name: "no arguments", wantErr: []string{"Usage:", "amqp-mirror serve", "amqp-mirror ctl", "amqp-mirror demo"}},
		{name: "unknown command", args: []string{"server"}, wantErr: []string{`unknown command "server"`, "Usage:"}},
		{name: "unknown flag", args: []string{"serve", "--listen-amqp", "x"}, wantErr: []string{"unknown flag: --listen-amqp"}},
		{name: "ctl without a command", args: []string{"ctl", "--config", "x.yaml"}, wantErr: []string{"no command given", "Commands:"}},
	}
	for _, tc := range failures {
		t.Run(tc.name, func(t *testing.T) {
			r := cli.run(t, nil, tc.args...)
			if r.code == 0 {
				t.Errorf("exit code: got 0, want non-zero")
			}
			r.check(t, r.code, nil, tc.wantErr, nil)
		})
	}
}

func TestCLIBackendDown(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	// A backend that accepts connections and never says anything.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		accepting sync.WaitGroup
		mu        sync.Mutex
		held      []net.Conn
	)
	accepting.Add(1)
	go func() {
		defer accepting.Done()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		accepting.Wait()
		for _, c := range held {
			c.Close()
		}
	})

	cases := []struct {
		name       string
		backend    string
		wantDetail string
	}{
		{name: "nothing listens", backend: cliFreeAddr(t), wantDetail: "connection refused"},
		{name: "the backend never answers", backend: silent.Addr().String(), wantDetail: "i/o timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			settings := newCLIConfig(t, rabbit)
			settings.BackendName = "rabbit-gone"
			settings.BackendURL = "amqp://guest:guest@" + tc.backend + "/"
			settings.Extra = "handshake_timeout: 1s\n"
			p := cli.serveConfig(t, settings)
			for attempt := 1; attempt <= 2; attempt++ {
				_, err := amqp.Dial(p.url("guest", "guest"))
				code, text := amqpErrorDetails(err)
				if code != amqp.ConnectionForced || !strings.Contains(text, "backend rabbit-gone unavailable") || !strings.Contains(text, tc.wantDetail) {
					t.Errorf("attempt %d: got %d %q, want 320 naming backend rabbit-gone and %q", attempt, code, text, tc.wantDetail)
				}
			}
			p.awaitRecord(t, "the refusal", map[string]string{"msg": "connection refused", "reason": "backend_unavailable"})
			if p.exited() {
				t.Fatalf("the proxy exited:\n%s", p.stderr)
			}
			if code, _ := p.stop(t, syscall.SIGTERM); code != 0 {
				t.Errorf("exit code after SIGTERM: got %d, want 0", code)
			}
		})
	}
}

// TestCLIServesAMQPS: listen.tls and listen.amqps in the file give an AMQPS
// listener beside the plain one, both in front of the same backend.
func TestCLIServesAMQPS(t *testing.T) {
	certPath, keyPath, pool := selfSignedPEMFiles(t, t.TempDir())

	c := newCLIConfig(t, node(t, "rabbit1"))
	c.AMQPS, c.TLSCert, c.TLSKey = cliFreeAddr(t), certPath, keyPath
	newCLI(t).serveConfig(t, c)

	conn, err := amqp.DialTLS("amqps://guest:guest@"+c.AMQPS+"/", &tls.Config{RootCAs: pool})
	if err != nil {
		t.Fatalf("dial amqps %s: %v", c.AMQPS, err)
	}
	defer conn.Close()
	ch := openChannel(t, conn)
	q, err := ch.QueueDeclare(queueName(t), false, true, false, false, nil)
	if err != nil {
		t.Fatalf("queue.declare over AMQPS: %v", err)
	}
	if err := ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("tls")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	awaitMessage(t, ch, q.Name, "tls")
}

func TestCLICtlOptionsAfterTheCommand(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	settings := newCLIConfig(t, rabbit)
	settings.Extra = `
policies:
  - {name: ha-file, pattern: "^file_", apply-to: queues, definition: {ha-mode: all}}
`
	p := cli.serveConfig(t, settings)
	path := p.configPath
	steps := []struct {
		name    string
		args    []string // after "ctl"
		wantOut []string
	}{
		{"--config after the command", []string{"list_policies", "--config", path},
			[]string{"vhost\tname\tpattern\tapply-to\tdefinition\tpriority\tsource\n", "/\tha-file\t^file_\tqueues\t{\"ha-mode\":\"all\"}\t0\tfile\n"}},
		{"set_policy with --config and --priority after its arguments", []string{"set_policy", "ha-two", "^q", `{"ha-mode":"exactly","ha-params":2}`, "--config", path, "--priority", "2"},
			[]string{`Setting policy "ha-two" for pattern "^q"`, `with priority "2"`}},
		{"--admin, --token and -p after the command", []string{"list_policies", "--admin", p.adminAddr, "--token", p.token, "-p", "/"},
			[]string{"/\tha-two\t^q\tall\t{\"ha-mode\":\"exactly\",\"ha-params\":2}\t2\truntime\n"}},
		{"options on both sides", []string{"-p", "/", "list_policies", "--config", path, "-q"},
			[]string{"/\tha-file\t"}},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			cli.run(t, nil, append([]string{"ctl"}, step.args...)...).check(t, 0, step.wantOut, nil, nil)
		})
	}

	t.Run("--formatter json", func(t *testing.T) {
		for _, args := range [][]string{
			{"ctl", "list_policies", "--config", path, "--formatter", "json"},
			{"ctl", "--formatter=json", "--config", path, "list_policies"},
		} {
			r := cli.run(t, nil, args...)
			r.check(t, 0, nil, nil, nil)
			var rows []map[string]any
			if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
				t.Fatalf("%s: stdout is not a JSON array: %v\n%s", strings.Join(args, " "), err, r.stdout)
			}
			byName := map[string]map[string]any{}
			for _, row := range rows {
				byName[fmt.Sprint(row["name"])] = row
			}
			file, runtime := byName["ha-file"], byName["ha-two"]
			if len(rows) != 2 || file == nil || runtime == nil {
				t.Fatalf("got %v, want ha-file and ha-two", rows)
			}
			checks := []struct {
				name      string
				got, want any
			}{
				{"vhost", file["vhost"], "/"},
				{"pattern", file["pattern"], "^file_"},
				{"apply-to", file["apply-to"], "queues"},
				{"definition", fmt.Sprint(file["definition"]), "map[ha-mode:all]"},
				{"priority", runtime["priority"], 2.0},
				{"file source", file["source"], "file"},
				{"runtime source", runtime["source"], "runtime"},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s: %s: got %v, want %v", strings.Join(args, " "), c.name, c.got, c.want)
				}
			}
		}
		r := cli.run(t, nil, "ctl", "list_policies", "--explain", "file_1", "--config", path, "--formatter", "json")
		r.check(t, 0, nil, nil, nil)
		var report struct {
			Policy struct {
				Winner string `json:"winner"`
			} `json:"policy"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &report); err != nil || report.Policy.Winner != "ha-file" {
			t.Errorf("--explain --formatter json: got %v %q, want the winner ha-file", err, r.stdout)
		}
		cli.run(t, nil, "ctl", "list_policies", "--config", path, "--formatter", "xml").check(t, 64, nil, []string{"--formatter: expected table or json"}, nil)
	})
}

func TestCLIMetrics(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	p := cli.serveConfig(t, newCLIConfig(t, rabbit))
	conn, err := amqp.Dial(p.url("guest", "guest"))
	if err != nil {
		t.Fatalf("dial the proxy: %v", err)
	}
	conn.Close()

	scrape := func() (string, error) {
		// No credential: /metrics is open like RabbitMQ's Prometheus endpoint.
		resp, err := http.Get("http://" + p.adminAddr + "/metrics")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("GET /metrics: %s\n%s", resp.Status, body)
		}
		return string(body), err
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		body, err := scrape()
		if err != nil {
			return err
		}
		for _, want := range []string{
			"# TYPE amqp_mirror_client_connections gauge\namqp_mirror_client_connections 0\n",
			"# TYPE amqp_mirror_client_connections_opened_total counter\namqp_mirror_client_connections_opened_total 1\n",
			"# TYPE amqp_mirror_client_connections_closed_total counter\n",
			`amqp_mirror_client_connections_closed_total{reason="client_closed"} 1` + "\n",
			`amqp_mirror_client_connections_closed_total{reason="backend_lost"} 0` + "\n",
			`amqp_mirror_policies{kind="policy"} 0` + "\n",
			`amqp_mirror_policies{kind="operator_policy"} 0` + "\n",
			"# TYPE amqp_mirror_policy_changes_total counter\namqp_mirror_policy_changes_total 0\n",
			// The proxy's own link to the backend, with the account in its URL.
			`amqp_mirror_backend_up{backend="rabbit1"} 1` + "\n",
			`amqp_mirror_backend_down_total{backend="rabbit1"} 0` + "\n",
			"# TYPE go_goroutines gauge\n",
			"# TYPE go_gc_duration_seconds summary\n",
			"# TYPE process_resident_memory_bytes gauge\n",
			"# TYPE process_cpu_seconds_total counter\n",
			"# TYPE process_open_fds gauge\n",
		} {
			if !strings.Contains(body, want) {
				return fmt.Errorf("/metrics lacks %q; got:\n%s", want, body)
			}
		}
		return nil
	})
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
