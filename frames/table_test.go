package frames

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"testing"
)

// everyFieldType has one value of each type DecodeTable produces.
func everyFieldType() Table {
	return Table{
		{Key: "bool", Value: true},
		{Key: "false", Value: false},
		{Key: "int8", Value: int8(-8)},
		{Key: "uint8", Value: uint8(200)},
		{Key: "int16", Value: int16(-1600)},
		{Key: "uint16", Value: uint16(60000)},
		{Key: "int32", Value: int32(-320000)},
		{Key: "uint32", Value: uint32(4000000000)},
		{Key: "int64", Value: int64(-64 << 40)},
		{Key: "float32", Value: float32(1.5)},
		{Key: "float64", Value: math.Inf(-1)},
		{Key: "decimal", Value: Decimal{Scale: 3, Value: -12345}},
		{Key: "string", Value: "héllo\x00"},
		{Key: "bytes", Value: []byte{0, 1, 0xff}},
		{Key: "array", Value: []any{int32(1), "two", []any{}, Table{}}},
		{Key: "timestamp", Value: Timestamp(1700000000)},
		{Key: "table", Value: Table{{Key: "nested", Value: Table{{Key: "deeper", Value: nil}}}}},
		{Key: "void", Value: nil},
		{Key: "bool", Value: false}, // duplicates and order survive
	}
}

func TestTableRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		table Table
	}{
		{name: "empty", table: nil},
		{name: "every type", table: everyFieldType()},
		{name: "empty key", table: Table{{Key: "", Value: "x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			encoded, err := AppendTable([]byte("prefix"), tt.table)
			if err != nil {
				t.Fatalf("AppendTable: %v", err)
			}
			if !bytes.HasPrefix(encoded, []byte("prefix")) {
				t.Fatalf("AppendTable lost the bytes already in buf")
			}
			encoded = encoded[len("prefix"):]
			got, n, err := DecodeTable(append(encoded, "trailing"...))
			if err != nil {
				t.Fatalf("DecodeTable: %v", err)
			}
			if n != len(encoded) {
				t.Errorf("consumed %d bytes, want %d", n, len(encoded))
			}
			if len(got) != 0 || len(tt.table) != 0 {
				if !reflect.DeepEqual(got, tt.table) {
					t.Errorf("decoded %#v\nwant %#v", got, tt.table)
				}
			}
			again, err := AppendTable(nil, got)
			if err != nil || !bytes.Equal(again, encoded) {
				t.Errorf("re-encoded %x (%v), want %x", again, err, encoded)
			}
		})
	}
}

// TestTableDecodeReusesEqualValues: decoding the same bytes into the
// previous result shares it whole and allocates nothing; a changed value
// yields a new table and leaves the old one intact.
func TestTableDecodeReusesEqualValues(t *testing.T) {
	encoded, _ := AppendTable(nil, everyFieldType())
	first, _, err := DecodeTable(encoded)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		again, _, err := decodeTableReusing(encoded, first)
		if err != nil || len(again) != len(first) || &again[0] != &first[0] {
			t.Fatalf("decoding equal bytes did not return the previous table (err %v)", err)
		}
	})
	if allocs != 0 {
		t.Errorf("decoding equal bytes into the previous table: %v allocs, want 0", allocs)
	}
	changed := everyFieldType()
	changed[12].Value = "changed"
	encodedChanged, _ := AppendTable(nil, changed)
	got, _, err := decodeTableReusing(encodedChanged, first)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, changed) {
		t.Errorf("decoded %#v, want %#v", got, changed)
	}
	if !reflect.DeepEqual(first, everyFieldType()) {
		t.Errorf("the previous table was modified: %#v", first)
	}
}

func TestDecodeTableErrors(t *testing.T) {
	size := func(n uint32, body ...byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, n), body...)
	}
	nested := []byte{}
	for range 100 {
		inner := nested
		nested = append([]byte{1, 'k', 'F'}, binary.BigEndian.AppendUint32(nil, uint32(len(inner)))...)
		nested = append(nested, inner...)
	}
	tests := []struct {
		name  string
		input []byte
	}{
		{name: "no size", input: []byte{0, 0}},
		{name: "size past end", input: size(10, 1, 'k')},
		{name: "size 4 GiB", input: size(math.MaxUint32, 1, 'k', 'V')},
		{name: "key past end", input: size(3, 5, 'k', 'e')},
		{name: "missing type", input: size(2, 1, 'k')},
		{name: "unknown type letter", input: size(3, 1, 'k', 'q')},
		{name: "truncated int32", input: size(5, 1, 'k', 'I', 0, 0)},
		{name: "longstr 4 GiB", input: size(7, 1, 'k', 'S', 0xff, 0xff, 0xff, 0xff)},
		{name: "byte array past end", input: size(8, 1, 'k', 'x', 0, 0, 0, 9, 1)},
		{name: "array 4 GiB", input: size(7, 1, 'k', 'A', 0xff, 0xff, 0xff, 0xff)},
		{name: "bad boolean", input: size(4, 1, 'k', 't', 2)},
		{name: "nested 100 deep", input: size(uint32(len(nested)), nested...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(1, func() {
				_, _, err := DecodeTable(tt.input)
				var e *Error
				if !errors.As(err, &e) || e.Code != SyntaxError || !errors.Is(err, ErrMalformed) {
					t.Fatalf("DecodeTable(%x) error %v, want a SYNTAX_ERROR *Error wrapping ErrMalformed", tt.input, err)
				}
			})
			// Error texts cost a few allocations; a 4 GiB length must not.
			if allocs > 20 {
				t.Errorf("%v allocations for a malformed table", allocs)
			}
		})
	}
}

func TestAppendTableErrors(t *testing.T) {
	cyclic := Table{{Key: "self"}}
	cyclic[0].Value = cyclic
	tests := []struct {
		name  string
		table Table
	}{
		{name: "unsupported type", table: Table{{Key: "k", Value: struct{}{}}}},
		{name: "uint64", table: Table{{Key: "k", Value: uint64(1)}}},
		{name: "long key", table: Table{{Key: string(make([]byte, 256)), Value: nil}}},
		{name: "nested unsupported", table: Table{{Key: "a", Value: []any{Table{{Key: "b", Value: map[string]any{}}}}}}},
		{name: "cycle", table: cyclic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AppendTable([]byte("keep"), tt.table)
			if !errors.Is(err, ErrUnencodable) {
				t.Errorf("error %v, want ErrUnencodable", err)
			}
			if string(got) != "keep" {
				t.Errorf("buf = %q, want it unchanged", got)
			}
			// The lenient encoder used by Method.Append never fails and
			// produces a table that decodes.
			if _, _, err := DecodeTable(appendTableLenient(nil, tt.table)); err != nil {
				t.Errorf("lenient encoding does not decode: %v", err)
			}
		})
	}
}

func TestTableGetSetDelete(t *testing.T) {
	var tb Table
	tb.Set("a", "1")
	tb.Set("b", int32(2))
	tb.Set("a", "one")
	if got, ok := tb.Get("a"); !ok || got != "one" {
		t.Errorf("Get(a) = %v, %v; want one, true", got, ok)
	}
	if len(tb) != 2 || tb[0].Key != "a" {
		t.Errorf("Set did not replace in place: %#v", tb)
	}
	shared := tb
	tb.Delete("a")
	if _, ok := tb.Get("a"); ok || len(tb) != 1 {
		t.Errorf("after Delete: %#v", tb)
	}
	if len(shared) != 2 || shared[0].Key != "a" {
		t.Errorf("Delete changed a table shared with another holder: %#v", shared)
	}
	tb.Delete("missing")
	if _, ok := tb.Get("missing"); ok {
		t.Error("Get of a missing key reported it present")
	}
}
