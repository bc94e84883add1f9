package proxy

import (
	"testing"
	"time"
)

// TestHeartbeatsWithoutIntervalsNeverTick: a connection that agreed no
// heartbeats on either leg arms no timer, and stopping it returns at once.
func TestHeartbeatsWithoutIntervalsNeverTick(t *testing.T) {
	var h heartbeats
	h.start()
	if h.timer != nil {
		t.Fatalf("got a timer, want none without heartbeats")
	}
	h.stop()
}

// TestHeartbeatsStopWithTheConnection: once the connection ended, a check
// touches no socket and says the checks stop, and a timer's run does not
// arm the next one.
func TestHeartbeatsStopWithTheConnection(t *testing.T) {
	done := make(chan struct{})
	close(done)
	h := heartbeats{clientEvery: time.Hour, backendEvery: time.Hour, done: done}
	if h.check(time.Now()) {
		t.Errorf("got check true after the connection ended, want false")
	}
	h.start()
	h.timer.Stop()
	h.run()
	if h.timer.Stop() {
		t.Errorf("got the timer armed after a check of an ended connection, want it idle")
	}
	h.stop()
}
