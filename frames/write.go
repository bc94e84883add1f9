package frames

import (
	"bufio"
	"encoding/binary"
	"io"
	"math"
)

// Writer writes frames to one connection through a bufio.Writer. It is not
// safe for concurrent use: one write loop owns it. Nothing reaches the
// socket until Flush or until the buffer fills; flush on message boundaries.
type Writer struct {
	out     *bufio.Writer
	header  [frameHeaderSize]byte
	scratch []byte // reused encoding buffer for methods and content headers
}

// NewWriter writes to w through a bufio.Writer of bufferSize bytes.
func NewWriter(w io.Writer, bufferSize int) *Writer {
	return &Writer{out: bufio.NewWriterSize(w, bufferSize)}
}

// WriteFrame writes one frame (layout at Reader.ReadFrame). The payload is
// handed to bufio as is: a payload larger than the free buffer space goes
// straight to the socket, so large bodies are not copied twice.
func (w *Writer) WriteFrame(typ uint8, channel uint16, payload []byte) error {
	if uint64(len(payload)) > math.MaxUint32 {
		return unencodable("%s frame on channel %d: payload of %d bytes exceeds 4 GiB", FrameTypeName(typ), channel, len(payload))
	}
	w.header[0] = typ
	binary.BigEndian.PutUint16(w.header[1:], channel)
	binary.BigEndian.PutUint32(w.header[3:], uint32(len(payload)))
	if _, err := w.out.Write(w.header[:]); err != nil {
		return err
	}
	if _, err := w.out.Write(payload); err != nil {
		return err
	}
	return w.out.WriteByte(FrameEnd)
}

// WriteMethod encodes m into a reused scratch buffer and writes it as a
// method frame; steady state allocates nothing. Values Append could not
// encode faithfully (see Validate on the generated types) are refused
// before anything is written.
func (w *Writer) WriteMethod(channel uint16, m Method) error {
	if v, ok := m.(validator); ok {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	w.scratch = m.Append(w.scratch[:0])
	return w.WriteFrame(FrameMethod, channel, w.scratch)
}

// WriteContentHeader encodes h into the scratch buffer and writes it as a
// header frame.
func (w *Writer) WriteContentHeader(channel uint16, h *ContentHeader) error {
	var err error
	if w.scratch, err = h.Append(w.scratch[:0]); err != nil {
		return err
	}
	return w.WriteFrame(FrameHeader, channel, w.scratch)
}

// WriteHeartbeat writes a heartbeat frame (channel 0, empty payload).
func (w *Writer) WriteHeartbeat() error { return w.WriteFrame(FrameHeartbeat, 0, nil) }

// WriteProtocolHeader writes the AMQP 0-9-1 protocol header.
func (w *Writer) WriteProtocolHeader() error {
	_, err := w.out.Write(ProtocolHeader)
	return err
}

// Flush sends everything buffered to the socket.
func (w *Writer) Flush() error { return w.out.Flush() }

// Buffered is the number of bytes written but not yet flushed.
func (w *Writer) Buffered() int { return w.out.Buffered() }
