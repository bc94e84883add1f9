package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// The helpers of cli_test.go: building, running and configuring the real binary.

// cliBuild holds the amqp-mirror executable, built once per package run into dir, which
// removeCLIBuild removes when the run ends.
var cliBuild struct {
	once      sync.Once
	dir, path string
	err       error
}

// cliBinary is the amqp-mirror executable one test runs.
type cliBinary struct{ path string }

// newCLI builds amqp-mirror (once per package run) and links it into t's temporary
// directory. A link, not a copy: a file this process wrote is open for writing in every
// child another test forks meanwhile until that child execs, and running it then fails
// with "text file busy" (ETXTBSY; seen in CI). go build writes the original in a process
// of its own.
func newCLI(t testing.TB) cliBinary {
	t.Helper()
	cliBuild.once.Do(func() {
		cliBuild.dir, cliBuild.err = os.MkdirTemp("", "amqp-mirror-cli-")
		if cliBuild.err != nil {
			return
		}
		cliBuild.path = filepath.Join(cliBuild.dir, "amqp-mirror")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		output, err := exec.CommandContext(ctx, "go", "build", "-o", cliBuild.path, "github.com/amqp-mirror/amqp-mirror").CombinedOutput()
		if err != nil {
			cliBuild.err = fmt.Errorf("go build: %v\n%s", err, output)
		}
	})
	if cliBuild.err != nil {
		t.Fatalf("building amqp-mirror: %v", cliBuild.err)
	}
	path := filepath.Join(t.TempDir(), "amqp-mirror")
	if err := os.Link(cliBuild.path, path); err != nil {
		// Another file system: cp writes the copy in a process of its own.
		if output, err := exec.Command("cp", cliBuild.path, path).CombinedOutput(); err != nil {
			t.Fatalf("copying amqp-mirror: %v\n%s", err, output)
		}
	}
	return cliBinary{path: path}
}

// removeCLIBuild removes what newCLI built, if anything.
func removeCLIBuild() {
	if cliBuild.dir != "" {
		os.RemoveAll(cliBuild.dir)
	}
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
	return b.runInput(t, "", env, args...)
}

// runInput is run with stdin as the command's standard input.
func (b cliBinary) runInput(t testing.TB, stdin string, env []string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	command := exec.CommandContext(ctx, b.path, args...)
	command.Env = cliEnvironment(env)
	command.Stdin = strings.NewReader(stdin)
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
	gossipAddr string // cluster.bind, for a sidecar
	raftAddr   string // cluster.raft_bind, for a sidecar
	token      string // the admin token, read from state_dir once it listens
	command    *exec.Cmd
	stdout     *cliOutput
	stderr     *cliOutput
	done       chan struct{} // closed once the process has exited and been reaped
}

// cliConfig is the part of the config file the tests vary.
type cliConfig struct {
	AMQP, Admin     string
	AMQPS           string // with TLSCert and TLSKey: the AMQPS listener
	TLSCert, TLSKey string
	StateDir        string
	BackendName     string
	BackendURL      string
	ShutdownTimeout time.Duration
	LogFormat       string
	Extra           string // more YAML, appended

	// AdminTLSCert and AdminTLSKey serve the admin API over HTTPS;
	// AdminTLSCA is listen.admin_tls.ca, what ctl --config trusts.
	AdminTLSCert, AdminTLSKey, AdminTLSCA string
}

// newCLIConfig is a config for a proxy in front of n on free loopback ports, with its
// state in t's temporary directory.
func newCLIConfig(t testing.TB, n *localbroker.Node) cliConfig {
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
	tls := ""
	if c.TLSCert != "" {
		tls = fmt.Sprintf("  amqps: %s\n  tls: {cert: %q, key: %q}\n", c.AMQPS, c.TLSCert, c.TLSKey)
	}
	if c.AdminTLSCert != "" {
		tls += fmt.Sprintf("  admin_tls: {cert: %q, key: %q, ca: %q}\n", c.AdminTLSCert, c.AdminTLSKey, c.AdminTLSCA)
	}
	return fmt.Sprintf(`listen:
  amqp: %s
  admin: %s
%sstate_dir: %s
shutdown_timeout: %s
log:
  format: %s
backends:
  - name: %s
    url: %q
`, c.AMQP, c.Admin, tls, c.StateDir, c.ShutdownTimeout, c.LogFormat, c.BackendName, c.BackendURL) + c.Extra
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

// writeExecutable writes a script the tests run directly. install(1) writes the file
// that is run, in a process of its own, for the reason newCLI links its binary.
func writeExecutable(t testing.TB, path, content string) {
	t.Helper()
	source := path + ".source"
	cliWriteFile(t, source, content)
	if output, err := exec.Command("install", "-m", "0755", source, path).CombinedOutput(); err != nil {
		t.Fatalf("install %s: %v\n%s", path, err, output)
	}
	os.Remove(source)
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
	res := p.binary.run(t, nil, append([]string{"ctl", "--admin", p.adminAddr, "--token", p.token}, args...)...)
	if strings.Contains(res.stdout+res.stderr, p.token) {
		t.Errorf("ctl %s printed the admin token", strings.Join(args, " "))
	}
	return res
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

// cliFreeAddr returns a loopback address nothing listens on right now, and that no other
// call in this test process returned.
//
// The ports are below Linux's ephemeral range (32768-60999): a port picked there and
// closed again can be taken as the local port of any outgoing connection (the proxies dial
// brokers and each other) before the proxy binds it, which failed a start with "address
// already in use". Each part of a parallel run (partVariable) picks from its own slice of
// the range, and a port is handed out once per process: a proxy restarted on its port
// (the sidecar tests stop and start nodes) found it taken by a proxy of another part that
// had picked it while the first was down (a CI-like run, TestSidecarDeletedWhileNodeDown).
func cliFreeAddr(t testing.TB) string {
	t.Helper()
	low, span := proxyPortRange()
	for range 200 {
		port := low + rand.IntN(span)
		if _, taken := handedOutPorts.LoadOrStore(port, true); taken {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		return ln.Addr().String()
	}
	t.Fatalf("no free port left in %d-%d", low, low+span-1)
	return ""
}

// handedOutPorts are the ports cliFreeAddr returned in this process.
var handedOutPorts sync.Map

// proxyPortRange is the slice of 20000-31999 this process picks proxy ports from: all of
// it alone, part i's share when partVariable says "i/n".
func proxyPortRange() (low, span int) {
	low, span = 20000, 12000
	index, count, found := strings.Cut(os.Getenv(partVariable), "/")
	i, errIndex := strconv.Atoi(index)
	n, errCount := strconv.Atoi(count)
	if !found || errIndex != nil || errCount != nil || n < 1 || i < 1 || i > n {
		return low, span
	}
	span /= n
	return low + (i-1)*span, span
}

// cliAddUser creates user with password on n with full permissions on "/", and deletes
// it when the test ends.
func cliAddUser(t testing.TB, n *localbroker.Node, user, password string) {
	t.Helper()
	ctl := func(args ...string) ([]byte, error) {
		// Not t.Context(): the cleanup runs after it is cancelled.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return n.Ctl(ctx, args...)
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

// cliErrorKeys returns "source: key" of each config error in stderr ("config file F:
// backends[0].url", "flag --frame_max: frame_max"), in order, repeats included.
func cliErrorKeys(stderr string) []string {
	errorLine := regexp.MustCompile(`((?:config file \S+|config \(no file\)|flag --\S+|environment \S+): [a-z_][\w.\-]*(?:\[\d+\][\w.\-]*)*): (?:expected|unknown key|at least)`)
	var keys []string
	for _, m := range errorLine.FindAllStringSubmatch(stderr, -1) {
		keys = append(keys, m[1])
	}
	return keys
}
