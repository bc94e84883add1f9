package node

import (
	"errors"
	"fmt"

	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// readiness answers the admin API's /readyz: whether this proxy can
// serve clients now. Each part is a question put to the type that knows,
// so that readiness keeps no state of its own. Its errors are served
// without a token: they name a backend, never its URL.
type readiness struct {
	// paused: the proxy refuses clients (pause_minority).
	paused func() bool
	// hasLeader: the metadata log has a leader this proxy follows; nil
	// without mirroring, where there is no log.
	hasLeader func() bool
	// home is the backend clients are served by first, and backend what
	// the proxy's own probe says of it.
	home    string
	backend func(name string) controllink.State
}

// check returns nil when the proxy can serve clients, else the first
// reason it cannot, in the order an operator would look: the cluster,
// then the metadata log, then the backend.
func (r readiness) check() error {
	leader := r.hasLeader == nil || r.hasLeader()
	switch {
	case r.paused() && !leader:
		return errors.New("paused: this proxy sees no majority of the sidecar cluster")
	case r.paused():
		// PauseInMinority resumes only once the log caught up with the
		// leader: a majority is back, the log not yet.
		return errors.New("paused: the metadata log has not caught up with the leader yet")
	case !leader:
		return errors.New("the metadata log has no leader: mirrored queues cannot change")
	}
	switch r.backend(r.home) {
	case controllink.Up:
		return nil
	case controllink.Down:
		return fmt.Errorf("backend %s, which serves this proxy's clients, is down", r.home)
	default:
		return fmt.Errorf("backend %s, which serves this proxy's clients, has not answered the proxy's first probe yet", r.home)
	}
}

// newReadiness asks srv, m's metadata log and w about the home backend.
func newReadiness(srv *proxy.Server, m *mirroring, w *controllink.Watcher, home string) readiness {
	r := readiness{paused: srv.Paused, home: home, backend: w.State}
	switch {
	case m.cluster != nil:
		r.hasLeader = m.cluster.Majority
	case m.store != nil:
		r.hasLeader = func() bool {
			id, _ := m.store.Leader()
			return id != ""
		}
	}
	return r
}
