package engine

import (
	"errors"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
)

// errMemberFailed is the error of the Down event MemberFailed makes.
var errMemberFailed = errors.New("the proxy beside it failed (serf): its node counts as failed")

// BackendDown reports whether the engine counts backend down: the watcher
// says so, or serf declared the proxy beside it failed (MemberFailed). The
// proxy drops its client links to it, as the engine promotes away from it.
// Unknown (no verdict yet) is not down.
func (e *Engine) BackendDown(backend string) bool {
	return e.opts.Watcher.State(backend) == controllink.Down || e.failedMembers.has(backend)
}

// up reports whether the engine counts backend up: the watcher's
// connection is up and serf has not declared the proxy beside it failed.
func (e *Engine) up(backend string) bool {
	return e.opts.Watcher.State(backend) == controllink.Up && !e.failedMembers.has(backend)
}

// MemberFailed tells the engine that serf declared the proxy beside
// backend failed. In a sidecar cluster a node is a proxy and its broker,
// which fail together (a crash, a kill, a host or its network gone), so
// the backend counts as down at once, as when its connection is reset,
// without waiting for the engine's own probe of the broker, which a host
// gone silent answers only after failover_grace. Every surviving proxy
// gets serf's verdict within about a second, so they all act on the same
// signal; their promotions are conditional writes to the log, which takes
// exactly one. The probe still runs: a broker that dies under a live proxy
// is seen by it alone. The backend counts as down until MemberAlive, and
// the watcher's connection to it is closed, as a reset closes it.
func (e *Engine) MemberFailed(backend string) {
	if !e.failedMembers.set(backend, true) {
		return
	}
	e.log.Warn("the proxy beside a backend failed; counting the backend down", "backend", backend)
	e.addEvent(controllink.Event{Backend: backend, State: controllink.Down, Cause: controllink.CauseLost, At: time.Now(), Err: errMemberFailed})
	// As a reset would: the watcher's connection goes, so that nothing
	// waits on a broker that may never answer (a frozen host) until
	// failover_grace, neither the engine's own operations nor ctl
	// list_queues. The watcher reconnects at once if the broker answers.
	if conn, _ := e.opts.Watcher.Conn(backend); conn != nil {
		conn.CloseDeadline(time.Now())
	}
}

// MemberAlive tells the engine that serf sees the proxy beside backend
// alive again: the watcher's verdict on the backend is the engine's again,
// and its copies rejoin through that proxy once the backend is up.
func (e *Engine) MemberAlive(backend string) {
	if !e.failedMembers.set(backend, false) {
		return
	}
	e.log.Info("the proxy beside a backend is back", "backend", backend)
	e.addEvent(controllink.Event{Backend: backend, State: controllink.Up, At: time.Now()})
}

// memberFailures are the backends whose proxy serf declared failed; safe
// for concurrent use (the proxy's data path asks BackendDown).
type memberFailures struct {
	mu     sync.Mutex
	failed map[string]bool
}

// set records whether backend's proxy failed and reports whether that
// changed anything.
func (m *memberFailures) set(backend string, failed bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failed[backend] == failed {
		return false
	}
	if m.failed == nil {
		m.failed = make(map[string]bool)
	}
	if failed {
		m.failed[backend] = true
	} else {
		delete(m.failed, backend)
	}
	return true
}

func (m *memberFailures) has(backend string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed[backend]
}
