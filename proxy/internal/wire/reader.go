package wire

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/internal/rawsock"
)

// frameReader reads frames from one socket for its read loop. It parses them
// in place in a pooled buffer, which it holds only while unparsed bytes are
// in it (see buffers.go), and it tells its read loop when the socket has run
// dry, so that the loop sends what it produced before it waits for more.
//
// On a TCP connection the reader makes the read system calls itself (through
// syscall.RawConn, see internal/rawsock): it runs whenDry before a read when it has
// parsed everything it read, or when a read inside a frame finds the socket
// empty, and when a read finds the socket empty it gives its buffer back
// before it waits for the poller, so a connection that waits holds no
// buffer. Other connections (TLS) are read through net.Conn, with whenDry
// before each read.
//
// Not safe for concurrent use: one read loop owns it.
type frameReader struct {
	conn net.Conn
	raw  syscall.RawConn // nil when conn has no file descriptor of its own (TLS)
	max  uint32          // largest whole frame accepted (frames.MaxFrameSize)

	buf  *buffer // nil when empty
	r, w int     // unparsed bytes are buf.b[r:w]
	// size is the buffer size to take next: it rises a class when a read
	// fills the buffer and falls back when reads stay small (adapt).
	size       int
	smallReads int

	// whenDry runs when the socket has nothing more to read, before the
	// reader waits for the peer.
	whenDry func()
	// waitingSince is when the reader began waiting for the peer (unix
	// nanos), 0 while it is not waiting.
	waitingSince *atomic.Int64

	// Kept here so that the read callback allocates nothing per call.
	readFunc func(fd uintptr) bool
	readN    int
	readErr  error
	waiting  bool
	flushed  bool // whenDry ran before this read
}

func newFrameReader(conn net.Conn, waitingSince *atomic.Int64) *frameReader {
	r := &frameReader{conn: conn, max: frames.DefaultMaxFrameSize, size: minBufferSize, waitingSince: waitingSince}
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			r.raw = raw
			r.readFunc = r.readOnce
		}
	}
	return r
}

// SetMaxFrameSize sets the largest frame to accept, normally the negotiated
// frame_max (frames.Reader.SetMaxFrameSize has the rules).
func (r *frameReader) SetMaxFrameSize(n uint32) { r.max = frames.MaxFrameSize(n) }

// ReadFrame reads the next frame. Its payload aliases the reader's buffer and
// is valid until the next call. Errors are those of frames.Reader.ReadFrame:
// io.EOF for a close between frames, io.ErrUnexpectedEOF inside one,
// *frames.Error for a framing violation, other read errors as they came.
func (r *frameReader) ReadFrame() (frames.Frame, error) {
	const headerSize = frames.FrameOverhead - 1
	if r.buf != nil && r.r == r.w {
		r.release() // the previous frame was the last one in the buffer
	}
	if err := r.ensure(headerSize); err != nil {
		if errors.Is(err, io.EOF) && r.r == r.w {
			return frames.Frame{}, io.EOF
		}
		return frames.Frame{}, unexpectedEOF(err)
	}
	typ, channel, size, err := frames.ParseFrameHeader(r.buf.b[r.r:r.r+headerSize], r.max)
	if err != nil {
		return frames.Frame{}, err
	}
	whole := int(size) + frames.FrameOverhead
	if err := r.ensure(whole); err != nil {
		return frames.Frame{}, unexpectedEOF(err)
	}
	frame := r.buf.b[r.r : r.r+whole]
	// Consumed before it is judged, as frames.Reader does: after a bad type
	// or heartbeat the stream stays in step for the peer's close-ok.
	r.r += whole
	if err := frames.CheckFrameEnd(typ, channel, size, frame[whole-1]); err != nil {
		return frames.Frame{}, err
	}
	return frames.Frame{Type: typ, Channel: channel, Payload: frame[headerSize : whole-1]}, nil
}

// ReadProtocolHeader reads the 8-byte protocol header a client sends first,
// with frames.Reader's checks and errors. It reads no further than the header.
func (r *frameReader) ReadProtocolHeader() error {
	header := frames.NewReader(io.LimitReader(readerFunc(r.read), int64(len(frames.ProtocolHeader))), 16)
	return header.ReadProtocolHeader()
}

// read is io.Reader over the buffer: for ReadProtocolHeader, which runs
// before any frame.
func (r *frameReader) read(p []byte) (int, error) {
	if r.r == r.w {
		if err := r.fill(1); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.buf.b[r.r:r.w])
	r.r += n
	return n, nil
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// ensure reads until at least n unparsed bytes are buffered.
func (r *frameReader) ensure(n int) error {
	for r.w-r.r < n {
		if err := r.fill(n); err != nil {
			return err
		}
	}
	return nil
}

// fill makes room for n unparsed bytes and reads once.
func (r *frameReader) fill(n int) error {
	// Everything read so far is parsed and passed on: send it before the
	// next read rather than after a read found the socket empty. The write
	// takes long enough for more of the peer's frames to arrive, so the
	// read that follows finds them instead of an empty socket: fewer reads
	// and fewer wake-ups per frame.
	r.flushed = false
	if r.raw != nil && r.r == r.w && r.whenDry != nil {
		r.whenDry()
		r.flushed = true
	}
	switch {
	case r.buf == nil:
		r.buf, r.r, r.w = getBuffer(max(n, r.size)), 0, 0
	case len(r.buf.b)-r.r < n && n <= len(r.buf.b):
		// A frame begun at the end of the buffer: move it to the front.
		r.w = copy(r.buf.b, r.buf.b[r.r:r.w])
		r.r = 0
	case n > len(r.buf.b):
		// A frame larger than the buffer: move it to a larger one.
		larger := getBuffer(n)
		r.w = copy(larger.b, r.buf.b[r.r:r.w])
		r.r = 0
		putBuffer(r.buf)
		r.buf = larger
	}
	if r.raw == nil {
		return r.readConn()
	}
	r.readN, r.readErr, r.waiting = 0, nil, false
	err := r.raw.Read(r.readFunc)
	if r.waiting {
		r.waitingSince.Store(0)
	}
	if err != nil {
		// Deadline or closed socket: what net.Conn.Read would have said.
		return err
	}
	if r.readErr != nil {
		return &net.OpError{Op: "read", Net: "tcp", Source: r.conn.LocalAddr(), Addr: r.conn.RemoteAddr(), Err: os.NewSyscallError("read", r.readErr)}
	}
	if r.readN == 0 {
		return io.EOF
	}
	r.adapt(r.readN, len(r.buf.b)-r.w)
	r.w += r.readN
	return nil
}

// adapt moves the next buffer size a class up when a read of n bytes filled
// the room it had, and back to the smallest after shrinkAfter small reads in
// a row: a busy peer's bursts come between small reads, and a buffer too
// small for them costs a read system call per 4 KiB.
func (r *frameReader) adapt(n, room int) {
	switch {
	case n == room:
		r.smallReads = 0
		if r.size < readBufferSize {
			r.size = nextClass(r.size)
		}
	case n < minBufferSize/2:
		if r.smallReads++; r.smallReads >= shrinkAfter {
			r.size, r.smallReads = minBufferSize, 0
		}
	default:
		r.smallReads = 0
	}
}

// shrinkAfter is how many small reads in a row take a reader back to the
// smallest buffer.
const shrinkAfter = 64

// readOnce is the RawConn callback: one read system call, and on an empty
// socket the read loop's flush and the report that the reader is waiting.
// Returning false makes RawConn wait until the socket is readable and call
// it again.
func (r *frameReader) readOnce(fd uintptr) bool {
	for {
		if r.buf == nil {
			r.buf, r.r, r.w = getBuffer(r.size), 0, 0
		}
		n, err := rawsock.Read(fd, r.buf.b[r.w:])
		switch err {
		case nil:
			r.readN = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if !r.waiting {
				r.waiting = true
				if r.r == r.w {
					r.release() // nothing to keep while the peer is quiet
				}
				if !r.flushed && r.whenDry != nil {
					r.whenDry() // inside a frame: the rest did not come yet
				}
				r.waitingSince.Store(time.Now().UnixNano())
			}
			return false
		default:
			r.readErr = err
			return true
		}
	}
}

// readConn reads once through net.Conn, for connections without RawConn.
func (r *frameReader) readConn() error {
	if r.whenDry != nil {
		r.whenDry()
	}
	r.waitingSince.Store(time.Now().UnixNano())
	n, err := r.conn.Read(r.buf.b[r.w:])
	r.waitingSince.Store(0)
	if n > 0 {
		r.adapt(n, len(r.buf.b)-r.w)
		r.w += n
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// release gives the buffer back; the reader holds no unparsed bytes.
func (r *frameReader) release() {
	putBuffer(r.buf)
	r.buf, r.r, r.w = nil, 0, 0
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
