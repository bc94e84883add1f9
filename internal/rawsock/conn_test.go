package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// pair returns the two ends of a loopback TCP connection, the dialled end
// wrapped.
func pair(t *testing.T) (wrapped net.Conn, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	dialled, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	wrapped = Wrap(dialled)
	if _, ok := wrapped.(*Conn); !ok {
		t.Fatalf("Wrap(%T) = %T, want *Conn", dialled, wrapped)
	}
	t.Cleanup(func() { wrapped.Close(); peer.Close() })
	return wrapped, peer
}

func TestConn(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c, peer net.Conn)
	}{
		{"a large write arrives whole while the peer reads", func(t *testing.T, c, peer net.Conn) {
			sent := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: fills the socket
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(io.LimitReader(peer, int64(len(sent))))
				got <- b
			}()
			if n, err := c.Write(sent); n != len(sent) || err != nil {
				t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(sent))
			}
			if b := <-got; !bytes.Equal(b, sent) {
				t.Fatalf("the peer read %d bytes, not what was written", len(b))
			}
		}},
		{"a read waits for the peer's bytes", func(t *testing.T, c, peer net.Conn) {
			go func() {
				time.Sleep(20 * time.Millisecond)
				peer.Write([]byte("hello"))
			}()
			buf := make([]byte, 16)
			n, err := c.Read(buf)
			if err != nil || string(buf[:n]) != "hello" {
				t.Fatalf("Read = %q, %v; want hello, nil", buf[:n], err)
			}
		}},
		{"the peer's close reads as EOF", func(t *testing.T, c, peer net.Conn) {
			peer.Close()
			if n, err := c.Read(make([]byte, 16)); n != 0 || err != io.EOF {
				t.Fatalf("Read = %d, %v; want 0, EOF", n, err)
			}
		}},
		{"a read deadline ends a waiting read", func(t *testing.T, c, peer net.Conn) {
			c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			_, err := c.Read(make([]byte, 16))
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("Read past the deadline = %v, want a timeout", err)
			}
			if op, ok := err.(*net.OpError); !ok || op.Op != "read" {
				t.Errorf("Read past the deadline = %#v, want a read *net.OpError", err)
			}
		}},
		{"a deadline moved to now ends a read under way", func(t *testing.T, c, peer net.Conn) {
			done := make(chan error, 1)
			go func() {
				_, err := c.Read(make([]byte, 16))
				done <- err
			}()
			time.Sleep(20 * time.Millisecond)
			c.SetReadDeadline(time.Now())
			if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("Read = %v, want os.ErrDeadlineExceeded", err)
			}
		}},
		{"a read on a closed connection fails", func(t *testing.T, c, peer net.Conn) {
			c.Close()
			if _, err := c.Read(make([]byte, 16)); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Read after Close = %v, want net.ErrClosed", err)
			}
		}},
		{"a write to a reset connection fails", func(t *testing.T, c, peer net.Conn) {
			peer.(*net.TCPConn).SetLinger(0)
			peer.Close() // a reset
			var err error
			for i := 0; i < 100 && err == nil; i++ {
				_, err = c.Write(make([]byte, 1024))
				time.Sleep(time.Millisecond)
			}
			var op *net.OpError
			if !errors.As(err, &op) || op.Op != "write" {
				t.Fatalf("Write to a reset connection = %v, want a write *net.OpError", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, peer := pair(t)
			tc.run(t, c, peer)
		})
	}
}

// TestWrapLeavesOtherConns: a connection without a socket of its own comes
// back as it is.
func TestWrapLeavesOtherConns(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Fatalf("Wrap(net.Pipe end) = %T, want it unchanged", got)
	}
}

// TestConnAllocs: a read and a write of a wrapped connection allocate
// nothing.
func TestConnAllocs(t *testing.T) {
	c, peer := pair(t)
	buf := make([]byte, 64)
	msg := []byte("ping")
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("a write and a read through the wrapped connection and back allocated %.1f times, want 0", allocs)
	}
}
