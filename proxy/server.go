package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/memory"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("proxy: server closed")

// Backend is a broker the proxy connects clients to.
type Backend struct {
	Name string
	// Addr is host:port of the broker's AMQP listener.
	Addr string
	// TLS, when set, makes backend connections AMQPS.
	TLS *tls.Config
}

// Options configure a Server. Every field is taken as given; DefaultOptions
// has RabbitMQ's defaults.
type Options struct {
	// Backend is the home backend each client's handshake tries first (the
	// broker beside this proxy in sidecar mode).
	Backend Backend
	// Others are the other backends, which clients reach through the
	// mirroring engine; empty without mirroring. A handshake that cannot
	// reach Backend, or finds the engine counting it down, goes to the
	// first of them that answers, in this order.
	Others []Backend
	// Mirror is the replication engine; nil serves Backend alone.
	Mirror Mirror
	// ClientNode is the backend the client-local locator picks for clients
	// of this proxy (the config's node), "" in drop-in mode.
	ClientNode string
	Logger     *slog.Logger
	// HandshakeTimeout bounds the time from accept to connection.open-ok.
	HandshakeTimeout time.Duration
	// DialTimeout bounds opening a backend connection.
	DialTimeout time.Duration
	// Heartbeat is the interval the proxy keeps on a backend connection whose
	// client turned heartbeats off; 0 means 60s. Clients are offered the
	// backend's own interval, as the broker would offer it.
	Heartbeat time.Duration
	// FrameMax and ChannelMax cap what the proxy offers clients; the
	// backend's own limits cap them further.
	FrameMax   uint32
	ChannelMax uint16
	// CloseTimeout bounds the wait for a peer's close-ok.
	CloseTimeout time.Duration
	// FailoverWait is how long the consumers of a mirrored queue whose
	// master's link was lost wait for a new master before they are
	// cancelled; 0 means 10s.
	FailoverWait time.Duration
}

// DefaultOptions returns RabbitMQ's defaults for everything but the backend.
func DefaultOptions(backend Backend) Options {
	return Options{
		Backend:          backend,
		Logger:           slog.Default(),
		HandshakeTimeout: 10 * time.Second,
		DialTimeout:      5 * time.Second,
		Heartbeat:        60 * time.Second,
		FrameMax:         131072,
		ChannelMax:       2047,
		CloseTimeout:     5 * time.Second,
	}
}

func (o Options) validate() error {
	var errs []error
	if o.Backend.Addr == "" {
		errs = append(errs, errors.New("backend address is empty"))
	}
	if o.FrameMax != 0 && o.FrameMax < 4096 {
		errs = append(errs, fmt.Errorf("frame_max %d is below the protocol minimum 4096", o.FrameMax))
	}
	if o.HandshakeTimeout <= 0 || o.DialTimeout <= 0 || o.CloseTimeout <= 0 {
		errs = append(errs, errors.New("handshake, dial and close timeouts must be positive"))
	}
	if o.Heartbeat < 0 {
		errs = append(errs, errors.New("heartbeat must not be negative"))
	}
	return errors.Join(errs...)
}

// Server is the client-facing AMQP 0-9-1 server.
type Server struct {
	opts Options
	log  *slog.Logger

	mu        sync.Mutex
	paused    bool // see Pause
	listeners map[net.Listener]struct{}
	conns     map[*clientConn]struct{}
	closed    bool
	connWG    sync.WaitGroup

	// backends are Backend and the others, by index, in the order the
	// handshake tries them; backendIndex finds them by name.
	backends     []Backend
	backendIndex map[string]int
	backendNames []string

	nextConnID atomic.Uint64
	stats      Stats
	// releaser returns memory to the system after a storm of connections.
	releaser *memory.Releaser
	// stopWatch ends watchMirror; watchDone is closed when it returned.
	stopWatch, watchDone chan struct{}
	// delivered remembers recent deliveries of mirrored queues, to flag
	// their redelivery by a promoted slave (internal/ledger/redelivered.go).
	delivered *ledger.DeliveredIDs
	// confirmLatency observes, in seconds, how long each publish on a
	// channel in confirm mode waited for its ack (RegisterMetrics); nil
	// until the metrics are registered.
	confirmLatency atomic.Pointer[func(seconds float64)]
}

// Stats are the server's counters, safe to read at any time.
type Stats struct {
	ConnectionsOpened atomic.Uint64
	ConnectionsOpen   atomic.Int64
	// ClosedByReason counts ended connections by CloseReason.
	ClosedByReason [len(reasonNames)]atomic.Uint64

	// The message counters, bumped by the goroutines of every connection.
	// Each has a cache line of its own, so that a core counting deliveries
	// does not take the line from one counting publishes.
	_ [64]byte
	// Publishes counts the clients' basic.publish methods.
	Publishes atomic.Uint64
	_         [56]byte
	// Deliveries counts the messages delivered to clients: basic.deliver
	// and basic.get-ok.
	Deliveries atomic.Uint64
	_          [56]byte
	// Acks counts the deliveries the clients' basic.ack settled.
	Acks atomic.Uint64
	_    [56]byte
	// Returns counts the basic.return the clients were sent.
	Returns atomic.Uint64
	_       [56]byte
}

// New returns a Server that serves clients with opts.
func New(opts Options) (*Server, error) {
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("proxy options: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.FailoverWait <= 0 {
		opts.FailoverWait = 10 * time.Second
	}
	backends := append([]Backend{opts.Backend}, opts.Others...)
	index := make(map[string]int, len(backends))
	names := make([]string, len(backends))
	for i, b := range backends {
		index[b.Name] = i
		names[i] = b.Name
	}
	s := &Server{
		stopWatch:    make(chan struct{}),
		watchDone:    make(chan struct{}),
		backends:     backends,
		backendIndex: index,
		backendNames: names,
		opts:         opts,
		log:          opts.Logger,
		listeners:    make(map[net.Listener]struct{}),
		conns:        make(map[*clientConn]struct{}),
		releaser:     memory.NewReleaser(),
		delivered:    ledger.NewDeliveredIDs(),
	}
	if opts.Mirror != nil {
		var asks <-chan ledger.PeerAsk
		if opts.Mirror.Clustered() {
			asks = s.delivered.AskPeers(askBacklog)
		}
		go s.watchMirror(asks)
	} else {
		close(s.watchDone)
	}
	return s, nil
}

// askBacklog bounds the questions for the other proxies waiting to be
// asked (ledger.DeliveredIDs.AskPeers); askers is how many are asked at
// once, so that the promotions of a whole node's queues do not open a
// connection to every other proxy for each queue at the same moment.
const (
	askBacklog = 1024
	askers     = 8
)

// watchMirror checks every connection's links against the engine's view
// of the backends and its consumers against their queues' masters (see
// failover.go), and has the askers put to the other proxies of a sidecar
// cluster the questions of the record of deliveries (asks, nil for a
// proxy alone), until the server closes.
func (s *Server) watchMirror(asks <-chan ledger.PeerAsk) {
	ctx, cancel := context.WithCancel(context.Background())
	var asking sync.WaitGroup
	defer func() {
		cancel()
		asking.Wait()
		close(s.watchDone)
	}()
	if asks != nil {
		for range askers {
			asking.Go(func() {
				for {
					select {
					case <-ctx.Done():
						return
					case a := <-asks:
						s.askPeers(ctx, a)
					}
				}
			})
		}
	}
	ticker := time.NewTicker(masterCheckInterval)
	defer ticker.Stop()
	lastSweep := time.Now()
	for {
		var now time.Time
		select {
		case <-s.stopWatch:
			return
		case now = <-ticker.C:
		}
		if now.Sub(lastSweep) >= ledger.SweepEvery {
			s.delivered.Sweep(s.opts.Mirror.Lookup, now)
			lastSweep = now
		}
		s.mu.Lock()
		conns := make([]*clientConn, 0, len(s.conns))
		for c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		for _, c := range conns {
			if c.isOpen() {
				c.keeper.checkLinks()
				c.mover.checkMasters()
				c.releaseLostCopies()
			}
		}
	}
}

// askPeers asks the other proxies which messages of a queue they
// delivered before its epoch, and hands the answer to the record of
// deliveries.
func (s *Server) askPeers(ctx context.Context, a ledger.PeerAsk) {
	ctx, cancel := context.WithTimeout(ctx, ledger.AskWait)
	defer cancel()
	ids, err := s.opts.Mirror.DeliveredByPeers(ctx, a.Queue, a.Epoch)
	s.delivered.Answered(a.Queue, a.Epoch, ids, time.Now())
	if err != nil && ctx.Err() != context.Canceled {
		s.log.Warn("cannot learn what the other proxies delivered of a queue before its promotion; a message they delivered may come back through this proxy without redelivered",
			"queue", a.Queue.Name, "vhost", a.Queue.VHost, "epoch", a.Epoch, "learned", len(ids), "err", err)
	}
}

// DeliveredBefore returns the messages of queue id this proxy delivered
// while its epoch was below epoch, for another proxy's question (its
// askPeers).
func (s *Server) DeliveredBefore(id mirror.QueueID, epoch uint64) []mirror.MessageID {
	return s.delivered.DeliveredBefore(id, epoch)
}

// stopWatching ends watchMirror and waits for it.
func (s *Server) stopWatching() {
	s.mu.Lock()
	select {
	case <-s.stopWatch:
	default:
		close(s.stopWatch)
	}
	s.mu.Unlock()
	<-s.watchDone
}

// Pause stops serving, as a RabbitMQ node paused by pause_minority does: every
// client connection gets connection.close 320, and new ones are closed at
// once until Resume. A proxy cut off from the majority of its cluster must
// not serve mirrored queues, whose masters the majority may have promoted
// elsewhere meanwhile; its clients reconnect to a proxy of the majority.
func (s *Server) Pause() {
	s.mu.Lock()
	if s.paused || s.closed {
		s.mu.Unlock()
		return
	}
	s.paused = true
	conns := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		if c.isOpen() {
			c.closeClient(ReasonPaused, frames.ConnectionForced,
				"CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", 0, 0)
			continue
		}
		c.teardown(ReasonPaused, "paused during the handshake")
	}
}

// Resume serves again after Pause.
func (s *Server) Resume() {
	s.mu.Lock()
	s.paused = false
	s.mu.Unlock()
}

// Paused reports whether the server is paused (Pause) and refuses clients.
func (s *Server) Paused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused
}

// Stats returns the server's live counters.
func (s *Server) Stats() *Stats { return &s.stats }

// Serve accepts client connections on ln until Shutdown or Close, and returns
// ErrServerClosed then. For AMQPS, pass a tls.Listener.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()

	var backoff time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, wire.ErrTooManyFiles) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; retrying", "err", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accept on %s: %w", ln.Addr(), err)
		}
		backoff = 0
		s.startConn(conn)
	}
}

func (s *Server) startConn(conn net.Conn) {
	c := newClientConn(s, s.nextConnID.Add(1), conn)
	s.mu.Lock()
	if s.closed || s.paused {
		s.mu.Unlock()
		conn.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.mu.Unlock()
	s.stats.ConnectionsOpened.Add(1)
	s.releaser.Opened(s.stats.ConnectionsOpen.Add(1))
	go func() {
		ok, reason := c.open()
		if !ok {
			s.connEnded(c, reason)
			return
		}
		go func() { s.connEnded(c, c.run()) }()
	}()
}

// connEnded counts a connection that ended and forgets it.
func (s *Server) connEnded(c *clientConn, reason CloseReason) {
	defer s.connWG.Done()
	s.stats.ClosedByReason[reason].Add(1)
	s.releaser.Closed(s.stats.ConnectionsOpen.Add(-1))
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// beginClose stops accepting and returns the connections still open.
func (s *Server) beginClose() []*clientConn {
	s.releaser.Stop()
	s.stopWatching()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for ln := range s.listeners {
		ln.Close()
	}
	conns := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// Shutdown stops accepting, asks every client to close with 320
// CONNECTION_FORCED (as RabbitMQ does when it stops), and waits until they
// have closed or ctx is done; then it closes what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	for _, c := range s.beginClose() {
		c.shutdown()
	}
	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.Close()
		<-done
		return ctx.Err()
	}
}

// Close closes every listener and connection at once and waits for their
// goroutines to end.
func (s *Server) Close() error {
	for _, c := range s.beginClose() {
		c.teardown(ReasonShutdown, "server closed")
	}
	s.connWG.Wait()
	return nil
}
