package frames

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"runtime"
	"testing"
)

// rawFrame builds a frame by hand so that tests can break any part of it.
func rawFrame(typ uint8, channel uint16, size uint32, payload []byte, end byte) []byte {
	b := []byte{typ}
	b = binary.BigEndian.AppendUint16(b, channel)
	b = binary.BigEndian.AppendUint32(b, size)
	b = append(b, payload...)
	return append(b, end)
}

func TestReadFrame(t *testing.T) {
	tests := []struct {
		name      string
		input     []byte
		max       uint32
		want      Frame
		wantErr   error // errors.Is target
		wantCode  uint16
		wantPlain bool // the error must be exactly wantErr, not wrapped
	}{
		{name: "method frame", input: rawFrame(1, 7, 3, []byte{1, 2, 3}, FrameEnd), want: Frame{Type: 1, Channel: 7, Payload: []byte{1, 2, 3}}},
		{name: "heartbeat", input: rawFrame(8, 0, 0, nil, FrameEnd), want: Frame{Type: 8, Payload: []byte{}}},
		{name: "clean EOF", input: nil, wantErr: io.EOF, wantPlain: true},
		{name: "EOF in header", input: []byte{1, 0}, wantErr: io.ErrUnexpectedEOF, wantPlain: true},
		{name: "EOF in payload", input: rawFrame(1, 1, 10, []byte{1, 2}, FrameEnd), wantErr: io.ErrUnexpectedEOF, wantPlain: true},
		{name: "EOF before frame-end", input: rawFrame(3, 1, 2, []byte{1, 2}, FrameEnd)[:9], wantErr: io.ErrUnexpectedEOF, wantPlain: true},
		{name: "wrong frame-end", input: rawFrame(3, 1, 2, []byte{1, 2}, 0xCD), wantErr: ErrBadFrameEnd, wantCode: FrameError},
		{name: "unknown type", input: rawFrame(4, 1, 0, nil, FrameEnd), wantErr: ErrUnknownFrameType, wantCode: FrameError},
		{name: "too large", input: rawFrame(3, 1, DefaultMaxFrameSize-7, nil, FrameEnd), wantErr: ErrFrameTooLarge, wantCode: FrameError},
		{name: "4 GiB", input: rawFrame(3, 1, math.MaxUint32, nil, FrameEnd), wantErr: ErrFrameTooLarge, wantCode: FrameError},
		{name: "largest allowed", input: rawFrame(3, 1, 4096-8, make([]byte, 4088), FrameEnd), max: 4096, want: Frame{Type: 3, Channel: 1, Payload: make([]byte, 4088)}},
		{name: "one over negotiated max", input: rawFrame(3, 1, 4096-7, nil, FrameEnd), max: 4096, wantErr: ErrFrameTooLarge, wantCode: FrameError},
		{name: "heartbeat on a channel", input: rawFrame(8, 1, 0, nil, FrameEnd), wantErr: ErrBadHeartbeat, wantCode: UnexpectedFrame},
		{name: "heartbeat with payload", input: rawFrame(8, 0, 1, []byte{0}, FrameEnd), wantErr: ErrBadHeartbeat, wantCode: FrameError},
		// RabbitMQ's order: the size first, then the frame-end, then the rest.
		{name: "heartbeat on a channel with a bad frame-end", input: rawFrame(8, 1, 0, nil, 0), wantErr: ErrBadFrameEnd, wantCode: FrameError},
		{name: "unknown type with a bad frame-end", input: rawFrame(9, 1, 2, []byte{1, 2}, 0), wantErr: ErrBadFrameEnd, wantCode: FrameError},
		{name: "unknown type over max", input: rawFrame(9, 1, 4096, nil, FrameEnd), max: 4096, wantErr: ErrFrameTooLarge, wantCode: FrameError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(tt.input), 16)
			if tt.max != 0 {
				r.SetMaxFrameSize(tt.max)
			}
			got, err := r.ReadFrame()
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("ReadFrame: %v", err)
				}
				if got.Type != tt.want.Type || got.Channel != tt.want.Channel || !bytes.Equal(got.Payload, tt.want.Payload) {
					t.Errorf("got %+v, want %+v", got, tt.want)
				}
				if _, err := r.ReadFrame(); err != io.EOF {
					t.Errorf("after the last frame: %v, want io.EOF", err)
				}
				return
			}
			if tt.wantPlain && err != tt.wantErr {
				t.Fatalf("error %#v, want exactly %v", err, tt.wantErr)
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if tt.wantCode != 0 {
				var e *Error
				if !errors.As(err, &e) || e.Code != tt.wantCode || !e.Hard() {
					t.Errorf("error %#v, want a hard *Error with code %d", err, tt.wantCode)
				}
			}
		})
	}
}

// TestReadFrameStaysInStep: a frame refused for its type or shape is read
// through its frame-end octet before the error, as RabbitMQ reads it, so the
// next ReadFrame returns the peer's next frame (the close-ok a client sends
// after the error's connection.close), not the rest of the refused one.
func TestReadFrameStaysInStep(t *testing.T) {
	closeOk := rawFrame(FrameMethod, 0, 4, []byte{0, 10, 0, 51}, FrameEnd)
	tests := []struct {
		name    string
		refused []byte
		wantErr error
	}{
		{"heartbeat on channel 5", rawFrame(FrameHeartbeat, 5, 0, nil, FrameEnd), ErrBadHeartbeat},
		{"heartbeat with a payload", rawFrame(FrameHeartbeat, 0, 3, []byte{1, 2, 3}, FrameEnd), ErrBadHeartbeat},
		{"unknown frame type", rawFrame(9, 1, 5, []byte{1, 2, 3, 4, 5}, FrameEnd), ErrUnknownFrameType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(append(tt.refused, closeOk...)), 4096)
			if _, err := r.ReadFrame(); !errors.Is(err, tt.wantErr) {
				t.Fatalf("first ReadFrame: error %v, want %v", err, tt.wantErr)
			}
			got, err := r.ReadFrame()
			if err != nil {
				t.Fatalf("ReadFrame after the refused frame: %v, want the close-ok", err)
			}
			if got.Type != FrameMethod || got.Channel != 0 || !bytes.Equal(got.Payload, closeOk[7:11]) {
				t.Errorf("ReadFrame after the refused frame: %+v, want connection.close-ok on channel 0", got)
			}
		})
	}
}

// TestReadFrameOversizedDoesNotAllocate: a header claiming 4 GiB is refused
// from its 7 bytes, before any buffer is sized.
func TestReadFrameOversizedDoesNotAllocate(t *testing.T) {
	input := rawFrame(3, 1, math.MaxUint32, nil, FrameEnd)
	r := NewReader(bytes.NewReader(input), 64)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := r.ReadFrame()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("error %v, want ErrFrameTooLarge", err)
	}
	// Only the *Error and its text are allocated (the count varies with
	// -race, the size does not come near a payload buffer).
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 64<<10 {
		t.Errorf("%d bytes allocated refusing a 4 GiB frame", allocated)
	}
	if cap(r.buf) != 0 {
		t.Errorf("payload buffer grew to %d bytes", cap(r.buf))
	}
}

func TestReaderBufferGrowsWithinMax(t *testing.T) {
	var input []byte
	for _, size := range []int{10, 100, 4000, 50, 4088} {
		input = append(input, rawFrame(3, 1, uint32(size), make([]byte, size), FrameEnd)...)
	}
	r := NewReader(bytes.NewReader(input), 4096)
	r.SetMaxFrameSize(4096)
	for {
		if _, err := r.ReadFrame(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if cap(r.buf) > 4096-FrameOverhead+1 {
			t.Fatalf("buffer capacity %d exceeds what frame_max 4096 needs", cap(r.buf))
		}
	}
}

func TestSetMaxFrameSize(t *testing.T) {
	tests := []struct {
		name string
		set  uint32
		want uint32
	}{
		{name: "zero restores default", set: 0, want: DefaultMaxFrameSize},
		{name: "below frame-min-size", set: 100, want: FrameMinSize},
		{name: "negotiated", set: 1 << 20, want: 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(nil), 16)
			r.SetMaxFrameSize(tt.set)
			if r.max != tt.want {
				t.Errorf("max = %d, want %d", r.max, tt.want)
			}
		})
	}
}

func TestReadProtocolHeader(t *testing.T) {
	tests := []struct {
		name    string
		input   string
		wantErr error
	}{
		{name: "0-9-1", input: "AMQP\x00\x00\x09\x01"},
		{name: "0-9, which RabbitMQ serves as 0-9-1", input: "AMQP\x01\x01\x00\x09"},
		{name: "0-8", input: "AMQP\x01\x01\x08\x00", wantErr: ErrBadProtocolHeader},
		{name: "0-9-0", input: "AMQP\x00\x00\x09\x00", wantErr: ErrBadProtocolHeader},
		{name: "http", input: "GET / HTTP/1.1\r\n", wantErr: ErrBadProtocolHeader},
		{name: "short", input: "AMQP", wantErr: ErrBadProtocolHeader},
		{name: "nothing", input: "", wantErr: io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := NewReader(bytes.NewReader([]byte(tt.input)), 16).ReadProtocolHeader()
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Errorf("error %v, want %v", err, tt.wantErr)
			}
			var e *Error
			if tt.wantErr == ErrBadProtocolHeader && !errors.As(err, &e) {
				t.Errorf("error %T is not a *Error", err)
			}
		})
	}
}

func TestReaderBuffered(t *testing.T) {
	input := append(rawFrame(8, 0, 0, nil, FrameEnd), rawFrame(8, 0, 0, nil, FrameEnd)...)
	r := NewReader(bytes.NewReader(input), 64)
	if _, err := r.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if got := r.Buffered(); got != 8 {
		t.Errorf("Buffered after the first of two frames = %d, want 8", got)
	}
	if _, err := r.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if got := r.Buffered(); got != 0 {
		t.Errorf("Buffered after the last frame = %d, want 0", got)
	}
}
