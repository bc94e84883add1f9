package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
)

// errMemberFailed is the error of the Down event MemberFailed makes.
var errMemberFailed = errors.New("the proxy beside it failed (serf): its node counts as failed")

// BackendDown reports whether the engine counts backend down: the watcher
// says so, or serf declared the proxy beside it failed (MemberFailed). The
// proxy drops its client links to it, as the engine promotes away from it.
// Unknown (no verdict yet) is not down.
func (e *Engine) BackendDown(backend string) bool { return e.liveness.down(backend) }

// SetPaused tells the engine that its proxy pauses (pause_minority: it
// sees no more than half of its cluster) or serves again. What a paused
// proxy takes for lost backends is its side of a partition's view: the
// majority decides for those it cannot reach. So a paused engine records
// no loss; each waits until the proxy serves again, and is recorded then
// if the backend is still down. Recorded at once, after the healing but
// before this proxy's serf has seen the majority alive again (it is paused
// until then), a stale verdict could move a master away from a live broker,
// to a slave that rejoined unsynchronised meanwhile. For ResumeSettle after
// it serves again, it leaves promotions to the other proxies, which were
// never cut off: its serf may have seen only one of them alive again so
// far, and its own probes of the brokers reconnect after the healing too.
func (m Member) SetPaused(paused bool) { m.e.liveness.setPaused(paused) }

// liveness is which backends the engine counts up, and where it may place
// copies: the watcher's verdicts, serf's on the proxies beside them
// (MemberFailed), the drained backends (drain.go) and whether this proxy
// is paused in a minority (SetPaused). Each part is safe for concurrent
// use on its own; none is held while another is asked.
type liveness struct {
	watcher  *controllink.Watcher
	backends []string // configured, in configuration order
	// resumeSettle is Options.ResumeSettle.
	resumeSettle time.Duration

	failed  memberFailures
	drained drainedSet
	// paused is set while the proxy is paused in a partition's minority,
	// resumed is when it last served again, in Unix nanoseconds.
	paused  atomic.Bool
	resumed atomic.Int64
	// stall is the engine's stall guard (nil for a proxy alone): after a
	// stall, as after a pause, promotions are left to the other proxies.
	stall *stallGuard
}

// down is Engine.BackendDown.
func (l *liveness) down(backend string) bool {
	return l.watcher.State(backend) == controllink.Down || l.failed.has(backend)
}

// up reports whether the engine counts backend up: the watcher's
// connection is up and serf has not declared the proxy beside it failed.
func (l *liveness) up(backend string) bool {
	return l.watcher.State(backend) == controllink.Up && !l.failed.has(backend)
}

// live returns the backends the engine counts up.
func (l *liveness) live() mirror.LiveSet {
	var up []string
	for _, b := range l.backends {
		if l.up(b) {
			up = append(up, b)
		}
	}
	return mirror.NewLiveSet(up...)
}

// placeable returns the live backends that are not drained: where new
// masters and slaves may go.
func (l *liveness) placeable() mirror.LiveSet {
	live := l.live()
	for _, b := range l.drained.list() {
		delete(live, b)
	}
	return live
}

// placeableIn is placeable without the backends that refuse the proxy's
// account in vhost (it is missing there, or the account lacks
// permissions): no copy of that vhost's queues can be made or kept in
// step there. Asking is cheap: the watcher keeps a connection per vhost,
// and a refusal for a few seconds before it asks the broker again.
func (l *liveness) placeableIn(vhost string) mirror.LiveSet {
	live := l.placeable()
	for b := range live {
		if !l.accepts(b, vhost) {
			delete(live, b)
		}
	}
	return live
}

// accepts reports whether the proxy's account can work in vhost on
// backend.
func (l *liveness) accepts(backend, vhost string) bool {
	_, _, err := l.watcher.VHostConn(backend, vhost)
	return err == nil
}

// configured returns ErrUnknownBackend (wrapped) for a backend that is not
// configured.
func (l *liveness) configured(backend string) error {
	if slices.Contains(l.backends, backend) {
		return nil
	}
	return fmt.Errorf("backend '%s' (configured: %s): %w", backend, strings.Join(l.backends, ", "), ErrUnknownBackend)
}

// setPaused is Member.SetPaused.
func (l *liveness) setPaused(paused bool) {
	if !paused && l.paused.Load() {
		l.resumed.Store(time.Now().UnixNano())
	}
	l.paused.Store(paused)
}

// isPaused reports whether the proxy is paused in a minority.
func (l *liveness) isPaused() bool { return l.paused.Load() }

// settlingAfterPause reports whether the proxy served again less than
// resumeSettle ago, after a pause or after it stood still (stall.go).
func (l *liveness) settlingAfterPause() bool {
	if l.stall.settling(l.resumeSettle) {
		return true
	}
	at := l.resumed.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < l.resumeSettle
}

// awaitVerdicts waits until the watcher has a verdict on every backend, or
// ctx ends.
func (l *liveness) awaitVerdicts(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		unknown := false
		for _, b := range l.backends {
			if l.watcher.State(b) == controllink.Unknown {
				unknown = true
			}
		}
		if !unknown {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
func (m Member) MemberFailed(backend string) {
	e := m.e
	if !e.liveness.failed.set(backend, true) {
		return
	}
	e.log.Warn("the proxy beside a backend failed; counting the backend down", "backend", backend)
	e.failover.addEvent(controllink.Event{Backend: backend, State: controllink.Down, Cause: controllink.CauseLost, At: time.Now(), Err: errMemberFailed})
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
func (m Member) MemberAlive(backend string) {
	e := m.e
	if !e.liveness.failed.set(backend, false) {
		return
	}
	e.log.Info("the proxy beside a backend is back", "backend", backend)
	e.failover.addEvent(controllink.Event{Backend: backend, State: controllink.Up, At: time.Now()})
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
