// Package wire is the proxy's socket layer: a frame reader and a coalescing
// writer per socket, the raw system calls they make, and the pooled buffers
// they hold only while they have data. It knows frames and sockets, nothing
// of channels, links or clients.
package wire

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// Socket is one end of a proxied link: a client connection or a backend
// connection. Frames are read by exactly one goroutine, the read loop that
// owns the socket (in); frames are written by whichever goroutine produces
// them (out, a socketWriter that coalesces their flushes). A read loop
// flushes the sockets it writes to when its own socket runs dry (WhenDry),
// which batches writes exactly when batching is possible. Neither side holds
// a buffer while it has no data (see buffers.go).
type Socket struct {
	conn net.Conn
	in   *frameReader
	out  *socketWriter

	// readWaitSince is when the read loop started waiting for the peer (unix
	// nanos), or 0 when it is not waiting. A peer is dead when the read loop
	// has waited one and a half heartbeat intervals (the proxy's heartbeat
	// checks); time
	// spent blocked writing to the other side (backpressure) does not count
	// against the peer.
	readWaitSince atomic.Int64
}

// NewSocket makes the reader and writer of conn.
func NewSocket(conn net.Conn) *Socket {
	s := &Socket{conn: conn, out: newSocketWriter(conn)}
	s.in = newFrameReader(conn, &s.readWaitSince)
	return s
}

// Conn is the connection the socket reads and writes.
func (s *Socket) Conn() net.Conn { return s.conn }

// WhenDry sets what the read loop does when its socket has nothing more to
// read, before it waits: flush what it produced for the other side.
func (s *Socket) WhenDry(f func()) { s.in.whenDry = f }

// ReadFrame reads the next frame; only the socket's read loop calls it (see
// frameReader.ReadFrame: the payload is valid until the next call).
func (s *Socket) ReadFrame() (frames.Frame, error) { return s.in.ReadFrame() }

// ReadProtocolHeader reads the 8-byte protocol header a client sends first.
func (s *Socket) ReadProtocolHeader() error { return s.in.ReadProtocolHeader() }

// SetMaxFrameSize sets the largest frame the reader accepts, normally the
// negotiated frame_max.
func (s *Socket) SetMaxFrameSize(n uint32) { s.in.SetMaxFrameSize(n) }

// WriteFrame queues one frame; it does not flush.
func (s *Socket) WriteFrame(typ uint8, channel uint16, payload []byte) error {
	return s.out.writeFrame(typ, channel, payload)
}

// WriteMethod queues one method frame; it does not flush.
func (s *Socket) WriteMethod(channel uint16, m frames.Method) error {
	return s.out.writeMethod(channel, m)
}

// Flush sends whatever is queued (or leaves it to the write in flight).
func (s *Socket) Flush() error { return s.out.flush() }

// SendMethod writes one method frame and flushes it: for control frames
// (handshake, close) that must leave at once.
func (s *Socket) SendMethod(channel uint16, m frames.Method) error {
	if err := s.out.writeMethod(channel, m); err != nil {
		return err
	}
	return s.out.flush()
}

// SendFrame writes one raw frame and flushes it.
func (s *Socket) SendFrame(typ uint8, channel uint16, payload []byte) error {
	if err := s.out.writeFrame(typ, channel, payload); err != nil {
		return err
	}
	return s.out.flush()
}

// SendProtocolHeader writes the AMQP 0-9-1 protocol header and flushes it.
func (s *Socket) SendProtocolHeader() error {
	if err := s.out.writeProtocolHeader(); err != nil {
		return err
	}
	return s.out.flush()
}

// HeartbeatIfIdle sends a heartbeat frame when nothing was written for idle
// (see socketWriter.heartbeatIfIdle).
func (s *Socket) HeartbeatIfIdle(now time.Time, idle time.Duration) {
	s.out.heartbeatIfIdle(now, idle)
}

// SilentFor reports how long the read loop has been waiting for the peer.
func (s *Socket) SilentFor(now time.Time) time.Duration {
	since := s.readWaitSince.Load()
	if since == 0 {
		return 0
	}
	return time.Duration(now.UnixNano() - since)
}
