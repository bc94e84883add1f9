package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// recordingConn is a net.Conn whose writes are recorded one by one. While gate
// is set, each write waits for a token on it, so a test can hold a write in
// flight; fail makes every write fail.
type recordingConn struct {
	net.Conn // nil: only Write is used by socketWriter

	gate   chan struct{}
	fail   error
	inside atomic.Int32 // writes waiting at the gate

	mu     sync.Mutex
	writes [][]byte
}

func (c *recordingConn) Write(p []byte) (int, error) {
	if c.gate != nil {
		c.inside.Add(1)
		<-c.gate
		c.inside.Add(-1)
	}
	if c.fail != nil {
		return 0, c.fail
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *recordingConn) recorded() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// waitInWrite waits until n writes are held at the gate.
func (c *recordingConn) waitInWrite(t *testing.T, n int32) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, func() error {
		if got := c.inside.Load(); got != n {
			return fmt.Errorf("%d writes in flight, want %d", got, n)
		}
		return nil
	})
}

// frameBytes is one frame as it goes on the wire.
func frameBytes(typ uint8, channel uint16, payload []byte) []byte {
	var b bytes.Buffer
	w := frames.NewWriter(&b, 16)
	w.WriteFrame(typ, channel, payload)
	w.Flush()
	return b.Bytes()
}

// TestSocketWriterCoalescesFlushes: frames flushed while a write is in flight
// return at once and leave together in the next write, from whichever producer
// queued them.
func TestSocketWriterCoalescesFlushes(t *testing.T) {
	conn := &recordingConn{gate: make(chan struct{})}
	w := newSocketWriter(conn)

	first := frameBytes(frames.FrameBody, 1, []byte("first"))
	firstDone := make(chan error, 1)
	go func() {
		if err := w.writeFrame(frames.FrameBody, 1, []byte("first")); err != nil {
			firstDone <- err
			return
		}
		firstDone <- w.flush()
	}()
	conn.waitInWrite(t, 1)

	// Three producers while the first write is held: none of them waits.
	var want []byte
	for i := range 3 {
		payload := []byte(fmt.Sprintf("producer %d", i))
		want = append(want, frameBytes(frames.FrameBody, uint16(i+2), payload)...)
		if err := w.writeFrame(frames.FrameBody, uint16(i+2), payload); err != nil {
			t.Fatalf("writeFrame during a write in flight: %v", err)
		}
		if err := w.flush(); err != nil {
			t.Fatalf("flush during a write in flight: %v", err)
		}
	}
	close(conn.gate)
	if err := <-firstDone; err != nil {
		t.Fatalf("first producer: %v", err)
	}

	got := conn.recorded()
	if len(got) != 2 {
		t.Fatalf("got %d writes, want 2 (the first frame, then the three queued during it together)", len(got))
	}
	if !bytes.Equal(got[0], first) {
		t.Errorf("write 1 = %q, want %q", got[0], first)
	}
	if !bytes.Equal(got[1], want) {
		t.Errorf("write 2 = %q, want %q", got[1], want)
	}
}

// TestSocketWriterBoundsPendingBytes: while the socket does not take a write,
// a producer queues at most writeBufferSize bytes and then waits; when the
// socket takes the write, it continues.
func TestSocketWriterBoundsPendingBytes(t *testing.T) {
	conn := &recordingConn{gate: make(chan struct{})}
	w := newSocketWriter(conn)
	payload := make([]byte, 1000)
	frameSize := len(payload) + frames.FrameOverhead

	// The holder's write is in flight and stays there.
	holderDone := make(chan error, 1)
	go func() {
		w.writeFrame(frames.FrameBody, 1, payload)
		holderDone <- w.flush()
	}()
	conn.waitInWrite(t, 1)

	var queued atomic.Int64
	const total = 200
	producerDone := make(chan error, 1)
	go func() {
		for range total {
			if err := w.writeFrame(frames.FrameBody, 1, payload); err != nil {
				producerDone <- err
				return
			}
			queued.Add(1)
		}
		producerDone <- nil
	}()
	bound := int64(writeBufferSize / frameSize)
	testutil.Eventually(t, 5*time.Second, func() error {
		if got := queued.Load(); got != bound {
			return fmt.Errorf("%d frames queued, want the producer stopped at %d", got, bound)
		}
		return nil
	})
	// Stopped, not slow: it is still there after a while.
	time.Sleep(50 * time.Millisecond)
	if got := queued.Load(); got != bound {
		t.Fatalf("%d frames queued while the socket took nothing, want at most %d (%d bytes)", got, bound, writeBufferSize)
	}

	close(conn.gate)
	if err := <-producerDone; err != nil {
		t.Fatalf("producer: %v", err)
	}
	if err := <-holderDone; err != nil {
		t.Fatalf("holder: %v", err)
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	var written int
	for _, b := range conn.recorded() {
		written += len(b)
	}
	if want := (total + 1) * frameSize; written != want {
		t.Errorf("%d bytes written, want %d", written, want)
	}
}

// TestSocketWriterGrowsBeforeWriting: without a flush, frames are written only
// once writeBufferSize bytes are pending, though the writer started with a
// small buffer.
func TestSocketWriterGrowsBeforeWriting(t *testing.T) {
	conn := &recordingConn{}
	w := newSocketWriter(conn)
	payload := make([]byte, 1000)
	fit := writeBufferSize / (len(payload) + frames.FrameOverhead)
	for i := range fit {
		if err := w.writeFrame(frames.FrameBody, 1, payload); err != nil {
			t.Fatal(err)
		}
		if n := len(conn.recorded()); n != 0 {
			t.Fatalf("%d writes after %d frames (%d bytes), want none below %d bytes",
				n, i+1, (i+1)*(len(payload)+frames.FrameOverhead), writeBufferSize)
		}
	}
	if err := w.writeFrame(frames.FrameBody, 1, payload); err != nil {
		t.Fatal(err)
	}
	got := conn.recorded()
	if len(got) != 1 || len(got[0]) != fit*(len(payload)+frames.FrameOverhead) {
		t.Fatalf("after the frame that did not fit: %d writes, want 1 of the %d frames before it", len(got), fit)
	}
}

// TestSocketWriterErrorSticks: the first write error is returned to the
// writer, to producers waiting for room, and to every later call.
func TestSocketWriterErrorSticks(t *testing.T) {
	broken := errors.New("connection reset")
	conn := &recordingConn{gate: make(chan struct{}), fail: broken}
	w := newSocketWriter(conn)
	payload := make([]byte, 1000)

	writerDone := make(chan error, 1)
	go func() {
		w.writeFrame(frames.FrameBody, 1, payload)
		writerDone <- w.flush()
	}()
	conn.waitInWrite(t, 1)
	// A producer that fills the buffer waits for room.
	waiterDone := make(chan error, 1)
	go func() {
		for {
			if err := w.writeFrame(frames.FrameBody, 1, payload); err != nil {
				waiterDone <- err
				return
			}
		}
	}()
	testutil.Eventually(t, 5*time.Second, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.waiters != 1 {
			return fmt.Errorf("%d producers waiting for room, want 1", w.waiters)
		}
		return nil
	})
	close(conn.gate)

	for name, done := range map[string]chan error{"writer": writerDone, "waiting producer": waiterDone} {
		if err := <-done; !errors.Is(err, broken) {
			t.Errorf("%s got %v, want %v", name, err, broken)
		}
	}
	calls := []struct {
		name string
		call func() error
	}{
		{"writeFrame", func() error { return w.writeFrame(frames.FrameBody, 1, []byte("x")) }},
		{"writeFrame large", func() error { return w.writeFrame(frames.FrameBody, 1, make([]byte, largeFrame)) }},
		{"writeMethod", func() error { return w.writeMethod(1, &frames.BasicAck{DeliveryTag: 1}) }},
		{"flush", w.flush},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, broken) {
			t.Errorf("%s after the failure = %v, want %v", c.name, err, broken)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending != nil {
		t.Errorf("a broken writer still holds a %d-byte buffer", len(w.pending.b))
	}
}

// TestSocketWriterFrames: what producers write arrives byte for byte and in
// order, small frames, methods and large frames (written from the
// producer's memory) alike, and an idle writer holds no buffer.
func TestSocketWriterFrames(t *testing.T) {
	client, server := tcpPair(t)
	w := newSocketWriter(client)
	large := bytes.Repeat([]byte("0123456789abcdef"), 3*largeFrame/16+1)
	// A method larger than writeMethod's reservation, after frames that
	// leave the buffer nearly full.
	bigConsume := &frames.BasicConsume{Queue: "q", Arguments: frames.Table{{Key: "x-big", Value: string(bytes.Repeat([]byte("a"), 3000))}}}
	nearlyFull := make([]byte, minBufferSize-700)
	steps := []struct {
		name string
		do   func() error
		want []byte
	}{
		{"protocol header", w.writeProtocolHeader, frames.ProtocolHeader},
		{"method", func() error { return w.writeMethod(1, &frames.BasicAck{DeliveryTag: 7, Multiple: true}) },
			methodBytes(1, &frames.BasicAck{DeliveryTag: 7, Multiple: true})},
		{"small body", func() error { return w.writeFrame(frames.FrameBody, 1, []byte("small")) },
			frameBytes(frames.FrameBody, 1, []byte("small"))},
		{"large body after pending frames", func() error { return w.writeFrame(frames.FrameBody, 2, large) },
			frameBytes(frames.FrameBody, 2, large)},
		{"frame filling most of the buffer", func() error { return w.writeFrame(frames.FrameBody, 1, nearlyFull) },
			frameBytes(frames.FrameBody, 1, nearlyFull)},
		{"method larger than the reservation", func() error { return w.writeMethod(1, bigConsume) },
			methodBytes(1, bigConsume)},
		{"heartbeat-sized frame", func() error { return w.writeFrame(frames.FrameHeartbeat, 0, nil) },
			frameBytes(frames.FrameHeartbeat, 0, nil)},
	}
	var want []byte
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		want = append(want, s.want...)
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(server, got); err != nil {
		t.Fatalf("reading what was written: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the peer got %d bytes that differ from the %d written", len(got), len(want))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending != nil || w.writing {
		t.Errorf("after the last flush: pending buffer %v, writing %v; want none and false", w.pending != nil, w.writing)
	}
}

// TestSocketWriterHeartbeatIfIdle: a heartbeat goes out only after the
// socket was quiet for the interval, and never while frames are pending.
func TestSocketWriterHeartbeatIfIdle(t *testing.T) {
	conn := &recordingConn{}
	w := newSocketWriter(conn)
	now := time.Now()
	w.heartbeatIfIdle(now, time.Minute)
	if n := len(conn.recorded()); n != 0 {
		t.Fatalf("%d writes on a socket written just now, want 0", n)
	}
	w.writeFrame(frames.FrameBody, 1, []byte("pending"))
	w.heartbeatIfIdle(now.Add(2*time.Minute), time.Minute)
	if n := len(conn.recorded()); n != 0 {
		t.Fatalf("%d writes with a frame pending, want 0: pending frames are activity", n)
	}
	w.flush()
	w.heartbeatIfIdle(time.Now().Add(2*time.Minute), time.Minute)
	got := conn.recorded()
	if len(got) != 2 || !bytes.Equal(got[1], frameBytes(frames.FrameHeartbeat, 0, nil)) {
		t.Errorf("writes %q, want the pending frame and then a heartbeat", got)
	}
}

func methodBytes(channel uint16, m frames.Method) []byte {
	var b bytes.Buffer
	w := frames.NewWriter(&b, 16)
	w.WriteMethod(channel, m)
	w.Flush()
	return b.Bytes()
}

// tcpPair is a connected pair of loopback TCP sockets, closed at cleanup.
func tcpPair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}
