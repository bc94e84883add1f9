package frames

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
)

// Frame is one AMQP frame as read.
type Frame struct {
	Type    uint8
	Channel uint16
	// Payload aliases the Reader's buffer: valid only until the next
	// ReadFrame. Copy it, or decode it, to keep it.
	Payload []byte
}

// Reader reads frames from one connection. It is not safe for concurrent
// use: one read loop owns it.
type Reader struct {
	in     *bufio.Reader
	header [frameHeaderSize]byte
	buf    []byte // reused payload buffer; grows up to max, never beyond
	max    uint32 // largest whole frame accepted, overhead included
}

// NewReader reads frames from r through a bufio.Reader of bufferSize bytes.
func NewReader(r io.Reader, bufferSize int) *Reader {
	return &Reader{in: bufio.NewReaderSize(r, bufferSize), max: DefaultMaxFrameSize}
}

// SetMaxFrameSize sets the largest whole frame (8 bytes of overhead
// included) to accept, normally the negotiated frame_max. 0 restores the
// default 131072: frame_max 0 means "no limit" in connection.tune, which a
// proxy must not grant. Values below FrameMinSize are raised to it, since
// the spec lets every peer send frames of that size.
func (r *Reader) SetMaxFrameSize(n uint32) { r.max = MaxFrameSize(n) }

// MaxFrameSize is the largest whole frame a reader accepts for a negotiated
// frame_max n (see Reader.SetMaxFrameSize).
func MaxFrameSize(n uint32) uint32 {
	switch {
	case n == 0:
		return DefaultMaxFrameSize
	case n < FrameMinSize:
		return FrameMinSize
	}
	return n
}

// Buffered is the number of bytes already read from the socket and not yet
// consumed. When it is 0 the next ReadFrame may block, so a proxy flushes
// its writer first.
func (r *Reader) Buffered() int { return r.in.Buffered() }

// Frame layout (spec 4.2.3):
//
//	0      1         3             7                  7+size   8+size
//	+------+---------+-------------+------------------+--------+
//	| type | channel | size        | payload          | 0xCE   |
//	| octet| short   | long        | size octets      | end    |
//	+------+---------+-------------+------------------+--------+
//
// The 7-byte header is read first and checked (known type, size within
// max, heartbeat shape) before any buffer is sized, so a peer claiming a
// 4 GiB frame costs nothing. Payload and frame-end then arrive with one
// io.ReadFull into the reused buffer.

// ReadFrame reads the next frame. A clean close between frames returns
// io.EOF unwrapped; a close inside a frame returns io.ErrUnexpectedEOF.
// Protocol violations are *Error with FRAME_ERROR; other read errors are
// returned as they came.
func (r *Reader) ReadFrame() (Frame, error) {
	if n, err := io.ReadFull(r.in, r.header[:]); err != nil {
		if errors.Is(err, io.EOF) && n == 0 {
			return Frame{}, io.EOF
		}
		return Frame{}, unexpectedEOF(err)
	}
	typ, channel, size, err := ParseFrameHeader(r.header[:], r.max)
	if err != nil {
		return Frame{}, err
	}

	need := int(size) + 1 // payload and frame-end
	if cap(r.buf) < need {
		// Grow geometrically so that slowly rising sizes do not allocate
		// every time, but never past what max allows.
		newCap := max(need, 2*cap(r.buf))
		newCap = min(newCap, int(r.max)-FrameOverhead+1)
		r.buf = make([]byte, newCap)
	}
	buf := r.buf[:need]
	if _, err := io.ReadFull(r.in, buf); err != nil {
		return Frame{}, unexpectedEOF(err)
	}
	if err := CheckFrameEnd(typ, channel, size, buf[size]); err != nil {
		return Frame{}, err
	}
	return Frame{Type: typ, Channel: channel, Payload: buf[:size]}, nil
}

// ParseFrameHeader decodes and checks a frame's 7-byte header (layout at
// Reader.ReadFrame): a known type, a whole frame of at most max bytes, a
// heartbeat's shape. Readers that manage their own buffers call it before
// they size anything, so that a peer claiming a 4 GiB frame costs nothing.
func ParseFrameHeader(header []byte, maxFrame uint32) (typ uint8, channel uint16, size uint32, err error) {
	typ = header[0]
	channel = binary.BigEndian.Uint16(header[1:])
	size = binary.BigEndian.Uint32(header[3:])

	switch typ {
	case FrameMethod, FrameHeader, FrameBody, FrameHeartbeat:
	default:
		return typ, channel, size, frameError(ErrUnknownFrameType,
			"unknown frame type %d on channel %d (size %d), want 1, 2, 3 or 8", typ, channel, size)
	}
	if uint64(size)+FrameOverhead > uint64(maxFrame) {
		return typ, channel, size, frameError(ErrFrameTooLarge,
			"%s frame on channel %d: frame size %d exceeds negotiated frame_max %d",
			FrameTypeName(typ), channel, uint64(size)+FrameOverhead, maxFrame)
	}
	switch {
	case typ == FrameHeartbeat && size != 0:
		return typ, channel, size, frameError(ErrBadHeartbeat,
			"heartbeat frame on channel %d with %d payload bytes, want an empty payload", channel, size)
	case typ == FrameHeartbeat && channel != 0:
		// RabbitMQ answers a well-formed heartbeat on a channel with 505
		// UNEXPECTED_FRAME, as any frame a channel does not expect.
		return typ, channel, size, newError(UnexpectedFrame, ErrBadHeartbeat,
			"heartbeat frame on channel %d, want channel 0", channel)
	}
	return typ, channel, size, nil
}

// CheckFrameEnd checks the octet after a frame's payload.
func CheckFrameEnd(typ uint8, channel uint16, size uint32, end byte) error {
	if end != FrameEnd {
		return frameError(ErrBadFrameEnd,
			"%s frame on channel %d, size %d: frame-end octet 0x%02x, want 0xce", FrameTypeName(typ), channel, size, end)
	}
	return nil
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ReadProtocolHeader reads the 8-byte protocol header a client sends first.
// Anything but AMQP 0-9-1 is a *Error wrapping ErrBadProtocolHeader; the
// spec wants the server to answer it with ProtocolHeader and close.
func (r *Reader) ReadProtocolHeader() error {
	var got [8]byte
	if n, err := io.ReadFull(r.in, got[:]); err != nil {
		if errors.Is(err, io.EOF) && n == 0 {
			return io.EOF
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return newError(FrameError, ErrBadProtocolHeader,
				"protocol header: got %q before the connection closed, want %q", got[:n], ProtocolHeader)
		}
		return err
	}
	if !bytes.Equal(got[:], ProtocolHeader) {
		return newError(FrameError, ErrBadProtocolHeader,
			"protocol header %q, want %q (AMQP 0-9-1)", got[:], ProtocolHeader)
	}
	return nil
}
