package controllink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

const testGrace = time.Second

const writePace = 200 * time.Microsecond

// nextEvent returns the watcher's next event, failing the test after timeout.
func nextEvent(t *testing.T, w *Watcher, timeout time.Duration) Event {
	t.Helper()
	select {
	case ev := <-w.Events():
		return ev
	case <-time.After(timeout):
		t.Fatalf("no backend event within %s", timeout)
		return Event{}
	}
}

func expectEvent(t *testing.T, w *Watcher, timeout time.Duration, state State, cause Cause) Event {
	t.Helper()
	ev := nextEvent(t, w, timeout)
	if ev.State != state || ev.Cause != cause {
		t.Fatalf("event = %s (%s, err %v); want %s (%s)", ev.State, ev.Cause, ev.Err, state, cause)
	}
	return ev
}

func restartBroker(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := broker.Restart(ctx); err != nil {
		t.Fatalf("restarting the broker: %v", err)
	}
}

func startWatcher(t *testing.T) *Watcher {
	t.Helper()
	return startWatcherWithGrace(t, testGrace)
}

func startWatcherWithGrace(t *testing.T, grace time.Duration) *Watcher {
	t.Helper()
	w := NewWatcher([]Backend{{Name: "rabbit1", URL: broker.URL()}}, WatcherOptions{
		Grace:  grace,
		Retry:  200 * time.Millisecond,
		Logger: quietLogger(),
	})
	t.Cleanup(w.Close)
	return w
}

func TestWatcherSeesBackendFailures(t *testing.T) {
	tests := []struct {
		name string
		// grace is the watcher's; zero takes testGrace.
		grace time.Duration
		// fail makes the broker fail and returns when that could first be seen.
		fail      func(t *testing.T, w *Watcher) time.Time
		wantCause Cause
		// within bounds the time from the failure to the Down event.
		within time.Duration
		// atLeast: an unresponsive broker must be given its grace.
		atLeast time.Duration
		// recover undoes fail; the broker need not answer yet.
		recover func(t *testing.T)
	}{
		{
			name: "kill -9 is seen at once",
			// Seen when the broker's sockets are reset, which the kernel
			// does once it has torn the killed process down: that took up
			// to 1.8 s on a machine loaded by other tests, and until then
			// the broker is as silent as a frozen one, so that a probe
			// could rightly call it unresponsive after a short grace. A
			// long one leaves the reset as the only way to see the kill.
			grace:     5 * time.Second,
			fail:      killBroker,
			wantCause: CauseLost,
			// From the reset. The cause tells a kill seen from a grace
			// run out; the bound leaves a loaded machine its slowness.
			within:  4 * time.Second,
			recover: restartBroker,
		},
		{
			name: "a clean stop is a shutdown",
			fail: func(t *testing.T, _ *Watcher) time.Time {
				return stopBroker(t)
			},
			wantCause: CauseShutdown,
			within:    30 * time.Second, // the broker takes its time to stop; the event precedes the exit
			recover:   restartBroker,
		},
		{
			// RabbitMQ sends connection.close 320 and closes the socket at
			// once; a write that follows meets a reset, which amqp091-go
			// may act on before it reads the 320. The trimmers' acks and
			// the probes write on the watcher's connection all the time.
			name: "a clean stop while the connection is written to is a shutdown",
			fail: func(t *testing.T, w *Watcher) time.Time {
				writeUntilClosed(t, w)
				return stopBroker(t)
			},
			wantCause: CauseShutdown,
			within:    30 * time.Second,
			recover:   restartBroker,
		},
		{
			name: "a frozen broker is down after the grace",
			fail: func(t *testing.T, _ *Watcher) time.Time {
				if err := syscall.Kill(broker.PID(), syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := localbroker.WaitStopped(ctx, broker.PID()); err != nil {
					t.Fatal(err)
				}
				return time.Now()
			},
			wantCause: CauseUnresponsive,
			atLeast:   testGrace - 100*time.Millisecond,
			within:    testGrace + 4*time.Second, // the probe's period and a loaded machine's slowness
			recover: func(t *testing.T) {
				if err := syscall.Kill(broker.PID(), syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := startWatcherWithGrace(t, cmp.Or(tt.grace, testGrace))
			up := expectEvent(t, w, 10*time.Second, Up, CauseNone)
			if conn, generation := w.Conn("rabbit1"); conn == nil || generation != up.Generation {
				t.Fatalf("Conn = %v, %d while up with generation %d", conn, generation, up.Generation)
			}

			failedAt := tt.fail(t, w)
			// However this subtest ends, the next one finds the broker
			// serving again.
			recoverOnce := sync.OnceFunc(func() { tt.recover(t) })
			t.Cleanup(func() {
				recoverOnce()
				awaitBrokerServing(t)
			})
			down := nextEvent(t, w, tt.within+5*time.Second)
			took := down.At.Sub(failedAt)
			if down.State != Down || down.Cause != tt.wantCause {
				t.Fatalf("event = %s (%s, err %v) %s after the failure; want down (%s)",
					down.State, down.Cause, down.Err, took.Round(time.Millisecond), tt.wantCause)
			}
			t.Logf("%s seen after %s (%v)", tt.wantCause, took.Round(time.Millisecond), down.Err)
			// The watcher may see a reset a moment before the test does.
			if took > tt.within || tt.atLeast > 0 && took < tt.atLeast {
				t.Errorf("down after %s, want between %s and %s", took, tt.atLeast, tt.within)
			}
			if conn, _ := w.Conn("rabbit1"); conn != nil {
				t.Errorf("Conn still hands out a connection to a backend that is down")
			}

			recoverOnce()
			back := expectEvent(t, w, 2*time.Minute, Up, CauseNone)
			if back.Generation <= up.Generation {
				t.Errorf("generation after reconnecting = %d, want above %d", back.Generation, up.Generation)
			}
			if got := w.State("rabbit1"); got != Up {
				t.Errorf("State = %s after the broker came back, want up", got)
			}
		})
	}
}

// killBroker kills the broker with SIGKILL and returns when a connection
// of the test's own saw the reset: the moment the kill could be seen.
func killBroker(t *testing.T, _ *Watcher) time.Time {
	t.Helper()
	witness, err := amqp.Dial(broker.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer witness.Close()
	closed := witness.NotifyClose(make(chan *amqp.Error, 1))
	resetAt := make(chan time.Time, 1)
	go func() {
		<-closed // the reset, or the deferred Close
		resetAt <- time.Now()
	}()
	killedAt := time.Now()
	if err := broker.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-resetAt:
		t.Logf("the test's own connection saw the kill %s after SIGKILL", at.Sub(killedAt).Round(time.Millisecond))
		return at
	case <-time.After(30 * time.Second):
		t.Fatal("the test's own connection did not see the kill within 30s")
		return time.Time{}
	}
}

func stopBroker(t *testing.T) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	at := time.Now()
	if err := broker.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	return at
}

// writeUntilClosed publishes on the watcher's connection, without confirms
// (writes only, to a queue that does not exist), until the connection ends.
// A write every writePace is often enough to meet the broker's reset now
// and then, and slow enough that RabbitMQ does not throttle the connection
// (its probes would wait behind the throttle).
func writeUntilClosed(t *testing.T, w *Watcher) {
	t.Helper()
	conn, _ := w.Conn("rabbit1")
	if conn == nil {
		t.Fatal("no connection from the watcher while the backend is up")
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("opening a channel on the watcher's connection: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pace := time.NewTicker(writePace)
		defer pace.Stop()
		for range pace.C {
			if ch.Publish("", "nowhere", false, false, amqp.Publishing{Body: []byte("write")}) != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { <-done })
}

// awaitBrokerServing waits until the broker answers a fresh connection's
// question promptly: a broker back from a freeze or a restart may accept
// connections a while before it keeps up, and a probe that waits behind
// that would turn the next subtest's kill into a freeze.
func awaitBrokerServing(t *testing.T) {
	t.Helper()
	const prompt = testGrace / 4
	testutil.Eventually(t, 2*time.Minute, func() error {
		conn, err := amqp.DialConfig(broker.URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			return err
		}
		defer conn.CloseDeadline(time.Now().Add(time.Second))
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		start := time.Now()
		if err := ch.ExchangeDeclarePassive("amq.direct", "direct", true, false, false, false, nil); err != nil {
			return err
		}
		if took := time.Since(start); took > prompt {
			return fmt.Errorf("the broker answered after %s, want within %s", took, prompt)
		}
		return nil
	})
}

func TestWatcherStartsWithABackendDown(t *testing.T) {
	if err := broker.Kill(); err != nil {
		t.Fatal(err)
	}
	w := startWatcher(t)
	ev := expectEvent(t, w, 5*time.Second, Down, CauseLost)
	if ev.Err == nil {
		t.Errorf("down event without the error behind it")
	}
	restartBroker(t)
	expectEvent(t, w, time.Minute, Up, CauseNone)
	if w.State("nonexistent") != Unknown {
		t.Errorf("a backend the watcher does not watch is not unknown")
	}
}

func TestStateAndCauseNames(t *testing.T) {
	tests := []struct{ got, want string }{
		{Up.String(), "up"},
		{Down.String(), "down"},
		{State(9).String(), "State(9)"},
		{CauseShutdown.String(), "shutdown"},
		{Cause(-1).String(), "Cause(-1)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestWatcherReportsARefusedAccount(t *testing.T) {
	url := strings.Replace(broker.URL(), "guest:guest@", "guest:wrong@", 1)
	w := NewWatcher([]Backend{{Name: "rabbit1", URL: url}}, WatcherOptions{Grace: testGrace, Logger: quietLogger()})
	defer w.Close()
	ev := expectEvent(t, w, 10*time.Second, Down, CauseLost)
	var amqpErr *amqp.Error
	if !errors.Is(ev.Err, amqp.ErrCredentials) && !(errors.As(ev.Err, &amqpErr) && amqpErr.Code == amqp.AccessRefused) {
		t.Errorf("down event's error = %v, want the broker's refusal of the credentials", ev.Err)
	}
	if got := w.Downs("rabbit1"); got != 1 {
		t.Errorf("Downs = %d, want 1", got)
	}
}
