package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// forwardByte opens a connection that carries a forwarded write instead of
// raft traffic. Raft's network transport starts every connection with the
// type of its first RPC, a small number (0-3 in raft 1.8); any value far
// from those would do.
const forwardByte = 0xF0

// classifyTimeout bounds how long an accepted connection may take to send
// its first byte; raft sends it at once.
const classifyTimeout = 5 * time.Second

// tcpStreamLayer is raft's TCP stream layer (what raft.NewTCPTransport
// builds) with two additions:
//
//   - it shares the port with forwarded writes: each accepted connection is
//     classified by its first byte, off raft's accept loop so that a slow
//     peer cannot stall it; raft's connections reach Accept with that byte
//     put back, forwarded writes go to the handler;
//   - with TLS set, every connection runs mutual TLS (MutualTLS): an
//     accepted one is classified only after its handshake, so a peer
//     without a member's certificate reaches neither raft nor a handler;
//   - closing it also closes every connection it accepted or dialed. Raft's
//     transport closes only its listener, which would leave the goroutines
//     serving accepted connections blocked until the peer hangs up, and
//     peers talking to a node that is gone.
//
// Tests wrap it (Config.network) to cut connections.
type tcpStreamLayer struct {
	listener  net.Listener
	advertise net.Addr
	tls       *MutualTLS // nil: plaintext
	log       *slog.Logger
	accepted  chan net.Conn
	done      chan struct{}
	wg        sync.WaitGroup
	// forward serves a forwarded write; nil until the store is open, and
	// connections that arrive before are closed.
	forward atomic.Pointer[func(net.Conn)]
	// peer serves a connection of peer messages and call a call
	// (peers.go), nil alike.
	peer, call atomic.Pointer[func(net.Conn)]

	mu     sync.Mutex
	conns  map[*layerConn]struct{}
	closed bool
}

func newTCPStreamLayer(ln net.Listener, advertise net.Addr, mutual *MutualTLS, log *slog.Logger) *tcpStreamLayer {
	l := &tcpStreamLayer{
		listener:  ln,
		advertise: advertise,
		tls:       mutual,
		log:       log,
		accepted:  make(chan net.Conn),
		done:      make(chan struct{}),
		conns:     make(map[*layerConn]struct{}),
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *tcpStreamLayer) acceptLoop() {
	defer l.wg.Done()
	for {
		conn, err := l.listener.Accept()
		if err != nil {
			return // closed; Accept reports it through done
		}
		if l.tls != nil {
			conn = tls.Server(conn, l.tls.Server)
		}
		tracked, err := l.track(conn)
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.classify(tracked)
	}
}

func (l *tcpStreamLayer) classify(conn net.Conn) {
	defer l.wg.Done()
	first := make([]byte, 1)
	conn.SetReadDeadline(time.Now().Add(classifyTimeout))
	if _, err := io.ReadFull(conn, first); err != nil {
		// A connection closed before its first byte is a probe
		// (answering, in pause.go) or a peer going away: not news.
		if l.tls != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			l.log.Warn("raft port: refused a connection that is not a member's mutual TLS", "remote", conn.RemoteAddr().String(), "error", err)
		}
		conn.Close()
		return
	}
	conn.SetReadDeadline(time.Time{})
	if first[0] == forwardByte || first[0] == peerByte || first[0] == callByte {
		h := l.forward.Load()
		switch first[0] {
		case peerByte:
			h = l.peer.Load()
		case callByte:
			h = l.call.Load()
		}
		if h != nil {
			(*h)(conn)
		}
		conn.Close()
		return
	}
	select {
	case l.accepted <- &prefixConn{Conn: conn, prefix: first}:
	case <-l.done:
		conn.Close()
	}
}

// Accept hands raft its next connection.
func (l *tcpStreamLayer) Accept() (net.Conn, error) {
	select {
	case conn := <-l.accepted:
		return conn, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *tcpStreamLayer) Addr() net.Addr { return l.advertise }

func (l *tcpStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout("tcp", string(address), timeout)
	if err != nil {
		return nil, err
	}
	if l.tls != nil {
		tc := tls.Client(conn, l.tls.Client)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("TLS handshake with %s: %w", address, err)
		}
		conn = tc
	}
	return l.track(conn)
}

func (l *tcpStreamLayer) track(conn net.Conn) (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		conn.Close()
		return nil, net.ErrClosed
	}
	lc := &layerConn{Conn: conn, layer: l}
	l.conns[lc] = struct{}{}
	return lc, nil
}

// Close closes the listener and every connection accepted or dialed, and
// waits for the goroutines serving them. It is idempotent.
func (l *tcpStreamLayer) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	conns := make([]*layerConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	close(l.done)
	err := l.listener.Close()
	for _, c := range conns {
		c.closeNow()
	}
	l.wg.Wait()
	return err
}

// MutualTLS is the raft port's mutual TLS: Server serves accepted
// connections and must require and verify a member's client certificate,
// Client dials the other members with this one's. pki.Mutual builds both.
type MutualTLS struct {
	Server, Client *tls.Config
}

type layerConn struct {
	net.Conn
	layer *tcpStreamLayer
}

func (c *layerConn) Close() error {
	c.layer.mu.Lock()
	delete(c.layer.conns, c)
	c.layer.mu.Unlock()
	return c.Conn.Close()
}

// closeNow closes the connection without TLS's close_notify, whose write
// could wait for a peer that no longer reads.
func (c *layerConn) closeNow() {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		tc.NetConn().Close()
	}
	c.Close()
}

// prefixConn gives back the byte classify read before the rest.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
