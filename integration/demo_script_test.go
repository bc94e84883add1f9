package integration

import (
	"bytes"
	"errors"
	"fmt"
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

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// demoReadyLine is what the demo prints once its proxy listens.
const demoReadyLine = "amqp-mirror is running."

// demoStartTimeout bounds the script's build (cold on a fresh clone: the tests compiled
// with -race, the demo does not) and the broker's boot.
const demoStartTimeout = 4 * time.Minute

var (
	demoStartingLine = regexp.MustCompile(`Starting 1 RabbitMQ node under (\S+) `)
	demoProxyLine    = regexp.MustCompile(`proxy: +amqp://guest:guest@(\S+) `)
)

// TestDemoScriptStopsItsBrokers runs scripts/demo.sh as a user would, then stops it by the
// script's pid, as a process supervisor or `kill <pid>` would: the demo must exit and take
// every broker it started with it, leaving nothing orphaned.
func TestDemoScriptStopsItsBrokers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		signal syscall.Signal
	}{
		{"SIGTERM", syscall.SIGTERM},
		{"SIGINT", syscall.SIGINT},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// One node keeps the run short; the broker count does not change how the demo
			// stops them.
			ports := freePorts(t, 2)
			demo := startDemoScript(t, "--nodes", "1",
				"--listen", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--admin", fmt.Sprintf("127.0.0.1:%d", ports[1]))
			output := demo.awaitReady(t)
			starting := demoStartingLine.FindStringSubmatch(output)
			if starting == nil {
				t.Fatalf("output lacks %q:\n%s", demoStartingLine, output)
			}
			proxyAddress := demoProxyLine.FindStringSubmatch(output)
			if proxyAddress == nil {
				t.Fatalf("output lacks the proxy's address (%q):\n%s", demoProxyLine, output)
			}
			testutil.Eventually(t, 10*time.Second, func() error {
				connection, err := net.DialTimeout("tcp", proxyAddress[1], time.Second)
				if err != nil {
					return fmt.Errorf("the proxy at %s does not accept: %w", proxyAddress[1], err)
				}
				return connection.Close()
			})
			brokers := demo.brokers(t)
			if len(brokers) != 1 {
				t.Fatalf("beam.smp processes started by the script (pid %d): got %v, want 1", demo.command.Process.Pid, brokers)
			}

			if err := demo.command.Process.Signal(c.signal); err != nil {
				t.Fatalf("signal %v to the script: %v", c.signal, err)
			}
			select {
			case <-demo.exited:
			case <-time.After(time.Minute):
				t.Fatalf("the script did not exit within a minute of %v; output:\n%s", c.signal, demo.output())
			}
			if code := demo.command.ProcessState.ExitCode(); code != 0 {
				t.Errorf("the script's exit code after %v: got %d, want 0; output:\n%s", c.signal, code, demo.output())
			}
			testutil.Eventually(t, 10*time.Second, func() error {
				for _, broker := range brokers {
					if broker.alive() {
						return fmt.Errorf("broker %s (beam.smp pid %d) still runs after the demo exited", broker.erlangName, broker.pid)
					}
					pids, err := localbroker.ProcessesOf(broker.erlangName)
					if err != nil || len(pids) > 0 {
						return fmt.Errorf("processes of broker %s after the demo exited: %v (error %v)", broker.erlangName, pids, err)
					}
				}
				return nil
			})
			if _, err := os.Stat(starting[1]); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the demo's directory %s after it exited: got %v, want it removed", starting[1], err)
			}
		})
	}
}

// TestDemoScriptRefusesBadAddresses gives the demo an address it cannot listen on: it must
// fail before starting any broker, naming the address and the flag that changes it.
func TestDemoScriptRefusesBadAddresses(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the parallel subtests, unlike a defer
	cases := []struct {
		name    string
		flag    string
		address string
		want    []string
	}{
		{"AMQP address in use", "--listen", busy.Addr().String(),
			[]string{busy.Addr().String(), "choose another with --listen", "address already in use"}},
		{"admin address in use", "--admin", busy.Addr().String(),
			[]string{busy.Addr().String(), "choose another with --admin", "address already in use"}},
		{"port 0", "--listen", "127.0.0.1:0", []string{"127.0.0.1:0 has no port from 1 to 65535", "set one with --listen"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ports := freePorts(t, 2)
			addresses := map[string]string{
				"--listen": fmt.Sprintf("127.0.0.1:%d", ports[0]),
				"--admin":  fmt.Sprintf("127.0.0.1:%d", ports[1]),
			}
			addresses[c.flag] = c.address
			demo := startDemoScript(t, "--nodes", "1", "--listen", addresses["--listen"], "--admin", addresses["--admin"])
			select {
			case <-demo.exited:
			case <-time.After(demoStartTimeout):
				t.Fatalf("the script still runs %v after it started; output:\n%s", demoStartTimeout, demo.output())
			}
			output := demo.output()
			if code := demo.command.ProcessState.ExitCode(); code != 1 {
				t.Errorf("exit code: got %d, want 1; output:\n%s", code, output)
			}
			for _, want := range c.want {
				if !strings.Contains(output, want) {
					t.Errorf("output lacks %q:\n%s", want, output)
				}
			}
			if strings.Contains(output, "Starting") {
				t.Errorf("the demo started brokers before it checked its addresses:\n%s", output)
			}
		})
	}
}

// demoScript is a run of scripts/demo.sh. Its stdout and stderr go to one buffer.
type demoScript struct {
	command *exec.Cmd
	exited  chan struct{} // closed once the script has exited and been reaped

	mu     sync.Mutex
	buffer bytes.Buffer
	family []process // the script's descendants when brokers last looked
}

func (d *demoScript) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.buffer.Write(p)
}

func (d *demoScript) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.buffer.String()
}

// startDemoScript starts scripts/demo.sh with args. When the test ends, the script and the
// descendants brokers saw are killed with SIGKILL if still running, so that a script that
// orphans its demo (as `go run` did) fails the test without leaving the demo behind.
func startDemoScript(t *testing.T, args ...string) *demoScript {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "scripts", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	demo := &demoScript{command: exec.Command(script, args...), exited: make(chan struct{})}
	demo.command.Stdout = demo
	demo.command.Stderr = demo
	// An orphaned descendant would hold the output pipe open and Wait would never return.
	demo.command.WaitDelay = 5 * time.Second
	if err := demo.command.Start(); err != nil {
		t.Fatalf("start %s: %v", script, err)
	}
	go func() {
		demo.command.Wait()
		close(demo.exited)
	}()
	t.Cleanup(func() {
		demo.command.Process.Kill()
		<-demo.exited
		demo.mu.Lock()
		defer demo.mu.Unlock()
		for _, p := range demo.family {
			if p.alive() {
				syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
	})
	return demo
}

// awaitReady waits until the demo says it is running and returns its output so far.
func (d *demoScript) awaitReady(t *testing.T) string {
	t.Helper()
	testutil.Eventually(t, demoStartTimeout, func() error {
		select {
		case <-d.exited:
			t.Fatalf("the script exited (%v) before the demo was ready; output:\n%s", d.command.ProcessState, d.output())
		default:
		}
		if !strings.Contains(d.output(), demoReadyLine) {
			return fmt.Errorf("the demo has not printed %q; output so far:\n%s", demoReadyLine, d.output())
		}
		return nil
	})
	return d.output()
}

// process is a descendant of the script, told apart from a later process with the same pid
// by its start time.
type process struct {
	pid        int
	startTime  string
	command    string
	erlangName string // RABBITMQ_NODENAME, for a broker
}

func (p process) alive() bool {
	status, ok := readProcessStat(p.pid)
	return ok && status.startTime == p.startTime && status.state != "Z"
}

// brokers lists the live beam.smp processes descended from the script, however deep: the
// demo's nodes run under a wrapper and rabbitmq-server's own script. It remembers every
// descendant for the cleanup.
func (d *demoScript) brokers(t *testing.T) []process {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[int]processStat{}
	for _, entry := range entries {
		if pid, err := strconv.Atoi(entry.Name()); err == nil {
			if status, ok := readProcessStat(pid); ok {
				statuses[pid] = status
			}
		}
	}
	var family, beams []process
	for pid, status := range statuses {
		if status.state == "Z" {
			continue
		}
		for ancestor := status.parent; ancestor > 1; ancestor = statuses[ancestor].parent {
			if ancestor != d.command.Process.Pid {
				continue
			}
			p := process{pid: pid, startTime: status.startTime, command: status.command}
			family = append(family, p)
			if p.command == "beam.smp" {
				environment, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
				for _, variable := range bytes.Split(environment, []byte{0}) {
					if value, ok := bytes.CutPrefix(variable, []byte("RABBITMQ_NODENAME=")); ok {
						p.erlangName = string(value)
					}
				}
				if p.erlangName == "" {
					t.Fatalf("beam.smp pid %d under the script has no RABBITMQ_NODENAME", pid)
				}
				beams = append(beams, p)
			}
			break
		}
	}
	d.mu.Lock()
	d.family = family
	d.mu.Unlock()
	return beams
}

// processStat holds the fields of /proc/<pid>/stat the demo test reads.
type processStat struct {
	command, state, startTime string
	parent                    int
}

func readProcessStat(pid int) (processStat, bool) {
	content, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return processStat{}, false
	}
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
	// utime stime cutime cstime priority nice threads itrealvalue starttime ...;
	// comm may itself contain spaces and parentheses.
	open, closing := bytes.IndexByte(content, '('), bytes.LastIndexByte(content, ')')
	if open < 0 || closing < open {
		return processStat{}, false
	}
	fields := strings.Fields(string(content[closing+1:]))
	if len(fields) < 20 {
		return processStat{}, false
	}
	parent, err := strconv.Atoi(fields[1])
	if err != nil {
		return processStat{}, false
	}
	return processStat{command: string(content[open+1 : closing]), state: fields[0], parent: parent, startTime: fields[19]}, true
}
