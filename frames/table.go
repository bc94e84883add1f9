package frames

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Table is an AMQP field table. It is a slice, not a map, so that the order
// and duplicates of the wire survive: decode then encode is byte exact,
// which a proxy forwarding arguments and headers needs.
type Table []Field

// Field is one table entry. Value holds one of the Go types listed at
// DecodeTable.
type Field struct {
	Key   string
	Value any
}

// Decimal is the 'D' field type: Value × 10^-Scale.
type Decimal struct {
	Scale uint8
	Value int32
}

// Timestamp is the 'T' field type and the timestamp property: seconds since
// the Unix epoch. It is kept as the wire's integer so that it round-trips.
type Timestamp uint64

// maxTableDepth bounds the nesting of tables and arrays. Recursion on
// attacker-chosen depth would otherwise grow the stack without bound; no
// real client nests more than a few levels.
const maxTableDepth = 64

// Get returns the value of the first field named key.
func (t Table) Get(key string) (any, bool) {
	for _, f := range t {
		if f.Key == key {
			return f.Value, true
		}
	}
	return nil, false
}

// Set replaces the value of the first field named key, or appends a field.
func (t *Table) Set(key string, value any) {
	for i := range *t {
		if (*t)[i].Key == key {
			(*t)[i].Value = value
			return
		}
	}
	*t = append(*t, Field{Key: key, Value: value})
}

// Delete removes every field named key, keeping the order of the rest. It
// builds a new backing array so that a table shared with a previous decode
// is never changed under its other holders.
func (t *Table) Delete(key string) {
	if _, ok := t.Get(key); !ok {
		return
	}
	kept := make(Table, 0, len(*t)-1)
	for _, f := range *t {
		if f.Key != key {
			kept = append(kept, f)
		}
	}
	*t = kept
}

// Field table on the wire (spec 4.2.5.5, RabbitMQ's type letters):
//
//	+-----------+--------------------------------------------------+
//	| size long | field*: key shortstr | type octet | value         |
//	+-----------+--------------------------------------------------+
//
//	't' bool (octet 0/1)  'b' int8    'B' uint8   's' int16  'u' uint16
//	'I' int32             'i' uint32  'l' int64   'f' float32 'd' float64
//	'D' Decimal (scale octet, value long)         'S' string (longstr)
//	'x' []byte (longstr)  'A' []any (size long, then type+value*)
//	'T' Timestamp (longlong)  'F' Table  'V' nil

// DecodeTable decodes a table starting at its 4-byte size and returns the
// bytes consumed. Values are bool, int8, uint8, int16, uint16, int32,
// uint32, int64, float32, float64, Decimal, string, []byte, []any,
// Timestamp, Table or nil. Nothing aliases b.
func DecodeTable(b []byte) (Table, int, error) {
	return decodeTableReusing(b, nil)
}

// decodeTableReusing decodes like DecodeTable but shares with old whatever
// is equal: keys, values, and old itself when the whole table is unchanged.
// old is never modified, so a table someone else still holds stays valid;
// in the steady state (the same headers or arguments again) it allocates
// nothing.
func decodeTableReusing(b []byte, old Table) (Table, int, error) {
	if len(b) < 4 {
		return nil, 0, syntaxError("table size needs 4 bytes, only %d left", len(b))
	}
	size := binary.BigEndian.Uint32(b)
	if uint64(size) > uint64(len(b)-4) {
		return nil, 0, syntaxError("table size %d exceeds the %d bytes left", size, len(b)-4)
	}
	t, _, err := decodeTableBody(b[4:4+size], old, 1)
	if err != nil {
		return nil, 0, err
	}
	if t == nil {
		t = Table{} // present but empty, unlike an absent (nil) table; no allocation
	}
	return t, 4 + int(size), nil
}

// decodeTableBody decodes the fields of a table (after its size). same
// reports that the result is old itself.
func decodeTableBody(b []byte, old Table, depth int) (t Table, same bool, err *Error) {
	if depth > maxTableDepth {
		return nil, false, syntaxError("tables nested more than %d deep", maxTableDepth)
	}
	same = true
	i := 0
	for off := 0; off < len(b); i++ {
		keyLen := int(b[off])
		off++
		if keyLen > len(b)-off {
			return nil, false, syntaxError("field %d: key length %d exceeds the %d bytes left", i, keyLen, len(b)-off)
		}
		key := b[off : off+keyLen]
		off += keyLen
		var prev *Field
		if i < len(old) {
			prev = &old[i]
		}
		var prevValue any
		if prev != nil {
			prevValue = prev.Value
		}
		v, n, valueSame, err := decodeValue(b[off:], prevValue, depth)
		if err != nil {
			return nil, false, keyed(err, string(key))
		}
		off += n
		keySame := prev != nil && string(key) == prev.Key
		if same && keySame && valueSame {
			continue
		}
		if same {
			same = false
			t = make(Table, i, max(len(old), i+1))
			copy(t, old[:i])
		}
		f := Field{Value: v}
		if keySame {
			f.Key = prev.Key
		} else {
			f.Key = string(key)
		}
		t = append(t, f)
	}
	if same {
		if i == len(old) {
			return old, true, nil
		}
		return old[:i:i], false, nil
	}
	return t, false, nil
}

// decodeArrayBody decodes the values of an 'A' array, sharing with old like
// decodeTableBody.
func decodeArrayBody(b []byte, old []any, depth int) (a []any, same bool, err *Error) {
	if depth > maxTableDepth {
		return nil, false, syntaxError("arrays nested more than %d deep", maxTableDepth)
	}
	same = true
	i := 0
	for off := 0; off < len(b); i++ {
		var prev any
		if i < len(old) {
			prev = old[i]
		}
		v, n, valueSame, err := decodeValue(b[off:], prev, depth)
		if err != nil {
			if !strings.HasPrefix(err.Text, "key ") && !strings.HasPrefix(err.Text, "array element ") {
				err.Text = "array element " + strconv.Itoa(i) + ": " + err.Text
			}
			return nil, false, err
		}
		off += n
		if same && i < len(old) && valueSame {
			continue
		}
		if same {
			same = false
			a = make([]any, i, max(len(old), i+1))
			copy(a, old[:i])
		}
		a = append(a, v)
	}
	if same {
		if i == len(old) {
			return old, true, nil
		}
		return old[:i:i], false, nil
	}
	return a, false, nil
}

// reuse returns prev when it holds v already, so that v need not be boxed
// (boxing most numbers allocates).
func reuse[T comparable](prev any, v T) (any, bool) {
	if p, ok := prev.(T); ok && p == v {
		return prev, true
	}
	return v, false
}

// decodeValue decodes one type octet and value. n is the bytes consumed.
func decodeValue(b []byte, prev any, depth int) (v any, n int, same bool, err *Error) {
	if len(b) == 0 {
		return nil, 0, false, syntaxError("missing field type octet")
	}
	typ := b[0]
	need := func(size int) *Error {
		if size > len(b)-1 {
			return syntaxError("field type '%c' needs %d bytes, only %d left", typ, size, len(b)-1)
		}
		return nil
	}
	sized := func() ([]byte, *Error) {
		if err := need(4); err != nil {
			return nil, err
		}
		size := binary.BigEndian.Uint32(b[1:])
		if uint64(size) > uint64(len(b)-5) {
			return nil, syntaxError("field type '%c': length %d exceeds the %d bytes left", typ, size, len(b)-5)
		}
		return b[5 : 5+size], nil
	}
	switch typ {
	case 't':
		if err := need(1); err != nil {
			return nil, 0, false, err
		}
		if b[1] > 1 {
			return nil, 0, false, syntaxError("boolean octet 0x%02x, want 0 or 1", b[1])
		}
		v, same = reuse(prev, b[1] == 1)
		return v, 2, same, nil
	case 'b':
		if err := need(1); err != nil {
			return nil, 0, false, err
		}
		v, same = reuse(prev, int8(b[1]))
		return v, 2, same, nil
	case 'B':
		if err := need(1); err != nil {
			return nil, 0, false, err
		}
		v, same = reuse(prev, b[1])
		return v, 2, same, nil
	case 's', 'u':
		if err := need(2); err != nil {
			return nil, 0, false, err
		}
		u := binary.BigEndian.Uint16(b[1:])
		if typ == 's' {
			v, same = reuse(prev, int16(u))
		} else {
			v, same = reuse(prev, u)
		}
		return v, 3, same, nil
	case 'I', 'i', 'f':
		if err := need(4); err != nil {
			return nil, 0, false, err
		}
		u := binary.BigEndian.Uint32(b[1:])
		switch typ {
		case 'I':
			v, same = reuse(prev, int32(u))
		case 'i':
			v, same = reuse(prev, u)
		default:
			// Compare bits, not values: NaN != NaN, and -0 == +0.
			if p, ok := prev.(float32); ok && math.Float32bits(p) == u {
				return prev, 5, true, nil
			}
			v = math.Float32frombits(u)
		}
		return v, 5, same, nil
	case 'l', 'd', 'T':
		if err := need(8); err != nil {
			return nil, 0, false, err
		}
		u := binary.BigEndian.Uint64(b[1:])
		switch typ {
		case 'l':
			v, same = reuse(prev, int64(u))
		case 'T':
			v, same = reuse(prev, Timestamp(u))
		default:
			if p, ok := prev.(float64); ok && math.Float64bits(p) == u {
				return prev, 9, true, nil
			}
			v = math.Float64frombits(u)
		}
		return v, 9, same, nil
	case 'D':
		if err := need(5); err != nil {
			return nil, 0, false, err
		}
		v, same = reuse(prev, Decimal{Scale: b[1], Value: int32(binary.BigEndian.Uint32(b[2:]))})
		return v, 6, same, nil
	case 'S':
		raw, err := sized()
		if err != nil {
			return nil, 0, false, err
		}
		if p, ok := prev.(string); ok && p == string(raw) {
			return prev, 5 + len(raw), true, nil
		}
		return string(raw), 5 + len(raw), false, nil
	case 'x':
		raw, err := sized()
		if err != nil {
			return nil, 0, false, err
		}
		if p, ok := prev.([]byte); ok && bytes.Equal(p, raw) {
			return prev, 5 + len(raw), true, nil
		}
		return bytes.Clone(raw), 5 + len(raw), false, nil
	case 'A':
		raw, err := sized()
		if err != nil {
			return nil, 0, false, err
		}
		p, _ := prev.([]any)
		a, same, derr := decodeArrayBody(raw, p, depth+1)
		if derr != nil {
			return nil, 0, false, derr
		}
		if same && prev != nil {
			return prev, 5 + len(raw), true, nil // re-boxing a would allocate
		}
		if a == nil {
			a = []any{} // an empty array is a value, not a missing one
		}
		return a, 5 + len(raw), false, nil
	case 'F':
		raw, err := sized()
		if err != nil {
			return nil, 0, false, err
		}
		p, _ := prev.(Table)
		t, same, derr := decodeTableBody(raw, p, depth+1)
		if derr != nil {
			return nil, 0, false, derr
		}
		if same && prev != nil {
			return prev, 5 + len(raw), true, nil
		}
		if t == nil {
			t = Table{}
		}
		return t, 5 + len(raw), false, nil
	case 'V':
		return nil, 1, prev == nil, nil
	}
	return nil, 0, false, syntaxError("unknown field type %s", quoteTypeOctet(typ))
}

func quoteTypeOctet(typ byte) string {
	if typ >= 0x20 && typ < 0x7f {
		return fmt.Sprintf("'%c' (0x%02x)", typ, typ)
	}
	return fmt.Sprintf("0x%02x", typ)
}

// AppendTable appends t with its 4-byte size prefix.
//
// It returns an error, rather than panicking or dropping data silently, when
// a key is longer than 255 bytes, a value has a Go type outside the list at
// DecodeTable (plus int, encoded as 'l'), or nesting exceeds 64 levels; buf
// is then returned unchanged. Generated method Append methods, which cannot
// fail, encode such values as void instead; their Validate reports them and
// Writer.WriteMethod calls it.
func AppendTable(buf []byte, t Table) ([]byte, error) {
	start := len(buf)
	out, err := appendTable(buf, t, 1, false)
	if err != nil {
		return buf[:start], err
	}
	return out, nil
}

// appendTableLenient never fails: see AppendTable.
func appendTableLenient(buf []byte, t Table) []byte {
	out, _ := appendTable(buf, t, 1, true)
	return out
}

func appendTable(buf []byte, t Table, depth int, lenient bool) ([]byte, *Error) {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0)
	for _, f := range t {
		if len(f.Key) > 255 && !lenient {
			return buf, unencodable("key %.20q...: %d bytes, the limit is 255", f.Key, len(f.Key))
		}
		buf = appendShortstr(buf, f.Key)
		var err *Error
		buf, err = appendValue(buf, f.Value, depth, lenient)
		if err != nil {
			return buf, keyed(err, f.Key)
		}
	}
	return putSize(buf, start)
}

// putSize writes the size of what follows buf[start:start+4] into it.
func putSize(buf []byte, start int) ([]byte, *Error) {
	size := len(buf) - start - 4
	if uint64(size) > math.MaxUint32 {
		return buf, unencodable("table or array of %d bytes exceeds 4 GiB", size)
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(size))
	return buf, nil
}

func appendValue(buf []byte, value any, depth int, lenient bool) ([]byte, *Error) {
	be := binary.BigEndian
	switch v := value.(type) {
	case bool:
		var o byte
		if v {
			o = 1
		}
		return append(buf, 't', o), nil
	case int8:
		return append(buf, 'b', byte(v)), nil
	case uint8:
		return append(buf, 'B', v), nil
	case int16:
		return be.AppendUint16(append(buf, 's'), uint16(v)), nil
	case uint16:
		return be.AppendUint16(append(buf, 'u'), v), nil
	case int32:
		return be.AppendUint32(append(buf, 'I'), uint32(v)), nil
	case uint32:
		return be.AppendUint32(append(buf, 'i'), v), nil
	case int64:
		return be.AppendUint64(append(buf, 'l'), uint64(v)), nil
	case int:
		return be.AppendUint64(append(buf, 'l'), uint64(v)), nil
	case float32:
		return be.AppendUint32(append(buf, 'f'), math.Float32bits(v)), nil
	case float64:
		return be.AppendUint64(append(buf, 'd'), math.Float64bits(v)), nil
	case Decimal:
		return be.AppendUint32(append(buf, 'D', v.Scale), uint32(v.Value)), nil
	case string:
		return appendLongstr(append(buf, 'S'), v), nil
	case []byte:
		return appendLongstr(append(buf, 'x'), string(v)), nil
	case Timestamp:
		return be.AppendUint64(append(buf, 'T'), uint64(v)), nil
	case Table:
		if depth+1 > maxTableDepth {
			return tooDeep(buf, lenient)
		}
		return appendTable(append(buf, 'F'), v, depth+1, lenient)
	case []any:
		if depth+1 > maxTableDepth {
			return tooDeep(buf, lenient)
		}
		buf = append(buf, 'A')
		start := len(buf)
		buf = append(buf, 0, 0, 0, 0)
		for i, e := range v {
			var err *Error
			buf, err = appendValue(buf, e, depth+1, lenient)
			if err != nil {
				if !strings.HasPrefix(err.Text, "key ") && !strings.HasPrefix(err.Text, "array element ") {
					err.Text = "array element " + strconv.Itoa(i) + ": " + err.Text
				}
				return buf, err
			}
		}
		return putSize(buf, start)
	case nil:
		return append(buf, 'V'), nil
	}
	if lenient {
		return append(buf, 'V'), nil
	}
	return buf, unencodable("unsupported Go type %T", value)
}

// tooDeep answers a table or array nested past maxTableDepth (a cycle, most
// likely): void when lenient, so that the result still decodes.
func tooDeep(buf []byte, lenient bool) ([]byte, *Error) {
	if lenient {
		return append(buf, 'V'), nil
	}
	return buf, unencodable("tables and arrays nested more than %d deep", maxTableDepth)
}

// keyed names the field an error happened in. Only the innermost key is
// named: prefixing every level of a deeply nested table would make the text
// as deep as the table.
func keyed(err *Error, key string) *Error {
	if !strings.HasPrefix(err.Text, "key ") && !strings.HasPrefix(err.Text, "array element ") {
		err.Text = "key " + strconv.Quote(key) + ": " + err.Text
	}
	return err
}
