package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/internal/rawsock"
)

// socketWriter is the write side of one socket, shared by every goroutine that
// produces frames for it: today the opposite read loop and the heartbeat checks,
// with mirroring several backend links writing to one client socket.
//
// Producers append frames to a pending buffer under mu and return; nothing
// waits for the socket then. Whoever flushes while no write is in flight
// becomes the writer: it takes the pending buffer, writes it with one system
// call outside the lock, and repeats while more arrived meanwhile. A flush
// while a write is in flight returns at once, since that writer sends what
// the flusher queued when its write returns. So frames from several
// producers, and every frame that arrives while the socket is busy, leave
// together in the next write, without a writer goroutine and the handoff it
// would cost per batch (the design nats-server's flush coalescing and
// amqproxy's buffered upstream writes follow, without their dedicated loop).
//
// The pending buffer starts at the smallest class and grows up to
// writeBufferSize. Backpressure: it holds at most writeBufferSize bytes. A
// producer whose frame does not fit becomes the writer, or, while another
// goroutine writes, waits until that write took the buffer. A producer that
// waits stops reading its own socket, so a slow peer slows its writers'
// peers through TCP, and a socket pins at most two buffers (one being
// written, one filling) plus the frame its producer holds.
//
// Frames of largeFrame bytes or more are not copied: their producer waits
// until it may write and sends pending bytes, header, payload and frame-end
// with one writev.
//
// The first write error sticks: every later call returns it at once.
type socketWriter struct {
	conn net.Conn
	raw  syscall.RawConn // nil when conn has no file descriptor of its own (TLS)

	mu      sync.Mutex
	pending *buffer // frames not yet taken by a writer; nil when none
	n       int     // bytes in pending
	writing bool    // a writer is in conn.Write; it drains pending before it stops
	// waiters counts producers waiting in cond for the writer (frame did not
	// fit, or a large frame waits for its turn).
	waiters int
	cond    sync.Cond
	err     error

	// lastWrite is when a write last completed (unix nanos); the heartbeat
	// loop sends a heartbeat when the socket has been quiet.
	lastWrite atomic.Int64

	iov net.Buffers // reused by writeLarge; only the writer touches it
	// The raw write's state, kept here so that it allocates nothing per
	// write; only the writer touches it.
	rawFunc func(fd uintptr) bool
	rawOut  []byte
	rawErr  error
}

// largeFrame is the payload size from which a frame is written from its
// producer's memory instead of being copied into the pending buffer.
const largeFrame = 16 << 10

func newSocketWriter(conn net.Conn) *socketWriter {
	w := &socketWriter{conn: conn}
	w.cond.L = &w.mu
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			w.raw = raw
			w.rawFunc = w.writeOnce
		}
	}
	w.lastWrite.Store(time.Now().UnixNano())
	return w
}

// validator is implemented by generated methods whose fields Append could
// not encode faithfully (frames.Writer.WriteMethod checks it too).
type validator interface{ Validate() error }

// writeFrame queues one frame; it does not flush. payload may be reused when
// it returns.
func (w *socketWriter) writeFrame(typ uint8, channel uint16, payload []byte) error {
	if len(payload) >= largeFrame {
		return w.writeLarge(typ, channel, payload)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.reserveLocked(len(payload) + frames.FrameOverhead); err != nil {
		return err
	}
	b := w.pending.b[w.n:]
	putFrameHeader(b, typ, channel, len(payload))
	copy(b[7:], payload)
	b[7+len(payload)] = frames.FrameEnd
	w.n += len(payload) + frames.FrameOverhead
	return nil
}

// writeMethod encodes m straight into the pending buffer; it does not flush.
func (w *socketWriter) writeMethod(channel uint16, m frames.Method) error {
	if v, ok := m.(validator); ok {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// Methods the proxy makes itself are small (acks, closes, tags); a
	// generous reservation keeps Append from ever reallocating in steady
	// state, and a method larger than that still encodes correctly.
	const room = 512
	if err := w.reserveLocked(room); err != nil {
		return err
	}
	start := w.n
	body := m.Append(w.pending.b[start+7 : start+7])
	size := len(body)
	if uint64(size) > math.MaxUint32 {
		return fmt.Errorf("%s on channel %d: %w: %d bytes", m.Name(), channel, frames.ErrUnencodable, size)
	}
	if size+frames.FrameOverhead > len(w.pending.b)-start {
		// Append outgrew the buffer: rare, so a second pass through the
		// general path is fine.
		encoded := append([]byte(nil), body...)
		w.mu.Unlock()
		err := w.writeFrame(frames.FrameMethod, channel, encoded)
		w.mu.Lock()
		return err
	}
	putFrameHeader(w.pending.b[start:], frames.FrameMethod, channel, size)
	w.pending.b[start+7+size] = frames.FrameEnd
	w.n += size + frames.FrameOverhead
	return nil
}

// writeProtocolHeader queues the AMQP 0-9-1 protocol header.
func (w *socketWriter) writeProtocolHeader() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.reserveLocked(len(frames.ProtocolHeader)); err != nil {
		return err
	}
	w.n += copy(w.pending.b[w.n:], frames.ProtocolHeader)
	return nil
}

// reserveLocked makes room for n more bytes in the pending buffer: it takes a
// buffer when there is none, and when the frame does not fit it writes (or
// waits for the writer) first. n is at most writeBufferSize.
func (w *socketWriter) reserveLocked(n int) error {
	for {
		if w.err != nil {
			return w.err
		}
		if w.pending == nil {
			w.pending, w.n = getBuffer(max(n, minBufferSize)), 0
		}
		if w.n+n <= len(w.pending.b) {
			return nil
		}
		if w.n+n <= writeBufferSize {
			// Room within the bound: move to a larger class.
			larger := getBuffer(max(w.n+n, nextClass(len(w.pending.b))))
			copy(larger.b, w.pending.b[:w.n])
			putBuffer(w.pending)
			w.pending = larger
			return nil
		}
		if w.writing {
			w.waitLocked()
			continue
		}
		w.drainLocked()
	}
}

// waitLocked waits until the writer took the pending buffer or stopped.
func (w *socketWriter) waitLocked() {
	w.waiters++
	w.cond.Wait()
	w.waiters--
}

// flush makes sure everything queued so far gets written: it writes itself
// unless a write is in flight, whose writer then sends it.
func (w *socketWriter) flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.writing {
		w.drainLocked()
	}
	return w.err
}

// drainLocked writes the pending buffer, and again while producers queued
// more meanwhile, with mu released during each write. The caller holds mu
// and no write is in flight.
func (w *socketWriter) drainLocked() {
	for w.pending != nil && w.err == nil {
		buf, n := w.pending, w.n
		w.pending, w.n = nil, 0
		w.writing = true
		if w.waiters > 0 {
			w.cond.Broadcast() // there is room again
		}
		w.mu.Unlock()
		err := w.writeAll(buf.b[:n])
		putBuffer(buf)
		w.mu.Lock()
		w.finishWriteLocked(err)
	}
	if w.err != nil && w.pending != nil {
		putBuffer(w.pending)
		w.pending, w.n = nil, 0
	}
	w.writing = false
	if w.waiters > 0 {
		w.cond.Broadcast()
	}
}

// writeAll writes b whole. On a TCP connection it makes the system calls
// itself (see internal/rawsock), waiting for the poller while the socket is full.
func (w *socketWriter) writeAll(b []byte) error {
	if w.raw == nil {
		_, err := w.conn.Write(b)
		return err
	}
	w.rawOut, w.rawErr = b, nil
	err := w.raw.Write(w.rawFunc)
	w.rawOut = nil
	if err != nil {
		return err // deadline or closed socket, as net.Conn.Write says it
	}
	if w.rawErr != nil {
		return &net.OpError{Op: "write", Net: "tcp", Source: w.conn.LocalAddr(), Addr: w.conn.RemoteAddr(), Err: os.NewSyscallError("write", w.rawErr)}
	}
	return nil
}

// writeOnce is the RawConn callback: write until done, or until the socket
// is full (false: RawConn waits until it is writable and calls again).
func (w *socketWriter) writeOnce(fd uintptr) bool {
	var err error
	w.rawOut, err = rawsock.WriteUntilFull(fd, w.rawOut)
	if err == syscall.EAGAIN {
		return false
	}
	w.rawErr = err
	return true
}

func (w *socketWriter) finishWriteLocked(err error) {
	if err != nil && w.err == nil {
		w.err = err
	}
	w.lastWrite.Store(time.Now().UnixNano())
}

// writeLarge writes a large frame from the producer's memory, after whatever
// is pending, in one writev; the producer waits for its turn as the writer.
func (w *socketWriter) writeLarge(typ uint8, channel uint16, payload []byte) error {
	if uint64(len(payload)) > math.MaxUint32 {
		return fmt.Errorf("%s frame on channel %d: %w: payload of %d bytes", frames.FrameTypeName(typ), channel, frames.ErrUnencodable, len(payload))
	}
	var header [7]byte
	var end = [1]byte{frames.FrameEnd}
	putFrameHeader(header[:], typ, channel, len(payload))
	w.mu.Lock()
	for w.writing && w.err == nil {
		w.waitLocked()
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	buf, n := w.pending, w.n
	w.pending, w.n = nil, 0
	w.writing = true
	w.mu.Unlock()

	w.iov = w.iov[:0]
	if buf != nil {
		w.iov = append(w.iov, buf.b[:n])
	}
	w.iov = append(w.iov, header[:], payload, end[:])
	iov := w.iov // WriteTo consumes the slice header it is given
	_, err := iov.WriteTo(w.conn)
	clear(w.iov) // drop references to the payload and the buffer
	if buf != nil {
		putBuffer(buf)
	}

	w.mu.Lock()
	w.finishWriteLocked(err)
	// What producers queued meanwhile goes out now, as after any write.
	w.drainLocked()
	err = w.err
	w.mu.Unlock()
	return err
}

// heartbeatIfIdle writes a heartbeat frame when nothing was written for idle.
// It never waits: a write in flight or frames pending are activity enough,
// and a writer blocked on a full socket means the peer is not reading, which
// no heartbeat would change.
func (w *socketWriter) heartbeatIfIdle(now time.Time, idle time.Duration) {
	if now.UnixNano()-w.lastWrite.Load() < int64(idle) {
		return
	}
	if !w.mu.TryLock() {
		return
	}
	defer w.mu.Unlock()
	if w.writing || w.pending != nil || w.err != nil {
		return
	}
	if w.reserveLocked(frames.FrameOverhead) != nil {
		return
	}
	putFrameHeader(w.pending.b[w.n:], frames.FrameHeartbeat, 0, 0)
	w.pending.b[w.n+7] = frames.FrameEnd
	w.n += frames.FrameOverhead
	w.drainLocked()
}

// putFrameHeader writes a frame's 7-byte header (layout at
// frames.Reader.ReadFrame).
func putFrameHeader(b []byte, typ uint8, channel uint16, size int) {
	b[0] = typ
	binary.BigEndian.PutUint16(b[1:], channel)
	binary.BigEndian.PutUint32(b[3:], uint32(size))
}
