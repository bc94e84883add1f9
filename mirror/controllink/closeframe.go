package controllink

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// Why the watcher reads its own socket
//
// RabbitMQ stopped cleanly sends connection.close 320 CONNECTION_FORCED on
// every connection and closes the socket at once. Anything the client writes
// after that (the watcher's probe, a heartbeat, a trimmer's ack) meets a
// closed socket, and the broker's kernel answers with a reset. The 320 is
// then already in the client's receive buffer (Linux keeps received data
// readable after a reset), but amqp091-go learns of the end from whichever
// of its goroutines gets there first: when the write fails before its
// reader has read the 320, it shuts the connection down as a frame error and
// closes the socket, and the 320 is never read. A clean stop then looked
// like a crash, and failover applied ha-promote-on-failure instead of
// ha-promote-on-shutdown.
//
// So the watcher's connection is an observedConn: every byte amqp091-go
// reads passes a Tap that follows the frames and keeps the broker's
// connection.close, and a failed write first reads whatever the socket still
// holds (handing it on to amqp091-go's reader), so that by the time
// amqp091-go reports any end, the 320 has been seen if the broker sent it.
// A broker killed with -9 sends no connection.close, and a socket that has
// been reset or closed answers a read at once, so the kill costs no wait.

// readAheadWindow bounds the read after a failed write. The socket has been
// reset or closed by then, so the read returns at once; the bound is for a
// socket that failed some other way and would block.
const readAheadWindow = 20 * time.Millisecond

// observedConn is a broker connection whose incoming frames are watched for
// the broker's connection.close. It sits above TLS, where frames are clear.
type observedConn struct {
	net.Conn

	// mu serialises reads, so that the tap sees the stream in order,
	// and guards tap's reading state, ahead and aheadErr. A read holds it while it
	// blocks; readAhead moves the read deadline to now before it takes mu,
	// so that a read blocked on a socket that is still open gives way (one
	// on a failed socket has returned already).
	mu sync.Mutex
	// tap follows the frames read: it finds the broker's connection.close,
	// and takes the deliveries of trimmers' consumers out (tap.go). raw is
	// what the socket is read into.
	tap Tap
	raw []byte
	// ahead[aheadAt:] is read and scanned, not yet handed to Read;
	// readErr is the error of the read that brought it, handed to Read
	// after it; aheadErr is how reading ahead ended, handed to every Read
	// after ahead.
	ahead    []byte
	aheadAt  int
	readErr  error
	aheadErr error

	// readingAhead is set once a write failed; it tells Read that a
	// deadline error may be readAhead's, not the caller's.
	readingAhead atomic.Bool
	// closeFrame is the broker's connection.close, once seen.
	closeFrame atomic.Pointer[frames.ConnectionClose]
}

func observe(conn net.Conn) *observedConn { return &observedConn{Conn: conn} }

// BrokerClose returns the connection.close the broker sent, or nil.
func (c *observedConn) BrokerClose() *frames.ConnectionClose { return c.closeFrame.Load() }

// rawReadSize is the most one read of the socket takes.
const rawReadSize = 32 << 10

func (c *observedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.unread() == 0 && c.readErr == nil && c.aheadErr == nil {
		if c.raw == nil {
			c.raw = make([]byte, rawReadSize)
		}
		n, err := c.Conn.Read(c.raw)
		c.take(c.raw[:n])
		switch {
		case err == nil:
			// Everything read may have been taken by the tap: read on.
		case c.unread() > 0 || !c.readingAhead.Load():
			c.readErr = err
		default:
			// readAhead's deadline may have cut this read short: read
			// ahead here, so that amqp091-go's reader hears of no error
			// before the socket's last bytes are scanned.
			c.drain()
			if c.unread() == 0 && c.aheadErr == nil {
				return 0, err
			}
		}
	}
	if c.unread() > 0 {
		n := copy(p, c.ahead[c.aheadAt:])
		c.aheadAt += n
		if c.aheadAt == len(c.ahead) {
			c.ahead, c.aheadAt = c.ahead[:0], 0
		}
		return n, nil
	}
	if err := c.readErr; err != nil {
		c.readErr = nil
		return 0, err
	}
	return 0, c.aheadErr
}

// unread is how much was read and not yet handed to Read; c.mu is held.
func (c *observedConn) unread() int { return len(c.ahead) - c.aheadAt }

// heartbeatFrame is an AMQP heartbeat: type, channel 0, no payload, end.
var heartbeatFrame = []byte{frames.FrameHeartbeat, 0, 0, 0, 0, 0, 0, frames.FrameEnd}

// take passes bytes read from the broker through the tap, keeps what goes
// on to amqp091-go for Read, and the broker's connection.close once the
// tap has seen it; c.mu is held. When the
// tap took all of them, amqp091-go gets a heartbeat instead: it counts the
// broker silent, and closes the connection, when it reads no frame for
// three heartbeat intervals, and a connection that carries only a
// trimmer's deliveries would otherwise give it none. Nothing passing
// means amqp091-go's stream is between two frames (a frame passes from its
// header on), so the heartbeat cannot split one.
func (c *observedConn) take(b []byte) {
	from := len(c.ahead)
	c.ahead = c.tap.process(b, c.ahead)
	if len(b) > 0 && len(c.ahead) == from && c.tap.active.Load() > 0 {
		c.ahead = append(c.ahead, heartbeatFrame...)
	}
	if m := c.tap.brokerClose; m != nil && c.closeFrame.Load() == nil {
		c.closeFrame.Store(m)
	}
}

func (c *observedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	var ne net.Error
	if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
		// A write that timed out ran into a deadline of ours (a close),
		// not into a broker's end: nothing to wait for.
		c.readAhead()
	}
	return n, err
}

// readAhead reads what the socket still holds after a failed write, before
// the writer (and through it amqp091-go) learns of the failure.
func (c *observedConn) readAhead() {
	c.readingAhead.Store(true)
	c.Conn.SetReadDeadline(time.Now()) // see mu
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drain()
}

// drain reads the socket until it fails, the broker's connection.close has
// been seen, or readAheadWindow has passed, keeping what it read for Read;
// c.mu is held.
func (c *observedConn) drain() {
	if c.aheadErr != nil { // drained already
		return
	}
	end := time.Now().Add(readAheadWindow)
	buf := make([]byte, 4096)
	for c.BrokerClose() == nil {
		// Set on every turn: amqp091-go's heartbeater moves the deadline
		// after every frame its reader handles.
		c.Conn.SetReadDeadline(end)
		n, err := c.Conn.Read(buf)
		c.take(buf[:n])
		if err != nil {
			c.aheadErr = err
			return
		}
	}
}

// maxClosePayload is the largest connection.close method payload: class and
// method ids, reply code, reply text (a shortstr), failing class and method.
const maxClosePayload = 2 + 2 + 2 + 1 + 255 + 2 + 2

// decodeClose returns the method payload's connection.close, or nil if it is
// another method.
func decodeClose(payload []byte) *frames.ConnectionClose {
	var m frames.ConnectionClose
	wantClass, wantMethod := m.ID()
	classID, methodID, args, err := frames.ParseMethodID(payload)
	if err != nil || classID != wantClass || methodID != wantMethod || m.Decode(args) != nil {
		return nil
	}
	return &m
}
