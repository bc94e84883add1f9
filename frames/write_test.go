package frames

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"
)

// countingWriter records how the bytes reach the socket.
type countingWriter struct {
	bytes.Buffer
	writes []int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, len(p))
	return w.Buffer.Write(p)
}

func TestWriterRoundTrip(t *testing.T) {
	var out countingWriter
	w := NewWriter(&out, 4096)
	header := allProperties()
	publish := &BasicPublish{Exchange: "x", RoutingKey: "rk", Mandatory: true}
	body := bytes.Repeat([]byte("b"), 10000)
	steps := []func() error{
		w.WriteProtocolHeader,
		func() error { return w.WriteMethod(1, publish) },
		func() error { return w.WriteContentHeader(1, &header) },
		func() error { return w.WriteFrame(FrameBody, 1, body) },
		w.WriteHeartbeat,
		w.Flush,
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if w.Buffered() != 0 {
		t.Errorf("Buffered after Flush = %d", w.Buffered())
	}
	// The 10000-byte body is larger than the 4096-byte buffer: bufio tops
	// the buffer up, flushes it, and hands the rest of the body to the
	// socket directly; no byte is copied twice.
	if !slices.ContainsFunc(out.writes, func(n int) bool { return n > 4096 }) {
		t.Errorf("writes %v: no part of the body bypassed the buffer", out.writes)
	}

	r := NewReader(&out.Buffer, 4096)
	if err := r.ReadProtocolHeader(); err != nil {
		t.Fatal(err)
	}
	f := mustRead(t, r, FrameMethod)
	if m, err := DecodeMethod(f.Payload); err != nil || !reflect.DeepEqual(m, publish) {
		t.Errorf("method %+v (%v), want %+v", m, err, publish)
	}
	var gotHeader ContentHeader
	if err := gotHeader.Decode(mustRead(t, r, FrameHeader).Payload); err != nil || !reflect.DeepEqual(gotHeader, header) {
		t.Errorf("header %+v (%v), want %+v", gotHeader, err, header)
	}
	if f := mustRead(t, r, FrameBody); !bytes.Equal(f.Payload, body) {
		t.Errorf("body of %d bytes differs", len(f.Payload))
	}
	mustRead(t, r, FrameHeartbeat)
}

func mustRead(t *testing.T, r *Reader, typ uint8) Frame {
	t.Helper()
	f, err := r.ReadFrame()
	if err != nil {
		t.Fatalf("ReadFrame: %v", err)
	}
	if f.Type != typ {
		t.Fatalf("frame type %d, want %d", f.Type, typ)
	}
	return f
}

func TestWriteMethodRefusesUnencodable(t *testing.T) {
	tests := []struct {
		name   string
		method Method
	}{
		{name: "long shortstr", method: &QueueDeclare{Queue: string(make([]byte, 300))}},
		{name: "bad table value", method: &QueueDeclare{Arguments: Table{{Key: "x", Value: struct{}{}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			w := NewWriter(&out, 64)
			if err := w.WriteMethod(1, tt.method); !errors.Is(err, ErrUnencodable) {
				t.Errorf("error %v, want ErrUnencodable", err)
			}
			if w.Buffered() != 0 {
				t.Errorf("%d bytes written for a refused method", w.Buffered())
			}
		})
	}
}

func TestWriteMethodDoesNotAllocate(t *testing.T) {
	w := NewWriter(discard{}, 4096)
	ack := &BasicAck{DeliveryTag: 42, Multiple: true}
	deliver := &BasicDeliver{ConsumerTag: "ctag", DeliveryTag: 7, Exchange: "x", RoutingKey: "rk"}
	allocs := testing.AllocsPerRun(100, func() {
		_ = w.WriteMethod(1, ack)
		_ = w.WriteMethod(1, deliver)
		_ = w.Flush()
	})
	if allocs != 0 {
		t.Errorf("WriteMethod: %v allocs, want 0", allocs)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
