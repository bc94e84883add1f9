package proxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// ioBufferSize is the size of the buffered reader and writer on each socket.
// Large buffers mean few system calls per message: on two cores the proxy,
// the broker and the clients compete for the CPU, and syscalls are the cost.
const ioBufferSize = 64 << 10

// socket is one end of a proxied link: a client connection or a backend
// connection. Frames are read by exactly one goroutine (the read loop that owns
// the socket); frames are written by whichever goroutine produces them, under
// mu. The proxy does not hand frames to a separate writer goroutine: that would
// cost a copy and a goroutine switch per frame. Instead a producer writes into
// the buffered writer and flushes when its own input runs dry (see
// hookedReader), which batches writes exactly when batching is possible.
type socket struct {
	conn net.Conn
	in   *frames.Reader

	mu  sync.Mutex // guards out and writeErr
	out *frames.Writer
	// writeErr is the first write error; later writes fail fast with it, so a
	// producer never blocks on a socket that is already known to be broken.
	writeErr error

	// lastWrite is when bytes were last flushed to the socket (unix nanos);
	// the heartbeat loop sends a heartbeat when the socket has been quiet.
	lastWrite atomic.Int64
	// readWaitSince is when the read loop started waiting in conn.Read (unix
	// nanos), or 0 when it is not waiting. A peer is dead when the read loop
	// has waited one and a half heartbeat intervals (see heartbeatLoop); time
	// spent blocked writing to the other side (backpressure) does not count
	// against the peer.
	readWaitSince atomic.Int64

	// beforeRead runs before the read loop may block on the socket.
	beforeRead func()
}

func newSocket(conn net.Conn) *socket {
	s := &socket{conn: conn}
	s.in = frames.NewReader(hookedReader{s}, ioBufferSize)
	s.out = frames.NewWriter(conn, ioBufferSize)
	s.lastWrite.Store(time.Now().UnixNano())
	return s
}

// hookedReader is the socket's reader as its bufio layer sees it: every time
// the buffered reader needs more bytes, the read loop's pending output is
// flushed first, so nothing the peer waits for sits in a buffer while the
// proxy waits for the peer.
type hookedReader struct{ s *socket }

func (h hookedReader) Read(p []byte) (int, error) {
	if h.s.beforeRead != nil {
		h.s.beforeRead()
	}
	h.s.readWaitSince.Store(time.Now().UnixNano())
	n, err := h.s.conn.Read(p)
	h.s.readWaitSince.Store(0)
	return n, err
}

// writeFrame buffers one frame; it does not flush.
func (s *socket) writeFrame(typ uint8, channel uint16, payload []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return s.writeErr
	}
	if err := s.out.WriteFrame(typ, channel, payload); err != nil {
		s.writeErr = err
	}
	return s.writeErr
}

// writeMethod buffers one method frame; it does not flush.
func (s *socket) writeMethod(channel uint16, m frames.Method) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return s.writeErr
	}
	if err := s.out.WriteMethod(channel, m); err != nil {
		s.writeErr = err
	}
	return s.writeErr
}

// flush sends whatever is buffered.
func (s *socket) flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushLocked()
}

func (s *socket) flushLocked() error {
	if s.writeErr != nil {
		return s.writeErr
	}
	if s.out.Buffered() == 0 {
		return nil
	}
	if err := s.out.Flush(); err != nil {
		s.writeErr = err
		return err
	}
	s.lastWrite.Store(time.Now().UnixNano())
	return nil
}

// sendMethod writes one method frame and flushes it: for control frames
// (handshake, close) that must leave at once.
func (s *socket) sendMethod(channel uint16, m frames.Method) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return s.writeErr
	}
	if err := s.out.WriteMethod(channel, m); err != nil {
		s.writeErr = err
		return err
	}
	return s.flushLocked()
}

// sendFrame writes one raw frame and flushes it.
func (s *socket) sendFrame(typ uint8, channel uint16, payload []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return s.writeErr
	}
	if err := s.out.WriteFrame(typ, channel, payload); err != nil {
		s.writeErr = err
		return err
	}
	return s.flushLocked()
}

// heartbeatIfIdle sends a heartbeat frame when nothing was written for idle.
// It never waits for a producer that holds the lock: a producer that is
// writing is activity enough, and one blocked on a full socket means the peer
// is not reading, which no heartbeat would change.
func (s *socket) heartbeatIfIdle(now time.Time, idle time.Duration) {
	if now.UnixNano()-s.lastWrite.Load() < int64(idle) {
		return
	}
	if !s.mu.TryLock() {
		return
	}
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return
	}
	if err := s.out.WriteHeartbeat(); err != nil {
		s.writeErr = err
		return
	}
	_ = s.flushLocked()
}

// silentFor reports how long the read loop has been waiting for the peer.
func (s *socket) silentFor(now time.Time) time.Duration {
	since := s.readWaitSince.Load()
	if since == 0 {
		return 0
	}
	return time.Duration(now.UnixNano() - since)
}
