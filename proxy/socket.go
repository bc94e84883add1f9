package proxy

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// socket is one end of a proxied link: a client connection or a backend
// connection. Frames are read by exactly one goroutine, the read loop that
// owns the socket (in); frames are written by whichever goroutine produces
// them (out, a socketWriter that coalesces their flushes). A read loop
// flushes the sockets it writes to when its own socket runs dry (in.whenDry),
// which batches writes exactly when batching is possible. Neither side holds
// a buffer while it has no data (see buffers.go).
type socket struct {
	conn net.Conn
	in   *frameReader
	out  *socketWriter

	// readWaitSince is when the read loop started waiting for the peer (unix
	// nanos), or 0 when it is not waiting. A peer is dead when the read loop
	// has waited one and a half heartbeat intervals (see startHeartbeats); time
	// spent blocked writing to the other side (backpressure) does not count
	// against the peer.
	readWaitSince atomic.Int64
}

func newSocket(conn net.Conn) *socket {
	s := &socket{conn: conn, out: newSocketWriter(conn)}
	s.in = newFrameReader(conn, &s.readWaitSince)
	return s
}

// whenDry sets what the read loop does when its socket has nothing more to
// read, before it waits: flush what it produced for the other side.
func (s *socket) whenDry(f func()) { s.in.whenDry = f }

// writeFrame queues one frame; it does not flush.
func (s *socket) writeFrame(typ uint8, channel uint16, payload []byte) error {
	return s.out.writeFrame(typ, channel, payload)
}

// writeMethod queues one method frame; it does not flush.
func (s *socket) writeMethod(channel uint16, m frames.Method) error {
	return s.out.writeMethod(channel, m)
}

// flush sends whatever is queued (or leaves it to the write in flight).
func (s *socket) flush() error { return s.out.flush() }

// sendMethod writes one method frame and flushes it: for control frames
// (handshake, close) that must leave at once.
func (s *socket) sendMethod(channel uint16, m frames.Method) error {
	if err := s.out.writeMethod(channel, m); err != nil {
		return err
	}
	return s.out.flush()
}

// sendFrame writes one raw frame and flushes it.
func (s *socket) sendFrame(typ uint8, channel uint16, payload []byte) error {
	if err := s.out.writeFrame(typ, channel, payload); err != nil {
		return err
	}
	return s.out.flush()
}

// sendProtocolHeader writes the AMQP 0-9-1 protocol header and flushes it.
func (s *socket) sendProtocolHeader() error {
	if err := s.out.writeProtocolHeader(); err != nil {
		return err
	}
	return s.out.flush()
}

// heartbeatIfIdle sends a heartbeat frame when nothing was written for idle
// (see socketWriter.heartbeatIfIdle).
func (s *socket) heartbeatIfIdle(now time.Time, idle time.Duration) {
	s.out.heartbeatIfIdle(now, idle)
}

// silentFor reports how long the read loop has been waiting for the peer.
func (s *socket) silentFor(now time.Time) time.Duration {
	since := s.readWaitSince.Load()
	if since == 0 {
		return 0
	}
	return time.Duration(now.UnixNano() - since)
}
