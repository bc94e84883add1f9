package controllink

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The proxy's own work on a queue or an exchange (copies, bindings,
// trimming, syncs, purges, inspection) happens in the vhost of that queue
// or exchange, and an AMQP connection is opened to one vhost. The watcher's
// connection to a backend is in the vhost of the backend's URL; for every
// other vhost the watcher opens, on first use, one more connection of the
// same account, and keeps it while the backend stays up. Those connections
// are not probed: the backend's liveness is the watcher's connection's.

// vhostRetry is how long a refusal is kept before the backend is asked
// again: the engine asks every second for each of the vhost's queues.
const vhostRetry = 5 * time.Second

// ErrNotUp is returned for a backend that is not up.
var ErrNotUp = errors.New("backend is not up")

// vhostConn is the watcher's connection to one backend in one vhost other
// than its URL's. mu serialises the dials, so that callers asking at once
// share one connection; the fields are the watcher's, under Watcher.mu.
type vhostConn struct {
	mu sync.Mutex

	conn       *amqp.Connection // nil until dialled, or after a failure
	generation uint64           // unique among the watcher's connections
	upAt       uint64           // the backend's generation it was dialled in
	err        error            // the last dial's failure
	failedAt   time.Time
}

// VHostConn returns a connection of the proxy's own account to backend in
// vhost, and a generation that differs for every connection it hands out,
// so that work bound to a connection (a trimmer) sees it replaced. The
// connection belongs to the watcher: open channels on it, never close it.
// A backend that is down gives ErrNotUp; a vhost the backend refuses (it
// does not exist there, or the account has no access to it) gives the
// broker's refusal, logged once and kept for vhostRetry before the
// backend is asked again.
func (w *Watcher) VHostConn(backend, vhost string) (*amqp.Connection, uint64, error) {
	w.mu.Lock()
	l := w.links[backend]
	if l == nil || l.state != Up {
		w.mu.Unlock()
		return nil, 0, fmt.Errorf("backend %s: %w", backend, ErrNotUp)
	}
	if vhost == l.vhost {
		conn, gen := l.conn, l.generation
		w.mu.Unlock()
		return conn, gen, nil
	}
	v := l.vhosts[vhost]
	if v == nil {
		v = &vhostConn{}
		l.vhosts[vhost] = v
	}
	w.mu.Unlock()

	v.mu.Lock()
	defer v.mu.Unlock()
	w.mu.Lock()
	up, upAt, b := l.state == Up, l.generation, l.backend
	conn, gen, err, failedAt := v.conn, v.generation, v.err, v.failedAt
	if conn != nil && (v.upAt != upAt || conn.IsClosed()) {
		v.conn = nil
		conn.CloseDeadline(time.Now())
		conn = nil
	}
	w.mu.Unlock()
	switch {
	case !up:
		return nil, 0, fmt.Errorf("backend %s: %w", backend, ErrNotUp)
	case conn != nil:
		return conn, gen, nil
	case err != nil && time.Since(failedAt) < vhostRetry:
		return nil, 0, err
	}

	b.URL, err = WithVHost(b.URL, vhost)
	if err == nil {
		conn, _, err = w.dial(b, "amqp-mirror (vhost "+vhost+")")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("backend %s, vhost %q: %w", backend, vhost, err)
		if v.err == nil || v.err.Error() != err.Error() {
			w.log.Error("cannot open a connection of the proxy's account in a vhost: nothing of that vhost is mirrored on the backend until it can (the vhost must exist there, and the account have configure, write and read permissions in it)",
				"backend", backend, "vhost", vhost, "err", err)
		}
		v.err, v.failedAt = err, time.Now()
		return nil, 0, err
	}
	select {
	case <-w.done:
		conn.CloseDeadline(time.Now())
		return nil, 0, fmt.Errorf("backend %s: %w (the watcher is closing)", backend, ErrNotUp)
	default:
	}
	if l.state != Up || l.generation != upAt {
		conn.CloseDeadline(time.Now()) // the backend went down meanwhile
		return nil, 0, fmt.Errorf("backend %s: %w", backend, ErrNotUp)
	}
	if v.err != nil {
		w.log.Info("backend accepts the proxy's account in the vhost again", "backend", backend, "vhost", vhost)
	}
	w.serial++
	v.conn, v.generation, v.upAt, v.err = conn, w.serial, upAt, nil
	return conn, v.generation, nil
}

// RefusedVHosts returns the vhosts in which backend refused the proxy's
// account at the last attempt, sorted.
func (w *Watcher) RefusedVHosts(backend string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	if l := w.links[backend]; l != nil {
		for name, v := range l.vhosts {
			if v.err != nil {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Refuses reports whether backend refused the proxy's account in vhost
// at the last attempt.
func (w *Watcher) Refuses(backend, vhost string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.links[backend]
	return l != nil && l.vhosts[vhost] != nil && l.vhosts[vhost].err != nil
}

// closeVHostsLocked closes a link's vhost connections: the backend went
// down, or the watcher is closing. Dials under way see the change when
// they end. Called with w.mu held.
func closeVHostsLocked(l *watchedLink) {
	for _, v := range l.vhosts {
		if v.conn != nil {
			v.conn.CloseDeadline(time.Now())
			v.conn = nil
		}
	}
}

// WithVHost returns rawURL with its vhost replaced: amqp091-go reads the
// vhost from the URL's path, percent-decoded, and takes an empty path for
// "/".
func WithVHost(rawURL, vhost string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parsing a backend's url: %w", err)
	}
	u.Path = "/" + vhost
	u.RawPath = "/" + url.PathEscape(vhost)
	return u.String(), nil
}

// vhostOf returns the vhost of an AMQP URL, as amqp091-go dials it.
func vhostOf(rawURL string) string {
	uri, err := amqp.ParseURI(rawURL)
	if err != nil {
		return "" // dialling it fails and says why
	}
	return uri.Vhost
}
