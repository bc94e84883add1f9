package integration

import (
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestProxyNoticesAFrozenBackend: a backend that stops answering without
// closing its socket (the broker is frozen with SIGSTOP) is noticed by the
// backend leg's heartbeats within two intervals, and the client is closed
// with 320 CONNECTION_FORCED. Uses rabbit3, which it thaws before it ends.
func TestProxyNoticesAFrozenBackend(t *testing.T) {
	n := node(t, "rabbit3")
	url, _ := startProxy(t, n)
	config := amqp.Config{Heartbeat: 2 * time.Second}
	conn, err := amqp.DialConfig(url, config)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	pid := n.PID()
	freezeProcess(t, "rabbit3", pid)
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	frozen := time.Now()

	select {
	case err := <-closed:
		elapsed := time.Since(frozen)
		thaw()
		if err == nil || err.Code != amqp.ConnectionForced {
			t.Fatalf("NotifyClose: got %v, want 320 CONNECTION_FORCED", err)
		}
		// The slack is the timer's and a loaded machine's.
		if elapsed > 2*config.Heartbeat+2*time.Second {
			t.Errorf("noticed after %v, want within two heartbeat intervals (%v)", elapsed, 2*config.Heartbeat)
		}
		t.Logf("client closed %v after the backend froze: %v", elapsed.Round(time.Millisecond), err)
	case <-time.After(4 * config.Heartbeat):
		t.Fatalf("the client was not closed within %v of the backend freezing", 4*config.Heartbeat)
	}
}
