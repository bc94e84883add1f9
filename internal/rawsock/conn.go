package rawsock

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// Conn is a net.Conn whose Read and Write are raw system calls (see the
// package comment); everything else, deadlines and Close among it, is the
// wrapped connection's. Reads and writes wait for the socket in the
// runtime's network poller, as net.Conn's do, and keep its deadlines.
// Wrap makes one.
type Conn struct {
	net.Conn
	raw syscall.RawConn

	// The state of the read and of the write under way, which the
	// callbacks handed to raw fill in: callbacks bound once, so that no
	// read or write allocates one.
	readMu  sync.Mutex
	readTo  []byte
	readN   int
	readErr error
	readFn  func(fd uintptr) bool

	writeMu  sync.Mutex
	writeOut []byte
	writeErr error
	writeFn  func(fd uintptr) bool
}

// Wrap returns conn with raw reads and writes when it is a socket of its
// own (TCP, Unix); any other connection, TLS's among them, is returned as
// it is. To keep a TLS connection's reads raw, wrap the TCP connection
// beneath it.
func Wrap(conn net.Conn) net.Conn {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return conn
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return conn
	}
	c := &Conn{Conn: conn, raw: raw}
	c.readFn, c.writeFn = c.readOnce, c.writeOnce
	return c
}

// Read reads what the socket holds, at most len(p) bytes, waiting until it
// holds something; io.EOF once the peer closed it.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.readTo, c.readN, c.readErr = p, 0, nil
	err := c.raw.Read(c.readFn)
	c.readTo = nil
	switch {
	case err != nil:
		return 0, named(err, "read") // a deadline or a closed socket
	case c.readErr != nil:
		return 0, c.opError("read", c.readErr)
	case c.readN == 0:
		return 0, io.EOF
	}
	return c.readN, nil
}

// readOnce is the RawConn callback: one read, or false on an empty socket,
// which makes RawConn wait until it is readable and call again.
func (c *Conn) readOnce(fd uintptr) bool {
	for {
		n, err := Read(fd, c.readTo)
		switch err {
		case nil:
			c.readN = n
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.readErr = err
			return true
		}
	}
}

// Write writes p whole, waiting while the socket is full.
func (c *Conn) Write(p []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.writeOut, c.writeErr = p, nil
	err := c.raw.Write(c.writeFn)
	n := len(p) - len(c.writeOut)
	c.writeOut = nil
	switch {
	case err != nil:
		return n, named(err, "write") // a deadline or a closed socket
	case c.writeErr != nil:
		return n, c.opError("write", c.writeErr)
	}
	return n, nil
}

// writeOnce is the RawConn callback: write until done, or false when the
// socket is full, which makes RawConn wait until it is writable and call
// again.
func (c *Conn) writeOnce(fd uintptr) bool {
	var err error
	c.writeOut, err = WriteUntilFull(fd, c.writeOut)
	if err == syscall.EAGAIN {
		return false
	}
	c.writeErr = err
	return true
}

// named gives err, a RawConn's error, the operation net.Conn's Read and
// Write name in theirs ("read", not "raw-read"), for the logs.
func named(err error, op string) error {
	if oe, ok := err.(*net.OpError); ok {
		oe.Op = op // a new error for each call
	}
	return err
}

// opError is err as net.Conn's methods return a failed system call.
func (c *Conn) opError(op string, err error) error {
	local := c.LocalAddr()
	return &net.OpError{Op: op, Net: local.Network(), Source: local, Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, err)}
}
