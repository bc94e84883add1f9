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
// The 7-byte header is read first and its size checked against max before
// any buffer is sized, so a peer claiming a 4 GiB frame costs nothing.
// Payload and frame-end then arrive with one io.ReadFull into the reused
// buffer, and only then are the frame-end, the type and a heartbeat's shape
// judged (CheckFrameEnd), in RabbitMQ's order. A frame refused for its type
// or shape has been consumed whole, so the stream stays in step and the
// peer's next frame, typically its close-ok to the error, can still be read.

// ReadFrame reads the next frame. A clean close between frames returns
// io.EOF unwrapped; a close inside a frame returns io.ErrUnexpectedEOF.
// Protocol violations are *Error (FRAME_ERROR; UNEXPECTED_FRAME for a
// heartbeat on a channel); other read errors are returned as they came.
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

// ParseFrameHeader decodes a frame's 7-byte header (layout at
// Reader.ReadFrame) and checks the one thing that must be known before the
// rest is read: that the whole frame fits in maxFrame bytes. Readers that
// manage their own buffers call it before they size anything, so that a
// peer claiming a 4 GiB frame costs nothing. Everything else is judged by
// CheckFrameEnd once the frame is in.
func ParseFrameHeader(header []byte, maxFrame uint32) (typ uint8, channel uint16, size uint32, err error) {
	typ = header[0]
	channel = binary.BigEndian.Uint16(header[1:])
	size = binary.BigEndian.Uint32(header[3:])
	if uint64(size)+FrameOverhead > uint64(maxFrame) {
		return typ, channel, size, frameError(ErrFrameTooLarge,
			"%s frame on channel %d: frame size %d exceeds negotiated frame_max %d",
			FrameTypeName(typ), channel, uint64(size)+FrameOverhead, maxFrame)
	}
	return typ, channel, size, nil
}

// CheckFrameEnd judges a whole frame once its payload and frame-end octet
// are in: the frame-end octet first, then a known type, then a heartbeat's
// shape. That is RabbitMQ 3.10's order (a heartbeat on channel 1 with a bad
// frame-end is a 501 for the frame-end, not a 505), and like RabbitMQ a
// reader consumes the frame before it returns the error: after a bad type or
// heartbeat the stream is still in step, and the peer's close-ok that follows
// can be read at once. Only after a bad frame-end is the stream lost.
func CheckFrameEnd(typ uint8, channel uint16, size uint32, end byte) error {
	if end != FrameEnd {
		return frameError(ErrBadFrameEnd,
			"%s frame on channel %d, size %d: frame-end octet 0x%02x, want 0xce", FrameTypeName(typ), channel, size, end)
	}
	switch {
	case typ != FrameMethod && typ != FrameHeader && typ != FrameBody && typ != FrameHeartbeat:
		return frameError(ErrUnknownFrameType,
			"unknown frame type %d on channel %d (size %d), want 1, 2, 3 or 8", typ, channel, size)
	case typ == FrameHeartbeat && size != 0:
		return frameError(ErrBadHeartbeat,
			"heartbeat frame on channel %d with %d payload bytes, want an empty payload", channel, size)
	case typ == FrameHeartbeat && channel != 0:
		// RabbitMQ answers a well-formed heartbeat on a channel with 505
		// UNEXPECTED_FRAME, as any frame a channel does not expect.
		return newError(UnexpectedFrame, ErrBadHeartbeat,
			"heartbeat frame on channel %d, want channel 0", channel)
	}
	return nil
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// legacyProtocolHeader is AMQP 0-9's header ("AMQP", 1, 1, 0, 9: class 1,
// instance 1, version 0-9). RabbitMQ 3.10 serves it as 0-9-1, its successor:
// the same connection.start byte for byte, the connection listed as 0-9-1.
// A proxy in front of it must do the same. (RabbitMQ also speaks 0-8 to the
// 0-8 headers; this codec does not, so those are refused.)
var legacyProtocolHeader = []byte("AMQP\x01\x01\x00\x09")

// ReadProtocolHeader reads the 8-byte protocol header a client sends first.
// AMQP 0-9-1's header and the legacy 0-9 one are accepted, and the
// connection continues as 0-9-1. Anything else is a *Error wrapping
// ErrBadProtocolHeader; the spec wants the server to answer it with
// ProtocolHeader and close.
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
	if !bytes.Equal(got[:], ProtocolHeader) && !bytes.Equal(got[:], legacyProtocolHeader) {
		return newError(FrameError, ErrBadProtocolHeader,
			"protocol header %q, want %q (AMQP 0-9-1)", got[:], ProtocolHeader)
	}
	return nil
}
