package integration

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// gracefulStopLine is what RabbitMQ 3.10 logs when SIGTERM starts a clean shutdown.
const gracefulStopLine = "SIGTERM received - shutting down"

// noProcessesLeft is a condition for Eventually: nothing of the node still runs.
func noProcessesLeft(erlangName string) func() error {
	return func() error {
		pids, err := localbroker.ProcessesOf(erlangName)
		if err != nil {
			return err
		}
		if len(pids) > 0 {
			return fmt.Errorf("processes of %s still running: %v", erlangName, pids)
		}
		return nil
	}
}

// publishPersistent declares a durable queue and publishes one persistent message, confirmed.
func publishPersistent(t testing.TB, n *localbroker.Node, queue, body string) {
	t.Helper()
	channel := openChannel(t, dial(t, n))
	if _, err := channel.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare %s: %v", queue, err)
	}
	if err := channel.Confirm(false); err != nil {
		t.Fatalf("enable confirms: %v", err)
	}
	confirmation, err := channel.PublishWithDeferredConfirmWithContext(testContext(t, 10*time.Second), "", queue, true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if acked, err := confirmation.WaitContext(testContext(t, 10*time.Second)); !acked || err != nil {
		t.Fatalf("confirm: acked %v, error %v", acked, err)
	}
}

func TestStartOptionErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		options localbroker.Options
		want    string
	}{
		{"rabbitmq-server missing", localbroker.Options{ServerPath: "/nonexistent/rabbitmq-server"},
			"rabbitmq-server not found at /nonexistent/rabbitmq-server: apt-get install -y rabbitmq-server"},
		{"names and count disagree", localbroker.Options{Nodes: 2, Names: []string{"a"}}, "1 names given for 2 nodes"},
		{"name unfit for Erlang", localbroker.Options{Names: []string{"a@b"}}, `node name "a@b"`},
		{"name twice", localbroker.Options{Names: []string{"a", "a"}}, `node name "a" given twice`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			started, err := localbroker.Start(testContext(t, 10*time.Second), c.options)
			if err == nil {
				started.Close()
				t.Fatalf("Start succeeded, want an error containing %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error: got %q, want it to contain %q", err, c.want)
			}
		})
	}
}

// TestNodeLifecycle runs its own node, so that killing, wiping and closing it disturbs no
// other test.
func TestNodeLifecycle(t *testing.T) {
	t.Parallel()
	own, err := localbroker.Start(testContext(t, time.Minute), localbroker.Options{Names: []string{"lifecycle"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Close() })
	n := own.Nodes()[0]
	port, firstPID := n.Port, n.PID()
	if firstPID == 0 || !n.Running() {
		t.Fatalf("after Start: Running() = %v, PID() = %d; want true and the pid of beam.smp", n.Running(), firstPID)
	}
	if pids, err := n.Processes(); err != nil || len(pids) < 3 {
		t.Fatalf("Processes() of a running node: got %v (error %v), want the wrapper, rabbitmq-server and beam.smp at least", pids, err)
	}
	queue := queueName(t)
	publishPersistent(t, n, queue, "survives a crash")
	// The confirm puts the message on disk, but the queue's record may reach the disk up to
	// two seconds after declare-ok: a kill -9 before that loses the queue and the message
	// with it (see "What survives Kill" in package localbroker). Flushing makes the queue's
	// survival, and so the message's, what RabbitMQ guarantees.
	if err := n.FlushMetadata(testContext(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}

	if !t.Run("Kill crashes the node and drops its clients", func(t *testing.T) {
		connection := dial(t, n)
		closed := connection.NotifyClose(make(chan *amqp.Error, 1))
		if err := n.Kill(); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		if n.Running() || n.PID() != 0 {
			t.Fatalf("after Kill: Running() = %v, PID() = %d; want false and 0", n.Running(), n.PID())
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the client connection did not notice the crash")
		}
		testutil.Eventually(t, 10*time.Second, noProcessesLeft(n.ErlangName))
		if _, err := amqp.Dial(n.URL()); err == nil {
			t.Fatal("dial succeeded while the node is down")
		}
	}) {
		return
	}

	if !t.Run("Restart brings back the same node with its data", func(t *testing.T) {
		if err := n.Restart(testContext(t, time.Minute)); err != nil {
			t.Fatalf("Restart: %v", err)
		}
		if !n.Running() || n.Port != port || n.PID() == 0 || n.PID() == firstPID {
			t.Fatalf("after Restart: Running() = %v, port %d (was %d), PID() = %d (was %d)", n.Running(), n.Port, port, n.PID(), firstPID)
		}
		channel := openChannel(t, dial(t, n))
		if _, err := channel.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
			t.Fatalf("durable queue after the restart, its record flushed before the kill: %v", err)
		}
		message, ok, err := channel.Get(queue, false)
		if err != nil || !ok || string(message.Body) != "survives a crash" {
			t.Fatalf("persistent message after the restart: got %q, found %v, error %v; want %q", message.Body, ok, err, "survives a crash")
		}
	}) {
		return
	}

	if !t.Run("Wipe deletes the data", func(t *testing.T) {
		if err := n.Wipe(); err != nil {
			t.Fatalf("Wipe: %v", err)
		}
		testutil.Eventually(t, 10*time.Second, noProcessesLeft(n.ErlangName))
		if err := n.Restart(testContext(t, time.Minute)); err != nil {
			t.Fatalf("Restart after Wipe: %v", err)
		}
		channel := openChannel(t, dial(t, n))
		_, err := channel.QueueDeclarePassive(queue, true, false, false, false, nil)
		var amqpError *amqp.Error
		if !errors.As(err, &amqpError) || amqpError.Code != amqp.NotFound {
			t.Fatalf("queue after Wipe: got error %v, want 404 NOT_FOUND", err)
		}
	}) {
		return
	}

	if !t.Run("Stop shuts the node down gracefully", func(t *testing.T) {
		if err := n.Stop(testContext(t, time.Minute)); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if n.Running() || n.PID() != 0 {
			t.Fatalf("after Stop: Running() = %v, PID() = %d; want false and 0", n.Running(), n.PID())
		}
		testutil.Eventually(t, 10*time.Second, noProcessesLeft(n.ErlangName))
		log, err := os.ReadFile(n.LogFile())
		if err != nil || !bytes.Contains(log, []byte(gracefulStopLine)) {
			t.Fatalf("broker log %s lacks %q (read error %v)", n.LogFile(), gracefulStopLine, err)
		}
	}) {
		return
	}

	t.Run("Close leaves nothing behind", func(t *testing.T) {
		if err := own.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		testutil.Eventually(t, 10*time.Second, noProcessesLeft(n.ErlangName))
		if _, err := os.Stat(own.BaseDir()); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("base directory after Close: got %v, want it removed", err)
		}
	})
}

// TestNodesDieWithTheHarnessProcess starts a node from a helper process (this test binary
// run again, see runHelper) and ends the helper the ways a test binary can end.
func TestNodesDieWithTheHarnessProcess(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		signal syscall.Signal
		within time.Duration
	}{
		{"SIGTERM closes the cluster", syscall.SIGTERM, 10 * time.Second},
		{"SIGKILL leaves the lifeline to the wrappers", syscall.SIGKILL, 15 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			helper := exec.Command(os.Args[0])
			helper.Env = append(os.Environ(), helperVariable+"="+t.TempDir())
			var stderr bytes.Buffer
			helper.Stderr = &stderr
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("helper stderr:\n%s", stderr.String())
				}
			})
			stdin, err := helper.StdinPipe() // held open: the helper runs until told
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			stdout, err := helper.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := helper.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatalf("helper printed no node name: %v", err)
			}
			erlangName := strings.TrimSpace(line)
			if pids, err := localbroker.ProcessesOf(erlangName); err != nil || len(pids) == 0 {
				t.Fatalf("helper's node %s: processes %v, error %v; want some running", erlangName, pids, err)
			}

			helper.Process.Signal(c.signal)
			helper.Wait()
			status := helper.ProcessState.Sys().(syscall.WaitStatus)
			if !status.Signaled() || status.Signal() != c.signal {
				t.Errorf("helper ended with %v, want death by %v", helper.ProcessState, c.signal)
			}
			testutil.Eventually(t, c.within, noProcessesLeft(erlangName))
		})
	}
}
