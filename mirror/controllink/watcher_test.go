package controllink

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const testGrace = time.Second

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
	w := NewWatcher([]Backend{{Name: "rabbit1", URL: broker.URL()}}, WatcherOptions{
		Grace:  testGrace,
		Retry:  200 * time.Millisecond,
		Logger: quietLogger(),
	})
	t.Cleanup(w.Close)
	return w
}

func TestWatcherSeesBackendFailures(t *testing.T) {
	tests := []struct {
		name string
		// fail makes the broker fail and returns when it did.
		fail      func(t *testing.T) time.Time
		wantCause Cause
		// within bounds the time from the failure to the Down event.
		within time.Duration
		// atLeast: an unresponsive broker must be given its grace.
		atLeast time.Duration
		recover func(t *testing.T)
	}{
		{
			name: "kill -9 is seen at once",
			fail: func(t *testing.T) time.Time {
				at := time.Now()
				if err := broker.Kill(); err != nil {
					t.Fatal(err)
				}
				return at
			},
			wantCause: CauseLost,
			// The cause (lost, not unresponsive) shows the reset was seen,
			// not the grace's end; the bound, which includes the kill
			// itself, leaves room for a machine loaded by the suite.
			within:  2 * time.Second,
			recover: restartBroker,
		},
		{
			name: "a clean stop is a shutdown",
			fail: func(t *testing.T) time.Time {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				at := time.Now()
				if err := broker.Stop(ctx); err != nil {
					t.Fatal(err)
				}
				return at
			},
			wantCause: CauseShutdown,
			within:    30 * time.Second, // the broker takes its time to stop; the event precedes the exit
			recover:   restartBroker,
		},
		{
			name: "a frozen broker is down after the grace",
			fail: func(t *testing.T) time.Time {
				if err := syscall.Kill(broker.PID(), syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				return time.Now()
			},
			wantCause: CauseUnresponsive,
			atLeast:   testGrace - 100*time.Millisecond,
			within:    testGrace + testGrace/4 + 1500*time.Millisecond,
			recover: func(t *testing.T) {
				if err := syscall.Kill(broker.PID(), syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := startWatcher(t)
			up := expectEvent(t, w, 10*time.Second, Up, CauseNone)
			if conn, generation := w.Conn("rabbit1"); conn == nil || generation != up.Generation {
				t.Fatalf("Conn = %v, %d while up with generation %d", conn, generation, up.Generation)
			}

			failedAt := tt.fail(t)
			down := expectEvent(t, w, tt.within+5*time.Second, Down, tt.wantCause)
			took := down.At.Sub(failedAt)
			t.Logf("%s seen after %s", tt.wantCause, took.Round(time.Millisecond))
			if took > tt.within || took < tt.atLeast {
				t.Errorf("down after %s, want between %s and %s", took, tt.atLeast, tt.within)
			}
			if conn, _ := w.Conn("rabbit1"); conn != nil {
				t.Errorf("Conn still hands out a connection to a backend that is down")
			}

			tt.recover(t)
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
