package wire

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// connKinds are the two ways frameReader reads: its own system calls on a TCP
// socket, and net.Conn.Read on anything else (TLS; here net.Pipe).
var connKinds = []struct {
	name string
	pair func(testing.TB) (client, server net.Conn)
}{
	{"tcp", tcpPair},
	{"pipe", func(t testing.TB) (net.Conn, net.Conn) {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return a, b
	}},
}

// readAll reads frames until an error and returns them (payloads copied) with
// the error's text.
func readAll(read func() (frames.Frame, error)) ([]frames.Frame, string) {
	var got []frames.Frame
	for {
		f, err := read()
		if err != nil {
			return got, err.Error()
		}
		f.Payload = bytes.Clone(f.Payload)
		got = append(got, f)
	}
}

// TestFrameReaderMatchesFramesReader: for the same bytes, sent in chunks of
// random sizes, frameReader returns what frames.Reader returns, frames and
// errors alike.
func TestFrameReaderMatchesFramesReader(t *testing.T) {
	large := bytes.Repeat([]byte{0xab}, 200<<10) // larger than the read buffer
	var valid []byte
	for i := range 50 {
		valid = append(valid, frameBytes(frames.FrameBody, uint16(i), bytes.Repeat([]byte{byte(i)}, i*97))...)
	}
	valid = append(valid, frameBytes(frames.FrameBody, 3, large)...)
	valid = append(valid, frameBytes(frames.FrameHeartbeat, 0, nil)...)
	badEnd := frameBytes(frames.FrameBody, 1, []byte("x"))
	badEnd[len(badEnd)-1] = 0
	tests := []struct {
		name  string
		bytes []byte
	}{
		{"frames then a clean close", valid},
		{"close inside a header", append(bytes.Clone(valid), 1, 0)},
		{"close inside a payload", append(bytes.Clone(valid), frameBytes(frames.FrameBody, 1, large)[:1000]...)},
		{"frame larger than frame_max", frameBytes(frames.FrameBody, 1, make([]byte, 2<<20))},
		{"bad frame-end", append(frameBytes(frames.FrameMethod, 0, []byte("ok")), badEnd...)},
		{"unknown type, then a frame", append(frameBytes(9, 1, []byte("?")), frameBytes(frames.FrameBody, 1, []byte("next"))...)},
		{"heartbeat on a channel", frameBytes(frames.FrameHeartbeat, 5, nil)},
		{"heartbeat with a payload", frameBytes(frames.FrameHeartbeat, 0, []byte("x"))},
	}
	for _, kind := range connKinds {
		for _, tt := range tests {
			t.Run(kind.name+"/"+tt.name, func(t *testing.T) {
				want := frames.NewReader(bytes.NewReader(tt.bytes), 4096)
				want.SetMaxFrameSize(1 << 20)
				wantFrames, wantErr := readAll(want.ReadFrame)

				client, server := kind.pair(t)
				var waiting atomic.Int64
				r := newFrameReader(server, &waiting)
				r.SetMaxFrameSize(1 << 20)
				go sendInChunks(client, tt.bytes)
				gotFrames, gotErr := readAll(r.ReadFrame)

				if len(gotFrames) != len(wantFrames) {
					t.Fatalf("got %d frames, want %d", len(gotFrames), len(wantFrames))
				}
				for i := range gotFrames {
					g, w := gotFrames[i], wantFrames[i]
					if g.Type != w.Type || g.Channel != w.Channel || !bytes.Equal(g.Payload, w.Payload) {
						t.Fatalf("frame %d: got type %d channel %d %d bytes, want type %d channel %d %d bytes",
							i, g.Type, g.Channel, len(g.Payload), w.Type, w.Channel, len(w.Payload))
					}
				}
				if gotErr != wantErr {
					t.Errorf("got error %q, want %q", gotErr, wantErr)
				}
			})
		}
	}
}

// sendInChunks writes b in pieces of random sizes, then closes the writer.
func sendInChunks(conn net.Conn, b []byte) {
	defer conn.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for len(b) > 0 {
		n := min(len(b), 1+rng.IntN(20000))
		if _, err := conn.Write(b[:n]); err != nil {
			return
		}
		b = b[n:]
	}
}

// TestFrameReaderIdle: the reader runs whenDry before it reads again after
// parsing everything it had, holding no buffer then, and reports while it
// waits for the peer.
func TestFrameReaderIdle(t *testing.T) {
	client, server := tcpPair(t)
	var waiting atomic.Int64
	r := newFrameReader(server, &waiting)
	// Whether the reader holds a buffer is looked at from its own goroutine:
	// the socket is no synchronisation the race detector sees.
	dry := make(chan bool, 10)
	r.whenDry = func() { dry <- r.buf == nil }

	burst := bytes.Repeat(frameBytes(frames.FrameBody, 1, make([]byte, 100)), 3)
	if _, err := client.Write(burst); err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		for range 4 {
			if _, err := r.ReadFrame(); err != nil {
				read <- err
				return
			}
		}
		read <- nil
	}()
	// Once before the first read, once after the burst was parsed; then
	// the fourth ReadFrame waits.
	for i := range 2 {
		select {
		case released := <-dry:
			if !released {
				t.Errorf("whenDry %d: the reader holds a buffer with nothing in it, want none", i+1)
			}
		case err := <-read:
			t.Fatalf("ReadFrame returned %v before the reader waited", err)
		case <-time.After(5 * time.Second):
			t.Fatalf("whenDry ran %d times, want 2", i)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for waiting.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if waiting.Load() == 0 {
		t.Error("the reader does not report that it waits for the peer")
	}
	if _, err := client.Write(frameBytes(frames.FrameBody, 1, nil)); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatalf("fourth frame: %v", err)
	}
	if got := len(dry); got != 0 {
		t.Errorf("whenDry ran %d more times, want 2 in all", got)
	}
	if got := waiting.Load(); got != 0 {
		t.Errorf("waitingSince = %d after data arrived, want 0", got)
	}
}

// TestFrameReaderProtocolHeader: the header is judged as frames.Reader judges
// it, and nothing after it is consumed.
func TestFrameReaderProtocolHeader(t *testing.T) {
	next := frameBytes(frames.FrameMethod, 0, []byte("after"))
	tests := []struct {
		name    string
		bytes   []byte
		wantErr error
	}{
		{"0-9-1, then a frame", append(bytes.Clone(frames.ProtocolHeader), next...), nil},
		{"wrong header", []byte("HTTP/1.1 GET /\r\n"), frames.ErrBadProtocolHeader},
		{"cut short", []byte("AMQ"), frames.ErrBadProtocolHeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := tcpPair(t)
			var waiting atomic.Int64
			r := newFrameReader(server, &waiting)
			go sendInChunks(client, tt.bytes)
			err := r.ReadProtocolHeader()
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ReadProtocolHeader = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			f, err := r.ReadFrame()
			if err != nil || !bytes.Equal(f.Payload, []byte("after")) {
				t.Errorf("frame after the header: %q, %v; want %q", f.Payload, err, "after")
			}
		})
	}
}

// TestFrameReaderDeadline: a read deadline ends a waiting ReadFrame with a
// timeout, as net.Conn.Read would.
func TestFrameReaderDeadline(t *testing.T) {
	for _, kind := range connKinds {
		t.Run(kind.name, func(t *testing.T) {
			_, server := kind.pair(t)
			var waiting atomic.Int64
			r := newFrameReader(server, &waiting)
			server.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			_, err := r.ReadFrame()
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("ReadFrame after the deadline = %v, want a timeout", err)
			}
		})
	}
}

// BenchmarkFrameReader is the cost of reading basic.publish, its content
// header and a 1 KiB body from a loopback socket, bursts of 64 messages at a
// time.
func BenchmarkFrameReader(b *testing.B) {
	client, server := tcpPair(b)
	var waiting atomic.Int64
	r := newFrameReader(server, &waiting)
	var message []byte
	message = append(message, methodBytes(1, &frames.BasicPublish{RoutingKey: "bench"})...)
	message = append(message, frameBytes(frames.FrameHeader, 1, make([]byte, 14))...)
	message = append(message, frameBytes(frames.FrameBody, 1, make([]byte, 1024))...)
	const burst = 64
	burstBytes := bytes.Repeat(message, burst)
	errs := make(chan error, 1)
	b.ReportAllocs()
	b.SetBytes(int64(len(message)))
	b.ResetTimer()
	go func() {
		for i := 0; i < b.N; i += burst {
			if _, err := client.Write(burstBytes); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	for i := 0; i < (b.N+burst-1)/burst*burst*3; i++ {
		if _, err := r.ReadFrame(); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSocketWriter is the cost of queueing a delivery (basic.deliver,
// content header, 1 KiB body) and flushing every 64 messages to a socket that
// discards what it gets.
func BenchmarkSocketWriter(b *testing.B) {
	client, server := tcpPair(b)
	go io.Copy(io.Discard, server)
	w := newSocketWriter(client)
	deliver := &frames.BasicDeliver{ConsumerTag: "ctag", DeliveryTag: 1, RoutingKey: "bench"}
	header := make([]byte, 14)
	body := make([]byte, 1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(body) + len(header) + 3*frames.FrameOverhead + 30))
	b.ResetTimer()
	for i := range b.N {
		deliver.DeliveryTag = uint64(i + 1)
		if err := w.writeMethod(1, deliver); err != nil {
			b.Fatal(err)
		}
		w.writeFrame(frames.FrameHeader, 1, header)
		w.writeFrame(frames.FrameBody, 1, body)
		if i%64 == 63 {
			if err := w.flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := w.flush(); err != nil {
		b.Fatal(err)
	}
}
