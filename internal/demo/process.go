package demo

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// proxyProcess is one `amqp-mirror serve` the demo runs beside a node, until stop.
type proxyProcess struct {
	name, logPath string
	cmd           *exec.Cmd
	done          chan struct{} // closed once the process has exited
}

// startProxy runs argv (`amqp-mirror serve --config FILE`) as the proxy beside node, with
// its output in logPath. The child gets SIGTERM if the demo dies (Pdeathsig); that signal
// follows the thread that started the child, so the goroutine keeps its thread locked until
// the child has exited.
func startProxy(node, logPath string, argv ...string) (*proxyProcess, error) {
	c := &proxyProcess{name: node, logPath: logPath, done: make(chan struct{})}
	logFile, err := os.Create(c.logPath)
	if err != nil {
		return nil, err
	}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := c.cmd.Start()
		started <- err
		if err == nil {
			c.cmd.Wait()
		}
		logFile.Close()
		close(c.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting the proxy beside %s: %w", c.name, err)
	}
	return c, nil
}

// pid is the process's id.
func (c *proxyProcess) pid() int { return c.cmd.Process.Pid }

// awaitListening waits until the proxy accepts AMQP connections at addr.
func (c *proxyProcess) awaitListening(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("the proxy beside %s exited (%v); its log: %s", c.name, c.cmd.ProcessState, c.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the proxy beside %s does not listen on %s after %v; its log: %s", c.name, addr, timeout, c.logPath)
		}
	}
}

// stop ends the proxy gracefully, or kills it after 15 s.
func (c *proxyProcess) stop(logger *slog.Logger) {
	select {
	case <-c.done:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		logger.Warn("a proxy did not stop within 15s; killing it", "node", c.name)
		c.cmd.Process.Kill()
		<-c.done
	}
}
