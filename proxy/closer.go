package proxy

import (
	"sync"
	"sync/atomic"
	"time"
)

// closeState is the connection-level close handshake in progress.
type closeState uint8

const (
	closeNone closeState = iota
	// closeByClient: the client sent connection.close; waiting for the
	// backend's close-ok to pass on.
	closeByClient
	// closeByBackend: the backend sent connection.close and it was passed to
	// the client; the client's close-ok goes to the backend.
	closeByBackend
	// closeByProxy: the proxy sent connection.close to the client (backend
	// lost, protocol error, shutdown); the client's close-ok ends it.
	closeByProxy
)

// closer keeps where a connection's end stands: the connection-level
// close handshake in progress (closeState), whether teardown began, why
// the connection ends, whether the backend finished its close handshake,
// and the timer that tears down a close the peer never answers. The
// connection carries the close out (clientConn.beginClosing, teardown);
// the closer decides what each step may do, so that one close handshake
// runs at a time, teardown runs once, and the first reason wins.
// clientConn holds it by value.
//
// Who uses it: every goroutine of the connection. The read loops check
// the close in progress and whether teardown began on every frame, so
// those are atomics; whoever begins a close or ends the connection (the
// read loops, the heartbeat timer, the close timer, the server's
// shutdown, a failed write to the client) changes them through its
// methods, under mu. mu guards the rest. Nothing is taken under mu;
// teardown calls end holding clientConn.mu, so that whether teardown
// began, like opened, changes only under clientConn.mu, and isOpen reads
// both at one moment.
type closer struct {
	// closing is the close handshake in progress (a closeState), ended is
	// set once teardown began; both change only under mu.
	closing atomic.Uint32
	ended   atomic.Bool

	mu sync.Mutex // guards the fields below
	// timer tears the connection down if the peer never answers a close.
	timer *time.Timer
	// reason and detail say why the connection ended (or is ending).
	reason CloseReason
	detail string
	// backendClosed is set when the backend connection ended its close
	// handshake, so teardown need not send connection.close to it.
	backendClosed bool
}

// inProgress returns the close handshake in progress.
func (cl *closer) inProgress() closeState { return closeState(cl.closing.Load()) }

// tornDown reports whether teardown began.
func (cl *closer) tornDown() bool { return cl.ended.Load() }

// begin moves from no close to st and reports whether it did: only one
// connection-level close handshake runs at a time, and none after
// teardown began. reason and detail say why the connection ends, unless
// the close times out: expire runs after timeout unless teardown began
// first.
func (cl *closer) begin(st closeState, reason CloseReason, detail string, timeout time.Duration, expire func()) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.ended.Load() || !cl.closing.CompareAndSwap(uint32(closeNone), uint32(st)) {
		return false
	}
	cl.reason, cl.detail = reason, detail
	cl.timer = time.AfterFunc(timeout, expire)
	return true
}

// end marks that teardown began and reports whether this is the first
// call, and whether the backend's close handshake already ended. The
// first reason wins: one set by a close handshake, or by setOutcome,
// says more than the teardown that follows it.
func (cl *closer) end(reason CloseReason, detail string) (first, backendClosed bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.ended.Load() {
		return false, false
	}
	cl.ended.Store(true)
	if cl.reason == ReasonUnknown {
		cl.reason, cl.detail = reason, detail
	}
	if cl.timer != nil {
		cl.timer.Stop()
	}
	return true, cl.backendClosed
}

// setOutcome records why the connection ends, over any reason recorded
// before.
func (cl *closer) setOutcome(reason CloseReason, detail string) {
	cl.mu.Lock()
	cl.reason, cl.detail = reason, detail
	cl.mu.Unlock()
}

// outcome returns why the connection ended (or is ending).
func (cl *closer) outcome() (CloseReason, string) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.reason, cl.detail
}

// backendDone records that the backend connection ended its close
// handshake (or is gone), so teardown says no goodbye to it.
func (cl *closer) backendDone() {
	cl.mu.Lock()
	cl.backendClosed = true
	cl.mu.Unlock()
}
