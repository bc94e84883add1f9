package controllink

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// stream encodes frames as a broker sends them, with the project's codec.
type stream struct {
	t   *testing.T
	buf bytes.Buffer
	w   *frames.Writer
}

func newStream(t *testing.T) *stream {
	s := &stream{t: t}
	s.w = frames.NewWriter(&s.buf, 4096)
	return s
}

func (s *stream) method(channel uint16, m frames.Method) *stream {
	s.t.Helper()
	if err := s.w.WriteMethod(channel, m); err != nil {
		s.t.Fatal(err)
	}
	return s
}

func (s *stream) frame(typ uint8, channel uint16, payload []byte) *stream {
	s.t.Helper()
	if err := s.w.WriteFrame(typ, channel, payload); err != nil {
		s.t.Fatal(err)
	}
	return s
}

func (s *stream) bytes() []byte {
	s.t.Helper()
	if err := s.w.Flush(); err != nil {
		s.t.Fatal(err)
	}
	return s.buf.Bytes()
}

var shutdownClose = &frames.ConnectionClose{
	ReplyCode: frames.ConnectionForced,
	ReplyText: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
}

func TestTapFindsTheBrokersConnectionClose(t *testing.T) {
	// A body that holds a connection.close frame byte for byte must not
	// be taken for one: the tap follows frames by their size.
	decoy := newStream(t).method(0, shutdownClose).bytes()
	tests := []struct {
		name   string
		stream []byte
		want   *frames.ConnectionClose
	}{
		{
			name: "a clean stop after a handshake, a delivery and a heartbeat",
			stream: newStream(t).
				method(0, &frames.ConnectionStart{VersionMinor: 9, Mechanisms: strings.Repeat("PLAIN ", 100), Locales: "en_US"}).
				method(1, &frames.BasicDeliver{ConsumerTag: "ctag", DeliveryTag: 1, RoutingKey: "q"}).
				frame(frames.FrameHeader, 1, mustHeader(t, len(decoy))).
				frame(frames.FrameBody, 1, decoy).
				frame(frames.FrameHeartbeat, 0, nil).
				method(0, shutdownClose).bytes(),
			want: shutdownClose,
		},
		{
			name:   "another reply code is reported as it came",
			stream: newStream(t).method(0, &frames.ConnectionClose{ReplyCode: frames.InternalError, ReplyText: "INTERNAL_ERROR"}).bytes(),
			want:   &frames.ConnectionClose{ReplyCode: frames.InternalError, ReplyText: "INTERNAL_ERROR"},
		},
		{
			name:   "a channel's close is not the connection's",
			stream: newStream(t).method(1, &frames.ChannelClose{ReplyCode: frames.NotFound, ReplyText: "NOT_FOUND"}).bytes(),
		},
		{
			name:   "a body that looks like a close is not one",
			stream: newStream(t).frame(frames.FrameBody, 1, decoy).bytes(),
		},
		{
			name:   "a close cut short is not one yet",
			stream: newStream(t).method(0, shutdownClose).bytes()[:20],
		},
		{
			name: "after a frame without its frame-end nothing is read",
			stream: append([]byte{frames.FrameHeartbeat, 0, 0, 0, 0, 0, 0, 0x00},
				newStream(t).method(0, shutdownClose).bytes()...),
		},
		{
			name:   "a protocol header (the broker refusing the version) is not a frame",
			stream: append(append([]byte{}, frames.ProtocolHeader...), newStream(t).method(0, shutdownClose).bytes()...),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Every way of cutting the stream in two reads alike: the
			// socket hands bytes over in arbitrary pieces.
			for cut := 0; cut <= len(tt.stream); cut++ {
				var tap Tap
				tap.process(tt.stream[:cut], nil)
				tap.process(tt.stream[cut:], nil)
				got := tap.brokerClose
				if fmt.Sprint(got) != fmt.Sprint(tt.want) {
					t.Fatalf("cut at %d: got %+v, want %+v", cut, got, tt.want)
				}
			}
		})
	}
}

func mustHeader(t *testing.T, size int) []byte {
	t.Helper()
	h := frames.ContentHeader{ClassID: 60, BodySize: uint64(size)}
	b, err := h.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// brokerSocket is the far end of a loopback TCP connection, standing for a
// broker's socket at the moment it stops: it writes what it is given and
// closes. Closing with bytes of ours unread makes its kernel send a reset
// (RFC 2525), which is what a RabbitMQ node that closed a connection while a
// probe was on its way does.
func brokerSocket(t *testing.T) (client net.Conn, closeWith func(last []byte)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, func(last []byte) {
		t.Helper()
		if _, err := client.Write([]byte("a probe the broker never reads")); err != nil {
			t.Fatal(err)
		}
		// The probe must be in the server's receive buffer before it
		// closes, or the close is a plain FIN.
		testutil.Eventually(t, time.Second, func() error {
			if n := unread(t, server); n == 0 {
				return errors.New("the probe has not arrived")
			}
			return nil
		})
		if _, err := server.Write(last); err != nil {
			t.Fatal(err)
		}
		server.Close()
	}
}

// unread says how many received bytes a socket holds, without reading them
// (MSG_PEEK): read, they would no longer make the close a reset.
func unread(t *testing.T, conn net.Conn) int {
	t.Helper()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	buf := make([]byte, 64)
	err = raw.Control(func(fd uintptr) {
		n, _, err = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	if err != nil && !errors.Is(err, syscall.EAGAIN) {
		t.Fatal(err)
	}
	return max(n, 0)
}

func TestObservedConnSeesTheCloseAReadWouldHaveLost(t *testing.T) {
	tests := []struct {
		name string
		last []byte // what the broker writes before it closes
		want *frames.ConnectionClose
	}{
		{name: "a clean stop: connection.close 320, then the reset", last: newStream(t).method(0, shutdownClose).bytes(), want: shutdownClose},
		{name: "a crash: the reset alone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, closeWith := brokerSocket(t)
			observed := observe(client)
			closeWith(tt.last)
			// The first write after the reset fails; amqp091-go would now
			// shut down without reading. Nothing has read the socket.
			var failedIn time.Duration
			testutil.Eventually(t, 2*time.Second, func() error {
				start := time.Now()
				_, err := observed.Write([]byte("another probe"))
				failedIn = time.Since(start)
				if err == nil {
					return errors.New("write after the broker closed still succeeds")
				}
				return nil
			})
			if got := observed.BrokerClose(); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("BrokerClose after the failed write = %+v, want %+v", got, tt.want)
			}
			if failedIn > readAheadWindow {
				t.Errorf("the failed write took %s, want under %s: a reset socket answers a read at once", failedIn, readAheadWindow)
			}
			// What was read ahead goes on to the reader, then the failure.
			got := make([]byte, 0, len(tt.last))
			buf := make([]byte, 7)
			var err error
			for err == nil {
				var n int
				n, err = observed.Read(buf)
				got = append(got, buf[:n]...)
			}
			if !bytes.Equal(got, tt.last) {
				t.Errorf("Read handed on %x, want %x", got, tt.last)
			}
		})
	}
}
