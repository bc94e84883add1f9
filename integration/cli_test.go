package integration

// End-to-end tests of the amqp-mirror binary: the real executable, started the way an
// operator starts it (serve --config FILE, ctl, signals, file edits), in front of the
// package's RabbitMQ nodes. What the tests know of the process is what an operator sees:
// exit codes, stdout, stderr and the AMQP and admin listeners.

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
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
			// The slack is the process's own exit on a loaded machine.
			if elapsed > tc.shutdownTimeout+3*time.Second || elapsed < tc.wantMinimum {
				t.Errorf("the process exited %v after %v; want between %v and shutdown_timeout %v (+3s)", elapsed, tc.signal, tc.wantMinimum, tc.shutdownTimeout)
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

func TestCLIHelp(t *testing.T) {
	cli := newCLI(t)
	serveFlags := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	config.RegisterFlags(serveFlags)
	wantServe := []string{"config"}
	serveFlags.VisitAll(func(f *pflag.Flag) { wantServe = append(wantServe, f.Name) })
	ctlFlags := []string{"config", "admin", "admin-ca", "token", "timeout", "vhost", "quiet", "formatter"}

	cases := []struct {
		name      string
		args      []string
		wantFlags []string
		wantOut   []string
	}{
		{name: "serve --help", args: []string{"serve", "--help"}, wantFlags: wantServe, wantOut: []string{"Usage: amqp-mirror serve", "SIGHUP", "GOMEMLIMIT"}},
		{name: "help serve", args: []string{"help", "serve"}, wantFlags: wantServe, wantOut: []string{"Usage: amqp-mirror serve"}},
		{name: "ctl --help", args: []string{"ctl", "--help"}, wantFlags: ctlFlags, wantOut: []string{"Usage: amqp-mirror ctl"}},
		{name: "help ctl", args: []string{"help", "ctl"}, wantFlags: ctlFlags, wantOut: []string{"Usage: amqp-mirror ctl", "before or after the command"}},
		{name: "demo --help", args: []string{"demo", "--help"}, wantFlags: []string{"nodes", "listen", "admin", "dir"}, wantOut: []string{"Usage: amqp-mirror demo"}},
		{name: "ctl help", args: []string{"ctl", "help"}, wantFlags: ctlFlags},
		{name: "ctl help set_policy", args: []string{"ctl", "help", "set_policy"}, wantOut: []string{"Usage: amqp-mirror ctl set_policy [-p VHOST]"}},
		{name: "ctl set_policy --help", args: []string{"ctl", "set_policy", "--help"}, wantFlags: []string{"vhost", "quiet", "help", "priority", "apply-to"}},
		{name: "ctl list_policies --help", args: []string{"ctl", "list_policies", "--help"}, wantFlags: []string{"vhost", "quiet", "help", "explain", "formatter", "config", "admin", "token"}},
		{name: "help", args: []string{"help"}, wantOut: []string{"amqp-mirror serve", "amqp-mirror ctl", "amqp-mirror demo", "amqp-mirror keygen", "amqp-mirror tls", "amqp-mirror version"}},
		{name: "--version", args: []string{"--version"}, wantOut: []string{"amqp-mirror ", " (go1."}},
		{name: "version", args: []string{"version"}, wantOut: []string{"amqp-mirror ", " (go1."}},
		{name: "help tls", args: []string{"help", "tls"}, wantOut: []string{"amqp-mirror tls ca", "amqp-mirror tls cert member NAME", "identity"}},
		{name: "tls cert --help", args: []string{"tls", "cert", "--help"}, wantFlags: []string{"dir", "identity", "dns", "ip", "days"}, wantOut: []string{"amqp-mirror tls cert server"}},
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
		for _, command := range []string{"set_policy", "clear_policy", "list_policies", "set_operator_policy", "clear_operator_policy", "list_operator_policies",
			"cluster_status", "list_connections", "list_consumers", "help"} {
			if !regexp.MustCompile(`(?m)^  ` + command + `\s{2,}\w.*$`).MatchString(r.stdout) {
				t.Errorf("%s: no line for %s with what it does; got:\n%s", strings.Join(args, " "), command, r.stdout)
			}
		}
	}

	// Help and the configuration reference tell the same story: what is not
	// used yet, and what a reload does.
	r := cli.run(t, nil, "help", "serve")
	described := cliFlagDescriptions(r.stdout)
	for _, name := range []string{"cluster.bind", "cluster.join"} {
		if strings.Contains(described[name], config.NotUsedYet) {
			t.Errorf("--%s: description %q still says %q; serve starts the sidecar cluster", name, described[name], config.NotUsedYet)
		}
	}
	reference, err := os.ReadFile("../docs/configuration.md")
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
		if !strings.Contains(strings.ToLower(flat(string(reference))), strings.ToLower(same)) {
			t.Errorf("docs/configuration.md does not say %q", same)
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
