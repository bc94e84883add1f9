package localbroker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// wrapperScript runs rabbitmq-server as a child and ties its life to this process.
//
// $0 is the Erlang node name, there only so that ps shows which node a wrapper belongs to;
// $1 is the path of rabbitmq-server. The wrapper is the leader of the node's process group.
// Its stdin is the read end of the lifeline pipe: the watcher subshell blocks reading it and,
// when the write end closes because the process that started it ended, kills the whole group.
// SIGTERM is forwarded to rabbitmq-server, whose own trap stops the broker gracefully.
// The wrapper exits with the broker's status.
//
// Pdeathsig is not used instead: it fires when the parent *thread* exits, which Go does
// not promise to keep alive, and it would only reach the first process, not beam.smp.
const wrapperScript = `
exec 3<&0 </dev/null
"$1" 3<&- &
server=$!
( read -r _ <&3; kill -KILL 0 ) &
watcher=$!
exec 3<&-
trap 'kill -TERM "$server" 2>/dev/null' TERM
while :; do
	wait "$server"
	status=$?
	kill -0 "$server" 2>/dev/null || break
done
kill -KILL "$watcher" 2>/dev/null
exit "$status"
`

// errPortInUse marks a start that failed because another process took a port between
// Start picking it and the node binding it.
var errPortInUse = errors.New("port already in use")

// Node is one RabbitMQ node. Its names, ports and directory never change after Start, so
// Restart brings back the same node with the same data. Its methods are safe to call from
// several goroutines.
type Node struct {
	// Name is the logical name, e.g. "rabbit1".
	Name string
	// ErlangName is the Erlang node name, unique per process that runs this
	// package:
	// amqpm-<pid>-<name>@localhost. It is also the broker's cluster_name.
	ErlangName string
	// Port is the AMQP port on 127.0.0.1.
	Port int
	// DistPort is the Erlang distribution port on 127.0.0.1.
	DistPort int
	// Dir holds the node's config, data (mnesia/), logs (log/) and console output.
	Dir string

	serverPath string
	logger     *slog.Logger

	mu      sync.Mutex
	current *process // nil when no process was started or the last one was stopped
}

// process is one run of the node, from launch to exit.
type process struct {
	command    *exec.Cmd
	erlangName string
	lifeline   *os.File // write end of the wrapper's stdin; closed after the wrapper exits
	beamPID    int      // 0 until the node is ready
	stopping   atomic.Bool
	done       chan struct{} // closed once the wrapper has exited and been reaped
}

func newNode(name, baseDir, serverPath, extraConfig string, logger *slog.Logger) (*Node, error) {
	node := &Node{
		Name:       name,
		ErlangName: fmt.Sprintf("amqpm-%d-%s@localhost", os.Getpid(), name),
		Dir:        filepath.Join(baseDir, name),
		serverPath: serverPath,
		logger:     logger.With("node", name),
	}
	if err := os.MkdirAll(filepath.Join(node.Dir, "log"), 0o755); err != nil {
		return nil, fmt.Errorf("localbroker: %w", err)
	}
	config := strings.Join([]string{
		"loopback_users = none",
		// Readiness checks compare it, so a broker started by another process that happens to hold
		// our port is not mistaken for ours.
		"cluster_name = " + node.ErlangName,
		"log.console = false",
		"log.file.level = info",
		// Test machines have small disks; the default 50MB alarm would block publishers.
		"disk_free_limit.absolute = 1MB",
		extraConfig,
		"",
	}, "\n")
	files := map[string]string{
		"rabbitmq.conf":   config,
		"enabled_plugins": "[].\n",
		// Empty, so that /etc/rabbitmq/rabbitmq-env.conf cannot override our environment.
		"rabbitmq-env.conf": "",
	}
	for file, content := range files {
		if err := os.WriteFile(filepath.Join(node.Dir, file), []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("localbroker: %w", err)
		}
	}
	return node, nil
}

// URL is the node's AMQP URL for the guest user.
func (n *Node) URL() string {
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.Port)
}

// LogFile is the broker's own log.
func (n *Node) LogFile() string {
	return filepath.Join(n.Dir, "log", n.ErlangName+".log")
}

// Running reports whether the node has been started and has not exited. It is true while
// the node boots in Start or Restart, and false from the moment Stop or Kill begins.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.current != nil && !n.current.exited()
}

// PID is the operating-system pid of the node's Erlang VM (beam.smp), or 0 when it is not
// running.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.current == nil || n.current.exited() {
		return 0
	}
	return n.current.beamPID
}

// Processes lists the live processes that belong to this node; see ProcessesOf.
func (n *Node) Processes() ([]int, error) { return ProcessesOf(n.ErlangName) }

// Stop stops the node gracefully (SIGTERM, which RabbitMQ handles as a clean shutdown) and
// waits for it to exit. When ctx ends first the node is killed and ctx's error returned.
// Stopping a node that is not running does nothing.
func (n *Node) Stop(ctx context.Context) error {
	p := n.take()
	if p == nil {
		return nil
	}
	p.stopping.Store(true)
	n.logger.Info("stopping rabbitmq node")
	if err := p.command.Process.Signal(syscall.SIGTERM); err != nil && !p.exited() {
		p.kill()
		return fmt.Errorf("stop %s: %w", n.Name, err)
	}
	select {
	case <-p.done:
		return p.awaitGone()
	case <-ctx.Done():
		p.kill()
		return fmt.Errorf("stop %s: %w", n.Name, context.Cause(ctx))
	}
}

// Kill sends SIGKILL to the node's whole process group, as a crash would, and waits until
// the Erlang VM is gone. It takes no context: SIGKILL cannot be refused, so the wait is
// bounded by the kernel. Killing a node that is not running does nothing.
func (n *Node) Kill() error {
	p := n.take()
	if p == nil {
		return nil
	}
	n.logger.Info("killing rabbitmq node")
	return p.kill()
}

// FlushMetadata makes the node write its metadata log to disk, including the outcome of
// every queue, exchange and binding change it has already answered, so that a Kill after it
// loses none of them. RabbitMQ 3.10 does not promise that by itself: a durable queue's
// declare-ok can come up to two seconds before a kill -9 stops losing the queue (see the
// package documentation).
func (n *Node) FlushMetadata(ctx context.Context) error {
	// A transaction's outcome reaches the log through a cast to mnesia_recover, sent before
	// the transaction returned. On one node a message is in its receiver's queue once sent,
	// so the sys call returns only after mnesia_recover handled that cast and passed the
	// record to the log; disk_log:sync then writes the log's in-memory cache and fsyncs it.
	const expression = `sys:get_state(mnesia_recover), ok = disk_log:sync(latest_log), ""`
	if _, err := n.Eval(ctx, expression); err != nil {
		return fmt.Errorf("flush metadata: %w", err)
	}
	return nil
}

// Ctl runs rabbitmqctl against the node (the CLI beside the server, not Debian's
// /usr/sbin wrapper, which switches user) and returns what it printed. Each call boots an
// Erlang VM: Eval is the cheap way to look at a node.
func (n *Node) Ctl(ctx context.Context, args ...string) ([]byte, error) {
	rabbitmqctl := filepath.Join(filepath.Dir(n.serverPath), "rabbitmqctl")
	output, err := exec.CommandContext(ctx, rabbitmqctl, append([]string{"-n", n.ErlangName, "-q"}, args...)...).CombinedOutput()
	if err != nil {
		return output, fmt.Errorf("rabbitmqctl %s on %s: %w: %s", strings.Join(args, " "), n.Name, err, bytes.TrimSpace(output))
	}
	return output, nil
}

// Restart stops the node gracefully if it is running, then starts it again on the same
// AMQP port with the same data and waits until it accepts AMQP connections.
func (n *Node) Restart(ctx context.Context) error {
	if err := n.Stop(ctx); err != nil {
		return err
	}
	return n.startAgain(ctx)
}

// startAgain starts a node that ran before on its AMQP port, which its clients know.
// Another process may have taken its distribution port meanwhile (a connection's
// ephemeral port, on a busy host): the node then starts on another one, which nobody
// outside it needs (rabbitmqctl finds it through epmd).
func (n *Node) startAgain(ctx context.Context) error {
	const attempts = 3
	for attempt := 1; ; attempt++ {
		err := n.start(ctx)
		if err == nil || !errors.Is(err, errPortInUse) || attempt == attempts {
			return err
		}
		ports, portErr := freePorts(1)
		if portErr != nil {
			return err
		}
		n.logger.Warn("port clash on a restart, retrying with another distribution port", "error", err)
		n.DistPort = ports[0]
	}
}

// Wipe kills the node if it is running and deletes its data; the next Restart boots an
// empty broker. Killing rather than stopping saves a graceful shutdown of data about to be
// deleted. Logs are kept.
func (n *Node) Wipe() error {
	if err := n.Kill(); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(n.Dir, "mnesia")); err != nil {
		return fmt.Errorf("wipe %s: %w", n.Name, err)
	}
	return nil
}

// take detaches the current process, so that exactly one caller stops or kills it.
func (n *Node) take() *process {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.current
	n.current = nil
	return p
}

// startFirstTime picks free ports and starts the node, picking again when another process
// took a port in between.
func (n *Node) startFirstTime(ctx context.Context) error {
	const attempts = 3
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return fmt.Errorf("start %s: %w", n.Name, err)
		}
		n.Port, n.DistPort = ports[0], ports[1]
		err = n.start(ctx)
		if err == nil || !errors.Is(err, errPortInUse) || attempt == attempts {
			return err
		}
		n.logger.Warn("port clash, retrying with other ports", "error", err)
	}
}

// start launches the node and waits until it is ready; on failure it leaves nothing running.
func (n *Node) start(ctx context.Context) error {
	began := time.Now()
	p, err := n.launch()
	if err != nil {
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	n.mu.Lock()
	n.current = p
	n.mu.Unlock()
	if err := n.awaitReady(ctx, p); err != nil {
		n.take()
		p.kill()
		return fmt.Errorf("start %s (%s, port %d, dist port %d): %w", n.Name, n.ErlangName, n.Port, n.DistPort, err)
	}
	n.mu.Lock()
	p.beamPID = findBeam(p.command.Process.Pid)
	n.mu.Unlock()
	n.logger.Info("rabbitmq node ready", "erlang_name", n.ErlangName, "port", n.Port,
		"pid", p.beamPID, "elapsed", time.Since(began).Round(time.Millisecond))
	return nil
}

func (n *Node) launch() (*process, error) {
	console, err := os.OpenFile(filepath.Join(n.Dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer console.Close()
	lifelineRead, lifelineWrite, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer lifelineRead.Close()

	command := exec.Command("/bin/sh", "-c", wrapperScript, n.ErlangName, n.serverPath)
	command.Dir = n.Dir
	command.Env = n.environment()
	command.Stdin = lifelineRead
	command.Stdout = console
	command.Stderr = console
	command.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := command.Start(); err != nil {
		lifelineWrite.Close()
		return nil, err
	}
	p := &process{command: command, erlangName: n.ErlangName, lifeline: lifelineWrite, done: make(chan struct{})}
	go func() {
		err := command.Wait()
		p.lifeline.Close()
		if !p.stopping.Load() {
			n.logger.Warn("rabbitmq node exited unexpectedly", "error", err, "log", n.LogFile())
		}
		close(p.done)
	}()
	return p, nil
}

func (n *Node) environment() []string {
	var environment []string
	for _, variable := range os.Environ() {
		// Anything RabbitMQ-specific from the caller would override or confuse ours;
		// NOTIFY_SOCKET makes rabbitmq-server exec the VM in place of its signal trap.
		if strings.HasPrefix(variable, "RABBITMQ_") || strings.HasPrefix(variable, "NOTIFY_SOCKET=") ||
			strings.HasPrefix(variable, "ERL_CRASH_DUMP") {
			continue
		}
		environment = append(environment, variable)
	}
	return append(environment,
		"RABBITMQ_NODENAME="+n.ErlangName,
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", n.Port),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", n.DistPort),
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.Dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(n.Dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(n.Dir, "enabled_plugins"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(n.Dir, "rabbitmq"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(n.Dir, "rabbitmq-env.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(n.Dir, "advanced.config"),
		// A crash dump takes seconds to write and the logs say enough.
		"ERL_CRASH_DUMP_SECONDS=0",
	)
}

// awaitReady polls until the node accepts an AMQP connection and says it is ours.
func (n *Node) awaitReady(ctx context.Context, p *process) error {
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	var last error
	for {
		select {
		case <-p.done:
			return n.exitError()
		case <-ctx.Done():
			return fmt.Errorf("not ready (last: %v): %w", last, context.Cause(ctx))
		case <-ticker.C:
		}
		last = n.probe()
		if last == nil {
			return nil
		}
	}
}

func (n *Node) probe() error {
	connection, err := amqp.DialConfig(n.URL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return err
	}
	defer connection.Close()
	if name := connection.Properties["cluster_name"]; name != n.ErlangName {
		return fmt.Errorf("%w: 127.0.0.1:%d is held by another broker (cluster_name %v)", errPortInUse, n.Port, name)
	}
	return nil
}

// exitError explains a node that exited while starting, with the end of its output.
func (n *Node) exitError() error {
	var output []byte
	for _, file := range []string{filepath.Join(n.Dir, "console.log"), n.LogFile()} {
		output = append(output, tail(file, 4096)...)
	}
	err := errors.New("exited while starting")
	if bytes.Contains(output, []byte("eaddrinuse")) || bytes.Contains(output, []byte("dist_port_already_used")) {
		err = errPortInUse
	}
	return fmt.Errorf("%w; end of %s and %s:\n%s", err, filepath.Join(n.Dir, "console.log"), n.LogFile(), output)
}

func tail(path string, size int64) []byte {
	file, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer file.Close()
	if info, err := file.Stat(); err == nil && info.Size() > size {
		file.Seek(-size, io.SeekEnd)
	}
	content, _ := io.ReadAll(file)
	return content
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL to the process group and waits for all of the node's processes to go.
func (p *process) kill() error {
	p.stopping.Store(true)
	if err := syscall.Kill(-p.command.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill process group %d: %w", p.command.Process.Pid, err)
	}
	<-p.done
	return p.awaitGone()
}

// awaitGone waits until no process of the node is left: the wrapper is reaped a moment
// before the VM has released its ports, and erl_child_setup and inet_gethost, which sit in
// sessions of their own, only exit once they notice the VM is gone. Stragglers are killed
// by pid; ProcessesOf finds only processes carrying this node's unique name.
func (p *process) awaitGone() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := ProcessesOf(p.erlangName)
		if err != nil || len(pids) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes of %s still alive 10s after it stopped: %v", p.erlangName, pids)
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePorts returns count distinct ports that were free on 127.0.0.1 a moment ago.
func freePorts(count int) ([]int, error) {
	var listeners []net.Listener
	defer func() {
		for _, listener := range listeners {
			listener.Close()
		}
	}()
	var ports []int
	for range count {
		listener, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, listener)
		ports = append(ports, listener.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
