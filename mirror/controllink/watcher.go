package controllink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/internal/rawsock"
)

// Backend is a broker the watcher keeps a link to.
type Backend struct {
	Name string
	// URL is the backend's AMQP URL with the proxy's own account.
	URL string
	// TLS configures an amqps:// URL's connection; nil takes the system's
	// roots and the URL's host name.
	TLS *tls.Config
}

// State is what the watcher knows of a backend.
type State int

const (
	// Unknown: the first connection attempt has not ended yet.
	Unknown State = iota
	// Up: the watcher's connection is open and the broker answers.
	Up
	// Down: the broker refused or reset the connection, closed it, or did
	// not answer within the grace period.
	Down
)

var stateNames = []string{"unknown", "up", "down"}

func (s State) String() string {
	if s < 0 || int(s) >= len(stateNames) {
		return fmt.Sprintf("State(%d)", int(s))
	}
	return stateNames[s]
}

// Cause says why a backend went down; failover treats them differently
// (ha-promote-on-failure versus ha-promote-on-shutdown).
type Cause int

const (
	// CauseNone: the event is not a failure (a backend came up).
	CauseNone Cause = iota
	// CauseLost: the connection was refused, reset or cut. RabbitMQ
	// promotes at once when it sees a node go down, and so does the proxy.
	CauseLost
	// CauseUnresponsive: the connection is open but the broker did not
	// answer a probe within the grace period (a frozen process, a host gone
	// behind a live network).
	CauseUnresponsive
	// CauseShutdown: the broker closed the connection with 320
	// CONNECTION_FORCED, as RabbitMQ does when it is stopped cleanly.
	CauseShutdown
)

var causeNames = []string{"none", "connection lost", "unresponsive", "shutdown"}

func (c Cause) String() string {
	if c < 0 || int(c) >= len(causeNames) {
		return fmt.Sprintf("Cause(%d)", int(c))
	}
	return causeNames[c]
}

// Event is a change of a backend's state.
type Event struct {
	Backend string
	State   State
	Cause   Cause
	// At is when the change was seen.
	At time.Time
	// Err is the failure behind a Down event.
	Err error
	// Generation counts the watcher's connections to this backend; it rises
	// with every Up, so that work done on an older connection is recognised.
	Generation uint64
}

// WatcherOptions configure a Watcher; zero values take the defaults.
type WatcherOptions struct {
	// Grace is how long a broker that keeps its connection open but stops
	// answering is waited for before it is declared down (the config's
	// failover_grace). Default 2s.
	Grace time.Duration
	// ProbeInterval is how often the broker is asked a question. Default
	// Grace/4, so that a freeze is noticed within Grace plus one interval.
	ProbeInterval time.Duration
	// Retry bounds the pause between connection attempts to a backend that
	// is down (it starts at a tenth of it and doubles). Default 1s.
	Retry  time.Duration
	Logger *slog.Logger
}

func (o WatcherOptions) withDefaults() WatcherOptions {
	if o.Grace <= 0 {
		o.Grace = 2 * time.Second
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = max(o.Grace/4, 50*time.Millisecond)
	}
	if o.Retry <= 0 {
		o.Retry = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Watcher keeps one connection of the proxy's own to each backend, probes
// it, and reports every change of state on Events. One goroutine per
// backend owns that backend's connection; the current connection is handed
// to others (trimmers, syncs) through Conn.
type Watcher struct {
	opts   WatcherOptions
	log    *slog.Logger
	events chan Event
	done   chan struct{}
	wg     sync.WaitGroup

	mu     sync.Mutex
	links  map[string]*watchedLink
	serial uint64 // the vhost connections dialled (vhost.go)
	// taps are the delivery taps of the connections dial opened (tap.go);
	// each dial forgets those of connections closed since.
	taps map[*amqp.Connection]*Tap
}

type watchedLink struct {
	backend    Backend
	vhost      string // the vhost of the backend's URL, conn's
	state      State
	conn       *amqp.Connection // nil unless Up
	generation uint64
	downs      uint64 // transitions to Down, for metrics
	vhosts     map[string]*vhostConn
}

// NewWatcher starts watching backends. A backend that is down now is not an
// error: it is reported Down and watched until it comes up.
func NewWatcher(backends []Backend, opts WatcherOptions) *Watcher {
	opts = opts.withDefaults()
	w := &Watcher{
		opts:   opts,
		log:    opts.Logger.With("component", "backend-watcher"),
		events: make(chan Event, 4*len(backends)+4),
		done:   make(chan struct{}),
		links:  make(map[string]*watchedLink, len(backends)),
	}
	// Every link is in the map before the first watch goroutine reads it
	// (under mu, which this loop does not take).
	for _, b := range backends {
		w.links[b.Name] = &watchedLink{backend: b, vhost: vhostOf(b.URL), vhosts: make(map[string]*vhostConn)}
	}
	for _, b := range backends {
		w.wg.Add(1)
		go w.watch(b)
	}
	return w
}

// Events delivers every change of state, in order per backend. The reader
// must keep reading: a watcher whose events are not taken stops probing
// until they are (changes are rare; they must not be dropped).
func (w *Watcher) Events() <-chan Event { return w.events }

// State returns a backend's current state.
func (w *Watcher) State(backend string) State {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l := w.links[backend]; l != nil {
		return l.state
	}
	return Unknown
}

// Conn returns the current connection to a backend and its generation, or
// nil when the backend is not up. The connection belongs to the watcher:
// open channels on it, never close it.
func (w *Watcher) Conn(backend string) (*amqp.Connection, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l := w.links[backend]; l != nil && l.state == Up {
		return l.conn, l.generation
	}
	return nil, 0
}

// Downs returns how many times a backend went down since the watcher
// started (a backend down at start counts once).
func (w *Watcher) Downs(backend string) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l := w.links[backend]; l != nil {
		return l.downs
	}
	return 0
}

// Close stops watching and closes every connection.
func (w *Watcher) Close() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.links {
		closeVHostsLocked(l)
	}
}

// watch is one backend's goroutine: connect, probe until the connection
// fails, report, and connect again.
func (w *Watcher) watch(b Backend) {
	defer w.wg.Done()
	log := w.log.With("backend", b.Name)
	retry := w.opts.Retry / 10
	for {
		conn, observed, ch, err := w.connect(b)
		if err != nil {
			if w.transition(b.Name, Down, causeOf(err), err, nil) {
				logUnreachable(log, err)
			}
			select {
			case <-w.done:
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, w.opts.Retry)
			continue
		}
		retry = w.opts.Retry / 10
		w.transition(b.Name, Up, CauseNone, nil, conn)
		log.Info("backend up", "generation", w.generation(b.Name))
		cause, err := w.probe(conn, observed, ch)
		// A frozen broker never answers the close handshake: do not wait.
		conn.CloseDeadline(time.Now())
		if cause == CauseNone { // the watcher is closing
			return
		}
		w.transition(b.Name, Down, cause, err, nil)
		log.Warn("backend down", "cause", cause.String(), "err", err)
	}
}

// connect opens the connection and the channel the probes use, both within
// the grace period: a frozen broker must not hold the watcher.
func (w *Watcher) connect(b Backend) (*amqp.Connection, *observedConn, *amqp.Channel, error) {
	conn, observed, err := w.dial(b, "amqp-mirror backend watcher")
	if err != nil {
		return nil, nil, nil, err
	}
	opened := make(chan error, 1)
	var ch *amqp.Channel
	go func() {
		var err error
		ch, err = conn.Channel()
		opened <- err
	}()
	timeout := time.NewTimer(w.opts.Grace)
	defer timeout.Stop()
	select {
	case err = <-opened:
	case <-timeout.C:
		err = fmt.Errorf("opening a channel: %w", context.DeadlineExceeded)
	}
	if err != nil {
		conn.CloseDeadline(time.Now()) // also ends the goroutine's wait
		return nil, nil, nil, err
	}
	return conn, observed, ch, nil
}

// dial opens a connection of the watcher's to b, named name. The socket under amqp091-go is
// an observedConn, so that the broker's connection.close is seen even when a
// reset races it (closeframe.go). For an amqps:// URL the TLS client is set
// up here, beneath the observer, and amqp091-go is handed the URL as plain
// amqp:// (with its port): above TLS the frames are clear.
func (w *Watcher) dial(b Backend, name string) (*amqp.Connection, *observedConn, error) {
	// The handshake is bounded, since a frozen broker accepts TCP
	// connections (the kernel does) but never answers. The bound is not the
	// grace: a dial runs only while the backend is already down (or not yet
	// known), and RabbitMQ answers a wrong password by closing the socket
	// after three seconds, which must read as a refusal, not as a freeze.
	handshake := max(w.opts.Grace, 5*time.Second)
	dialURL, tlsConfig, err := plainURL(b)
	if err != nil {
		return nil, nil, err
	}
	dialer := &net.Dialer{Timeout: handshake}
	var observed *observedConn
	conn, err := amqp.DialConfig(dialURL, amqp.Config{
		Heartbeat: 10 * time.Second,
		Locale:    "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			raw, err := dialer.Dial(network, addr)
			if err != nil {
				return nil, err
			}
			// A trimmer's connection reads and writes thousands of
			// times a second: without the runtime's syscall entry,
			// which keeps waking its monitor thread (internal/rawsock).
			raw = rawsock.Wrap(raw)
			// amqp091-go clears the deadline once the connection is open.
			raw.SetDeadline(time.Now().Add(handshake))
			if tlsConfig != nil {
				client := tls.Client(raw, tlsConfig)
				if err := client.Handshake(); err != nil {
					raw.Close()
					return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
				}
				raw = &refusalConn{Conn: client}
			}
			observed = observe(raw)
			return observed, nil
		},
		Properties: amqp.Table{"connection_name": name},
	})
	if err == nil {
		w.mu.Lock()
		if w.taps == nil {
			w.taps = make(map[*amqp.Connection]*Tap)
		}
		for c := range w.taps {
			if c.IsClosed() {
				delete(w.taps, c)
			}
		}
		w.taps[conn] = &observed.tap
		w.mu.Unlock()
	}
	return conn, observed, err
}

// Tap returns the delivery tap of one of the watcher's connections (the
// ones VHostConn hands out), for TrimmerOptions.Tap; nil for another.
func (w *Watcher) Tap(conn *amqp.Connection) *Tap {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.taps[conn]
}

// refusalConn is a TLS client connection whose failed writes, until the
// broker has sent anything, report the alert it sent before it closed
// (pki.Refusal): a broker that refuses the proxy's client certificate, or
// its absence, is then logged as such rather than as a reset. Once the
// broker has spoken, TLS was accepted, and reading after a failed write
// could take bytes of the connection.close that observedConn looks for.
type refusalConn struct {
	*tls.Conn
	heard atomic.Bool
}

func (c *refusalConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.heard.Store(true)
	}
	return n, err
}

func (c *refusalConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil && !c.heard.Load() {
		err = pki.Refusal(c.Conn, err)
	}
	return n, err
}

// plainURL returns the URL amqp091-go is to dial for b, and for amqps:// the
// TLS configuration the watcher's own dial sets up: b.TLS, or the system's
// roots and the URL's host name, as amqp091-go would take.
func plainURL(b Backend) (string, *tls.Config, error) {
	u, err := url.Parse(b.URL)
	if err != nil {
		return "", nil, fmt.Errorf("backend %s: parsing its url: %w", b.Name, err)
	}
	if u.Scheme != "amqps" {
		return b.URL, nil, nil
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if b.TLS != nil {
		config = b.TLS.Clone()
	}
	if config.ServerName == "" {
		config.ServerName = u.Hostname()
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), "5671")
	}
	u.Scheme = "amqp"
	return u.String(), config, nil
}

// probe asks the broker a cheap question every ProbeInterval until the
// connection fails or the broker stops answering within Grace. It returns
// CauseNone only when the watcher is closing.
func (w *Watcher) probe(conn *amqp.Connection, observed *observedConn, ch *amqp.Channel) (Cause, error) {
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	answers := make(chan error, 1)
	ask := func() {
		// A passive declare of a built-in exchange: a round trip through
		// the broker's channel process that changes nothing.
		answers <- ch.ExchangeDeclarePassive("amq.direct", "direct", true, false, false, false, nil)
	}
	tick := time.NewTicker(w.opts.ProbeInterval)
	defer tick.Stop()
	for {
		select {
		case <-w.done:
			return CauseNone, nil
		case amqpErr := <-closed:
			return endCause(observed, notified(amqpErr))
		case <-tick.C:
		}
		go ask()
		deadline := time.NewTimer(w.opts.Grace)
		select {
		case <-w.done:
			deadline.Stop()
			return CauseNone, nil
		case amqpErr := <-closed:
			deadline.Stop()
			return endCause(observed, notified(amqpErr))
		case err := <-answers:
			deadline.Stop()
			if err != nil {
				return endCause(observed, fmt.Errorf("probe: %w", err))
			}
		case <-deadline.C:
			return CauseUnresponsive, fmt.Errorf("no answer to a probe within %s", w.opts.Grace)
		}
	}
}

// transition records a backend's new state and reports it, returning
// whether it changed.
func (w *Watcher) transition(backend string, state State, cause Cause, err error, conn *amqp.Connection) bool {
	w.mu.Lock()
	l := w.links[backend]
	if l.state == state && state != Up {
		w.mu.Unlock()
		return false
	}
	l.state, l.conn = state, conn
	switch state {
	case Up:
		l.generation++
	case Down:
		l.downs++
		closeVHostsLocked(l)
	}
	ev := Event{Backend: backend, State: state, Cause: cause, At: time.Now(), Err: err, Generation: l.generation}
	w.mu.Unlock()
	select {
	case w.events <- ev:
	case <-w.done:
	}
	return true
}

func (w *Watcher) generation(backend string) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.links[backend].generation
}

// logUnreachable says why a backend cannot be reached, once per outage. A
// broker that refuses the proxy's own account is a configuration error, not
// an outage, and says so.
func logUnreachable(log *slog.Logger, err error) {
	var amqpErr *amqp.Error
	if errors.Is(err, amqp.ErrCredentials) || errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused {
		log.Error("backend refuses the proxy's account: check the user and password in this backend's url", "err", err)
		return
	}
	log.Warn("backend unreachable; retrying", "err", err)
}

// endCause classifies the end of a connection that was up, from what the
// broker sent first: its connection.close 320 CONNECTION_FORCED is a clean
// stop however amqp091-go then learnt of the end (a write that met the reset
// after it, say), and any other connection.close is a loss. Without one, the
// error amqp091-go reported decides (causeOf).
func endCause(observed *observedConn, err error) (Cause, error) {
	var amqpErr *amqp.Error
	if m := observed.BrokerClose(); m != nil {
		if errors.As(err, &amqpErr) && amqpErr.Server && amqpErr.Code == int(m.ReplyCode) {
			return causeOf(err), err // amqp091-go read it too
		}
		brokerErr := &amqp.Error{Code: int(m.ReplyCode), Reason: m.ReplyText, Server: true}
		if err != nil {
			// Both: the broker's close says why, the failure says how the
			// client library heard of it.
			return causeOf(brokerErr), fmt.Errorf("%w (then: %v)", brokerErr, err)
		}
		return causeOf(brokerErr), brokerErr
	}
	if err == nil { // closed without an error: by us, which only happens at Close
		return CauseLost, errors.New("connection closed")
	}
	return causeOf(err), err
}

// notified turns NotifyClose's error into an error, nil (a close of ours)
// staying nil rather than becoming a non-nil error holding a nil pointer.
func notified(e *amqp.Error) error {
	if e == nil {
		return nil
	}
	return e
}

// causeOf classifies a failure: a timeout is a broker that does not answer,
// the broker's 320 CONNECTION_FORCED (also in a handshake, to a broker that
// is stopping) a clean stop, anything else a loss.
func causeOf(err error) Cause {
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) && amqpErr.Server && amqpErr.Code == amqp.ConnectionForced {
		return CauseShutdown
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return CauseUnresponsive
	}
	return CauseLost
}
