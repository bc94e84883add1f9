package proxy

import (
	"fmt"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// heartbeats sends heartbeats on a connection's quiet legs and notices dead
// peers: a peer that sent nothing for one and a half intervals is gone, so
// a dead client or backend is noticed within two intervals. It checks four
// times an interval from a timer, so that a connection has no goroutine of
// its own for it while it waits (thousands of idle connections, one stack
// fewer each).
//
// The connection's main goroutine sets it up and starts it (start) once
// the connection serves, and stops it (stop) once the connection ended;
// the timer's goroutine runs the checks. What it uses of the connection is
// set before start and only read; mu guards stopped and the timer, and
// running counts the checks in progress.
type heartbeats struct {
	// client is the client's socket and clientEvery the heartbeat interval
	// agreed with the client; links are the connection's links and
	// backendEvery the interval agreed with the backends. Zero: none.
	client       *wire.Socket
	clientEvery  time.Duration
	links        *linkSet
	backendEvery time.Duration
	// done is closed when the connection ends.
	done <-chan struct{}
	// teardown ends the connection when the client missed heartbeats
	// (clientConn.teardown); linkFailed handles a backend that missed them
	// and reports false when that ends the connection
	// (linkKeeper.linkFailed).
	teardown   func(reason CloseReason, detail string)
	linkFailed func(l *link, err error) bool

	tick    time.Duration
	mu      sync.Mutex
	stopped bool
	timer   *time.Timer
	running sync.WaitGroup
}

// start arms the first check, when either leg has heartbeats.
func (h *heartbeats) start() {
	if h.clientEvery <= 0 && h.backendEvery <= 0 {
		return
	}
	h.tick = minPositive(h.clientEvery, h.backendEvery) / 4
	h.mu.Lock()
	h.timer = time.AfterFunc(h.tick, h.run)
	h.mu.Unlock()
}

// stop returns once no check runs and none will.
func (h *heartbeats) stop() {
	h.mu.Lock()
	h.stopped = true
	if h.timer != nil {
		h.timer.Stop()
	}
	h.mu.Unlock()
	h.running.Wait()
}

// run is the timer's: one check, and the next armed unless the check ended
// the connection or the heartbeats stopped.
func (h *heartbeats) run() {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	h.running.Add(1)
	h.mu.Unlock()
	defer h.running.Done()
	if !h.check(time.Now()) {
		return // the connection is ending
	}
	h.mu.Lock()
	if !h.stopped {
		h.timer.Reset(h.tick)
	}
	h.mu.Unlock()
}

// check is one round of heartbeats; false means it ended the connection
// and the checks stop.
func (h *heartbeats) check(now time.Time) bool {
	select {
	case <-h.done:
		return false
	default:
	}
	if hb := h.clientEvery; hb > 0 {
		h.client.HeartbeatIfIdle(now, hb/2)
		if silent := h.client.SilentFor(now); silent > hb*3/2 {
			h.teardown(ReasonMissedHeartbeats, fmt.Sprintf("missed heartbeats from client, timeout: %s", hb))
			return false
		}
	}
	if hb := h.backendEvery; hb > 0 {
		for i := range h.links.len() {
			l := h.links.at(i)
			if l == nil {
				continue
			}
			l.sock.HeartbeatIfIdle(now, hb/2)
			if silent := l.sock.SilentFor(now); silent > hb*3/2 {
				if !h.linkFailed(l, fmt.Errorf("%w, timeout: %s", errMissedHeartbeats, hb)) {
					return false // the close under way ends the connection
				}
			}
		}
	}
	return true
}

func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	default:
		return min(a, b)
	}
}
