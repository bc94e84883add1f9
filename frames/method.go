package frames

import (
	"encoding/binary"
	"errors"
)

// Method is one AMQP method. The generated types (BasicPublish, ...)
// implement it with pointer receivers.
type Method interface {
	ID() (classID, methodID uint16)
	Name() string // "basic.publish"
	Synchronous() bool
	HasContent() bool
	// Decode reads the arguments only (the payload after the 4 id bytes).
	// It checks every length against what is left and fails when bytes are
	// left over. Decoding into a reused value keeps strings that did not
	// change, so it does not allocate in the steady state.
	Decode(args []byte) error
	// Append appends class id, method id and the encoded arguments. It
	// cannot fail: a string longer than a shortstr allows is cut at 255
	// bytes and a table value AppendTable rejects becomes void. The
	// generated types' Validate reports both, and Writer.WriteMethod
	// refuses such values.
	Append(buf []byte) []byte
}

// MethodKey packs class and method ids into one value; the generated
// <Type>Key constants are its results, so a proxy can switch on what
// ParseMethodID returns without decoding anything.
func MethodKey(classID, methodID uint16) uint32 { return uint32(classID)<<16 | uint32(methodID) }

// bit is the packed-octet value of one bit field.
func bit(set bool, position uint) uint8 {
	if set {
		return 1 << position
	}
	return 0
}

// validator is implemented by every generated method type; WriteMethod uses
// it to refuse values Append would have to cut or void.
type validator interface{ Validate() error }

// A method frame's payload:
//
//	0        2         4
//	+--------+---------+-------------------+
//	| class  | method  | arguments ...     |
//	| short  | short   |                   |
//	+--------+---------+-------------------+

// ParseMethodID splits a method frame's payload into its ids and arguments,
// without decoding anything else.
func ParseMethodID(payload []byte) (classID, methodID uint16, args []byte, err error) {
	if len(payload) < 4 {
		return 0, 0, nil, syntaxError("method frame payload is %d bytes, want at least 4 (class id, method id)", len(payload))
	}
	return binary.BigEndian.Uint16(payload), binary.BigEndian.Uint16(payload[2:]), payload[4:], nil
}

// DecodeMethod decodes a method frame's payload into a new value of the
// generated type. For the hot path, keep a value per type and call its
// Decode instead: that reuses its strings.
func DecodeMethod(payload []byte) (Method, error) {
	classID, methodID, args, err := ParseMethodID(payload)
	if err != nil {
		return nil, err
	}
	m, err := NewMethod(classID, methodID)
	if err != nil {
		return nil, err
	}
	if err := m.Decode(args); err != nil {
		return nil, err
	}
	return m, nil
}

// decoder walks a method's arguments. The first error sticks and later
// reads return zero values, so generated Decode methods stay straight-line
// code with a single check at the end (finish).
type decoder struct {
	args     []byte
	off      int
	err      error
	method   string // "basic.publish", for error texts
	classID  uint16
	methodID uint16
}

func (d *decoder) fail(e *Error) {
	if d.err == nil {
		e.ClassID, e.MethodID = d.classID, d.methodID
		d.err = e
	}
}

// take returns the next n bytes, or nil after recording a truncation error.
func (d *decoder) take(n int, field, kind string) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.args)-d.off {
		d.fail(syntaxError("%s: field %s (%s) needs %d bytes at offset %d, only %d left",
			d.method, field, kind, n, d.off, len(d.args)-d.off))
		return nil
	}
	b := d.args[d.off : d.off+n]
	d.off += n
	return b
}

func (d *decoder) octet(field string) uint8 {
	if b := d.take(1, field, "octet"); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) short(field string) uint16 {
	if b := d.take(2, field, "short"); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) long(field string) uint32 {
	if b := d.take(4, field, "long"); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) longlong(field string) uint64 {
	if b := d.take(8, field, "longlong"); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// bits reads a packed octet of count bit fields. Bits the spec does not
// define are ignored, as RabbitMQ ignores them: a client that sets one still
// gets its ack applied. Such an octet re-encodes without them.
func (d *decoder) bits(fields string, count int) uint8 {
	b := d.take(1, fields, "bit")
	if b == nil {
		return 0
	}
	return b[0] & (1<<count - 1)
}

func (d *decoder) shortstr(dst *string, field string) {
	n := d.take(1, field, "shortstr length")
	if n == nil {
		return
	}
	if b := d.take(int(n[0]), field, "shortstr"); b != nil {
		// The comparison does not allocate; only a changed value is copied.
		if string(b) != *dst {
			*dst = string(b)
		}
	}
}

func (d *decoder) longstr(dst *string, field string) {
	n := d.take(4, field, "longstr length")
	if n == nil {
		return
	}
	size := binary.BigEndian.Uint32(n)
	if uint64(size) > uint64(len(d.args)-d.off) {
		d.fail(syntaxError("%s: field %s: longstr length %d exceeds the %d bytes left",
			d.method, field, size, len(d.args)-d.off))
		return
	}
	if b := d.take(int(size), field, "longstr"); b != nil {
		if string(b) != *dst {
			*dst = string(b)
		}
	}
}

func (d *decoder) table(dst *Table, field string) {
	if d.err != nil {
		return
	}
	t, n, err := decodeTableReusing(d.args[d.off:], *dst)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Text = d.method + ": field " + field + ": " + e.Text
			d.fail(e)
		}
		return
	}
	*dst = t
	d.off += n
}

func (d *decoder) finish() error {
	if d.err == nil && d.off != len(d.args) {
		d.fail(syntaxError("%s: %d bytes left over after the last field", d.method, len(d.args)-d.off))
	}
	return d.err
}

func appendShortstr(buf []byte, s string) []byte {
	if len(s) > 255 {
		s = s[:255]
	}
	buf = append(buf, byte(len(s)))
	return append(buf, s...)
}

func appendLongstr(buf []byte, s string) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
	return append(buf, s...)
}

func checkShortstr(s, method, field string) error {
	if len(s) > 255 {
		return unencodable("%s: field %s: shortstr is %d bytes, the limit is 255", method, field, len(s))
	}
	return nil
}

func checkTable(t Table, method, field string) error {
	if _, err := AppendTable(nil, t); err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Text = method + ": field " + field + ": " + e.Text
		}
		return err
	}
	return nil
}
