package integration

// End-to-end tests of the amqp-mirror binary: the real executable, started the way an
// operator starts it (serve --config FILE, ctl, signals, file edits), in front of the
// package's RabbitMQ nodes. What the tests know of the process is what an operator sees:
// exit codes, stdout, stderr and the AMQP and admin listeners.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/pflag"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/integration/harness"
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
  amqp: 127.0.0.1:0
  admn: 127.0.0.1:0
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
				"frame_max: expected an integer from 4096 to 4294967295, found 100 (integer)",
				`backends[0].url: expected an amqp:// or amqps:// URL, found scheme "http"`,
			},
		},
		{
			name: "environment and flag values are named by their source",
			file: "backends: [{name: rabbit1, url: \"" + rabbit.URL() + "\"}]\n",
			env:  []string{"AMQP_MIRROR_CHANNEL_MAX=0"},
			args: []string{"--listen.amqp", "nowhere"},
			want: []string{
				`environment AMQP_MIRROR_CHANNEL_MAX: channel_max: expected an integer from 1 to 65535, found "0" (string)`,
				`flag --listen.amqp: listen.amqp: expected an address host:port such as 0.0.0.0:5672, found "nowhere" (string)`,
			},
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

	cases := []struct {
		name      string
		args      []string
		wantFlags []string
		wantOut   []string
	}{
		{name: "serve --help", args: []string{"serve", "--help"}, wantFlags: wantServe, wantOut: []string{"Usage: amqp-mirror serve", "SIGHUP"}},
		{name: "help serve", args: []string{"help", "serve"}, wantFlags: wantServe, wantOut: []string{"Usage: amqp-mirror serve"}},
		{name: "ctl --help", args: []string{"ctl", "--help"}, wantFlags: []string{"config", "admin", "token", "timeout", "vhost"}, wantOut: []string{"Usage: amqp-mirror ctl"}},
		{name: "demo --help", args: []string{"demo", "--help"}, wantFlags: []string{"nodes", "listen", "admin", "dir"}, wantOut: []string{"Usage: amqp-mirror demo"}},
		{name: "ctl help", args: []string{"ctl", "help"}, wantOut: []string{
			"set_policy [-p VHOST]", "clear_policy", "list_policies", "set_operator_policy", "clear_operator_policy", "list_operator_policies",
		}},
		{name: "ctl set_policy --help", args: []string{"ctl", "set_policy", "--help"}, wantFlags: []string{"vhost", "quiet", "help", "priority", "apply-to"}},
		{name: "ctl list_policies --help", args: []string{"ctl", "list_policies", "--help"}, wantFlags: []string{"vhost", "quiet", "help", "explain"}},
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

	failures := []struct {
		name    string
		args    []string
		wantErr []string
	}{
		{name: "no arguments", wantErr: []string{"Usage:", "amqp-mirror serve", "amqp-mirror ctl", "amqp-mirror demo"}},
		{name: "unknown command", args: []string{"server"}, wantErr: []string{`unknown command "server"`, "Usage:"}},
		{name: "unknown flag", args: []string{"serve", "--listen-amqp", "x"}, wantErr: []string{"unknown flag: --listen-amqp"}},
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

// ---- The binary and its processes.

// cliBuild holds the amqp-mirror executable, built once per package run.
var cliBuild struct {
	once  sync.Once
	image []byte
	err   error
}

// cliBinary is the amqp-mirror executable one test runs.
type cliBinary struct{ path string }

// newCLI builds amqp-mirror (once per package run) and puts a copy of it in t's
// temporary directory, so that nothing is left behind when the run ends.
func newCLI(t testing.TB) cliBinary {
	t.Helper()
	cliBuild.once.Do(func() {
		directory, err := os.MkdirTemp("", "amqp-mirror-cli-")
		if err != nil {
			cliBuild.err = err
			return
		}
		defer os.RemoveAll(directory)
		path := filepath.Join(directory, "amqp-mirror")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		output, err := exec.CommandContext(ctx, "go", "build", "-o", path, "github.com/amqp-mirror/amqp-mirror").CombinedOutput()
		if err != nil {
			cliBuild.err = fmt.Errorf("go build: %v\n%s", err, output)
			return
		}
		cliBuild.image, cliBuild.err = os.ReadFile(path)
	})
	if cliBuild.err != nil {
		t.Fatalf("building amqp-mirror: %v", cliBuild.err)
	}
	path := filepath.Join(t.TempDir(), "amqp-mirror")
	if err := os.WriteFile(path, cliBuild.image, 0o755); err != nil {
		t.Fatal(err)
	}
	return cliBinary{path: path}
}

// cliEnvironment is this process's environment without AMQP_MIRROR_ variables, which
// would change what the binary does, plus extra.
func cliEnvironment(extra []string) []string {
	var environment []string
	for _, variable := range os.Environ() {
		if !strings.HasPrefix(variable, config.EnvPrefix+"_") {
			environment = append(environment, variable)
		}
	}
	return append(environment, extra...)
}

// cliResult is what a finished run of the binary left.
type cliResult struct {
	args           []string
	code           int
	stdout, stderr string
}

// run runs the binary with env added to its environment, to its end (at most 30s).
func (b cliBinary) run(t testing.TB, env []string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	command := exec.CommandContext(ctx, b.path, args...)
	command.Env = cliEnvironment(env)
	var stdout, stderr bytes.Buffer
	command.Stdout, command.Stderr = &stdout, &stderr
	err := command.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("amqp-mirror %s: %v", strings.Join(args, " "), err)
	}
	return cliResult{args: args, code: command.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// check compares the result with what is wanted: the exit code, fragments stdout and
// stderr must contain, and fragments stdout must not.
func (r cliResult) check(t testing.TB, wantCode int, wantOut, wantErr, notOut []string) {
	t.Helper()
	describe := fmt.Sprintf("amqp-mirror %s", strings.Join(r.args, " "))
	if r.code != wantCode {
		t.Errorf("%s: got exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", describe, r.code, wantCode, r.stdout, r.stderr)
	}
	for _, want := range wantOut {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("%s: stdout lacks %q; got:\n%s", describe, want, r.stdout)
		}
	}
	for _, want := range wantErr {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("%s: stderr lacks %q; got:\n%s", describe, want, r.stderr)
		}
	}
	for _, unwanted := range notOut {
		if strings.Contains(r.stdout, unwanted) {
			t.Errorf("%s: stdout has %q; got:\n%s", describe, unwanted, r.stdout)
		}
	}
}

// contains is check for Eventually: nil once the run succeeded and stdout has want.
func (r cliResult) contains(want string) error {
	if r.code != 0 || !strings.Contains(r.stdout, want) {
		return fmt.Errorf("amqp-mirror %s: exit code %d, stdout lacks %q:\n%s%s", strings.Join(r.args, " "), r.code, want, r.stdout, r.stderr)
	}
	return nil
}

// cliOutput collects a running process's output; safe for concurrent use.
type cliOutput struct {
	mu     sync.Mutex
	buffer bytes.Buffer
}

func (o *cliOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buffer.Write(p)
}

func (o *cliOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buffer.String()
}

func (o *cliOutput) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buffer.Len()
}

// cliProxy is a running `amqp-mirror serve`.
type cliProxy struct {
	binary     cliBinary
	configPath string
	amqpAddr   string // where it listens, from its "AMQP listening" line
	adminAddr  string // from its "admin API listening" line
	token      string // the admin token, read from state_dir once it listens
	command    *exec.Cmd
	stdout     *cliOutput
	stderr     *cliOutput
	done       chan struct{} // closed once the process has exited and been reaped
}

// cliConfig is the part of the config file the tests vary.
type cliConfig struct {
	AMQP, Admin     string
	StateDir        string
	BackendName     string
	BackendURL      string
	ShutdownTimeout time.Duration
	LogFormat       string
	Extra           string // more YAML, appended
}

// newCLIConfig is a config for a proxy in front of n on free loopback ports, with its
// state in t's temporary directory.
func newCLIConfig(t testing.TB, n *harness.Node) cliConfig {
	return cliConfig{
		AMQP:            cliFreeAddr(t),
		Admin:           cliFreeAddr(t),
		StateDir:        filepath.Join(t.TempDir(), "state"),
		BackendName:     n.Name,
		BackendURL:      n.URL(),
		ShutdownTimeout: 5 * time.Second,
		LogFormat:       "text",
	}
}

func (c cliConfig) yaml() string {
	return fmt.Sprintf(`listen:
  amqp: %s
  admin: %s
state_dir: %s
shutdown_timeout: %s
log:
  format: %s
backends:
  - name: %s
    url: %q
`, c.AMQP, c.Admin, c.StateDir, c.ShutdownTimeout, c.LogFormat, c.BackendName, c.BackendURL) + c.Extra
}

func writeCLIConfig(t testing.TB, c cliConfig) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "amqp-mirror.yaml")
	cliWriteFile(t, path, c.yaml())
	return path
}

func cliWriteFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// serveConfig writes c to a file and serves it.
func (b cliBinary) serveConfig(t testing.TB, c cliConfig) *cliProxy {
	t.Helper()
	return b.serve(t, writeCLIConfig(t, c), nil)
}

// serve runs `amqp-mirror serve --config path args...` with env added, and returns once
// its listeners accept. The process is killed when the test ends if it still runs, and its
// stderr shown if the test failed.
func (b cliBinary) serve(t testing.TB, path string, env []string, args ...string) *cliProxy {
	t.Helper()
	p := &cliProxy{binary: b, configPath: path, stdout: &cliOutput{}, stderr: &cliOutput{}, done: make(chan struct{})}
	p.command = exec.Command(b.path, append([]string{"serve", "--config", path}, args...)...)
	p.command.Env = cliEnvironment(env)
	p.command.Stdout, p.command.Stderr = p.stdout, p.stderr
	if err := p.command.Start(); err != nil {
		t.Fatalf("start amqp-mirror serve: %v", err)
	}
	go func() {
		p.command.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			p.command.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("amqp-mirror serve --config %s, stderr:\n%s", path, p.stderr)
		}
	})

	testutil.Eventually(t, 10*time.Second, func() error {
		if p.exited() {
			t.Fatalf("amqp-mirror serve exited with %v before listening:\n%s", p.command.ProcessState, p.stderr)
		}
		amqpLine, ok := p.record(map[string]string{"msg": "AMQP listening"})
		if !ok {
			return errors.New("no \"AMQP listening\" line yet")
		}
		p.amqpAddr = amqpLine.text("addr")
		if adminLine, ok := p.record(map[string]string{"msg": "admin API listening"}); ok {
			p.adminAddr = adminLine.text("addr")
		}
		return nil
	})
	// The file is valid now; later a test may break it, and ctl --config with it.
	if settings, err := config.Load(path, nil); err == nil {
		p.token, _ = config.LoadAdminToken(settings)
	}
	return p
}

func (p *cliProxy) url(user, password string) string {
	return fmt.Sprintf("amqp://%s:%s@%s/", user, password, p.amqpAddr)
}

func (p *cliProxy) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *cliProxy) signal(t testing.TB, s syscall.Signal) {
	t.Helper()
	if err := p.command.Process.Signal(s); err != nil {
		t.Fatalf("signal %v: %v", s, err)
	}
}

// stop sends s and waits (at most 15s) for the process to exit; it returns the exit code
// and how long the exit took.
func (p *cliProxy) stop(t testing.TB, s syscall.Signal) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	p.signal(t, s)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("amqp-mirror serve still running 15s after %v:\n%s", s, p.stderr)
	}
	return p.command.ProcessState.ExitCode(), time.Since(start)
}

// ctl runs `amqp-mirror ctl` against p with --admin and --token, which work whatever the
// config file holds at the moment.
func (p *cliProxy) ctl(t testing.TB, args ...string) cliResult {
	t.Helper()
	if p.token == "" {
		t.Fatalf("no admin token was found for the proxy of %s", p.configPath)
	}
	return p.binary.run(t, nil, append([]string{"ctl", "--admin", p.adminAddr, "--token", p.token}, args...)...)
}

// ---- The proxy's log.

// cliRecord is one log line: its attributes by key, as slog's text or JSON handler wrote
// them (text values are strings; JSON values keep their JSON types).
type cliRecord map[string]any

func (r cliRecord) text(key string) string {
	switch v := r[key].(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// duration reads a duration: "12ms" from the text handler, nanoseconds from JSON.
func (r cliRecord) duration(key string) (time.Duration, bool) {
	switch v := r[key].(type) {
	case string:
		d, err := time.ParseDuration(v)
		return d, err == nil
	case float64:
		return time.Duration(v), true
	}
	return 0, false
}

// matches reports whether every key of want has its value in r.
func (r cliRecord) matches(want map[string]string) bool {
	for key, value := range want {
		if r.text(key) != value {
			return false
		}
	}
	return true
}

// cliParseRecords parses slog output, text or JSON, line by line.
func cliParseRecords(output string) []cliRecord {
	var records []cliRecord
	for _, line := range strings.Split(output, "\n") {
		if line == "" {
			continue
		}
		record := cliRecord{}
		if strings.HasPrefix(line, "{") {
			if json.Unmarshal([]byte(line), &record) == nil {
				records = append(records, record)
			}
			continue
		}
		for rest := line; rest != ""; {
			key, value, found := strings.Cut(rest, "=")
			if !found {
				break
			}
			if strings.HasPrefix(value, `"`) {
				quoted, err := strconv.QuotedPrefix(value)
				if err != nil {
					break
				}
				rest = strings.TrimPrefix(value[len(quoted):], " ")
				value, _ = strconv.Unquote(quoted)
			} else {
				value, rest, _ = strings.Cut(value, " ")
			}
			record[key] = value
		}
		records = append(records, record)
	}
	return records
}

func (p *cliProxy) record(want map[string]string) (cliRecord, bool) {
	return cliFindRecord(p.stderr.String(), want)
}

func cliFindRecord(output string, want map[string]string) (cliRecord, bool) {
	for _, r := range cliParseRecords(output) {
		if r.matches(want) {
			return r, true
		}
	}
	return nil, false
}

// awaitRecord waits (at most 5s) for a log line with the wanted attributes.
func (p *cliProxy) awaitRecord(t testing.TB, what string, want map[string]string) cliRecord {
	t.Helper()
	return p.awaitRecordAfter(t, 0, what, want)
}

// awaitRecordAfter is awaitRecord for lines written after the first mark bytes.
func (p *cliProxy) awaitRecordAfter(t testing.TB, mark int, what string, want map[string]string) cliRecord {
	t.Helper()
	var found cliRecord
	testutil.Eventually(t, 5*time.Second, func() error {
		var ok bool
		if found, ok = cliFindRecord(p.stderr.String()[mark:], want); !ok {
			return fmt.Errorf("no log line for %s with %v", what, want)
		}
		return nil
	})
	return found
}

// requireRecord fails the test unless the log already has a line with want.
func (p *cliProxy) requireRecord(t testing.TB, want map[string]string) {
	t.Helper()
	if _, ok := p.record(want); !ok {
		t.Errorf("no log line with %v; stderr:\n%s", want, p.stderr)
	}
}

// ---- Clients and brokers.

// cliClient is an AMQP connection through a proxy, opened before what the test does to
// the proxy, to show that it keeps working.
type cliClient struct {
	connection *amqp.Connection
	channel    *amqp.Channel
	queue      string
}

func newCLIClient(t testing.TB, p *cliProxy) *cliClient {
	t.Helper()
	conn, err := amqp.Dial(p.url("guest", "guest"))
	if err != nil {
		t.Fatalf("dial through the proxy: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	channel, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	queue, err := channel.QueueDeclare(queueName(t), false, true, false, false, nil)
	if err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	c := &cliClient{connection: conn, channel: channel, queue: queue.Name}
	c.requireUsable(t)
	return c
}

// requireUsable publishes a message on the client's channel and gets it back.
func (c *cliClient) requireUsable(t testing.TB) {
	t.Helper()
	if c.connection.IsClosed() {
		t.Fatalf("the client connection was closed")
	}
	body := fmt.Sprintf("still here at %s", time.Now().Format(time.RFC3339Nano))
	if err := c.channel.PublishWithContext(testContext(t, 5*time.Second), "", c.queue, false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		delivery, ok, err := c.channel.Get(c.queue, true)
		switch {
		case err != nil:
			t.Fatalf("basic.get: %v", err)
		case !ok:
			return errors.New("basic.get: queue empty")
		case string(delivery.Body) != body:
			t.Fatalf("basic.get: got %q, want %q", delivery.Body, body)
		}
		return nil
	})
}

// cliPublishAndGet declares an auto-delete queue, publishes body to it and consumes it.
func cliPublishAndGet(t testing.TB, conn *amqp.Connection, queue, body string) {
	t.Helper()
	channel, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	defer channel.Close()
	if _, err := channel.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	if err := channel.PublishWithContext(testContext(t, 5*time.Second), "", queue, false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	deliveries, err := channel.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume: %v", err)
	}
	select {
	case d := <-deliveries:
		if string(d.Body) != body {
			t.Fatalf("delivery: got %q, want %q", d.Body, body)
		}
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no delivery within 5s")
	}
}

// cliStallingConn is a client socket whose reads can be held back: once stalled, data
// read from the socket is not handed to the client library until release.
type cliStallingConn struct {
	net.Conn
	mu      sync.Mutex
	stalled chan struct{} // non-nil while stalled; closed by release
}

func (c *cliStallingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	gate := c.stalled
	c.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return n, err
}

func (c *cliStallingConn) stall() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stalled == nil {
		c.stalled = make(chan struct{})
	}
}

func (c *cliStallingConn) release() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stalled != nil {
		close(c.stalled)
		c.stalled = nil
	}
}

// cliFreeAddr returns a loopback address nothing listens on right now.
func cliFreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// cliAddUser creates user with password on n with full permissions on "/", and deletes
// it when the test ends.
func cliAddUser(t testing.TB, n *harness.Node, user, password string) {
	t.Helper()
	ctl := func(args ...string) ([]byte, error) {
		// Not t.Context(): the cleanup runs after it is cancelled.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return exec.CommandContext(ctx, "/usr/lib/rabbitmq/bin/rabbitmqctl", append([]string{"-n", n.ErlangName, "-q"}, args...)...).CombinedOutput()
	}
	for _, args := range [][]string{
		{"add_user", user, password},
		{"set_permissions", "-p", "/", user, ".*", ".*", ".*"},
	} {
		if output, err := ctl(args...); err != nil {
			t.Fatalf("rabbitmqctl %s: %v\n%s", args[0], err, output)
		}
	}
	t.Cleanup(func() {
		if output, err := ctl("delete_user", user); err != nil {
			t.Errorf("rabbitmqctl delete_user: %v\n%s", err, output)
		}
	})
}

// amqpErrorDetails returns the reply code and text of an AMQP error, or 0 and err's text.
func amqpErrorDetails(err error) (int, string) {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e.Code, e.Reason
	}
	return 0, fmt.Sprint(err)
}

// cliFlagDescriptions reads the flags of a pflag usage text: name → description.
func cliFlagDescriptions(usage string) map[string]string {
	flagLine := regexp.MustCompile(`^\s+(?:-\w, )?--([\w.-]+)(?: [\w]+)?(?:\s{2,}(.*))?$`)
	described := map[string]string{}
	for _, line := range strings.Split(usage, "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			described[m[1]] = strings.TrimSpace(m[2])
		}
	}
	return described
}
