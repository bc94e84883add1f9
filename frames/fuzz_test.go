package frames

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

// The fuzz targets check two properties of every decoder: it never panics,
// and whatever it accepts re-encodes to exactly the bytes it came from.
// Seeds are the golden frames (added here) plus the corpus committed under
// testdata/fuzz/<Name>/, which plain `go test` replays.

func addGoldenSeeds(f *testing.F, part func(raw []byte) []byte) {
	f.Helper()
	for _, file := range goldenFiles {
		for _, g := range loadGolden(f, file) {
			if g.what == "protocol header" {
				continue
			}
			if seed := part(g.raw); seed != nil {
				f.Add(seed)
			}
		}
	}
}

func FuzzReadFrame(f *testing.F) {
	addGoldenSeeds(f, func(raw []byte) []byte { return raw })
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data), 64)
		r.SetMaxFrameSize(FrameMinSize)
		consumed := 0
		for {
			fr, err := r.ReadFrame()
			if err != nil {
				var e *Error
				if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.As(err, &e) {
					t.Fatalf("error of type %T: %v", err, err)
				}
				return
			}
			n := len(fr.Payload) + FrameOverhead
			var out bytes.Buffer
			w := NewWriter(&out, 64)
			if err := w.WriteFrame(fr.Type, fr.Channel, fr.Payload); err != nil {
				t.Fatal(err)
			}
			_ = w.Flush()
			if !bytes.Equal(out.Bytes(), data[consumed:consumed+n]) {
				t.Fatalf("frame re-written as %x, read from %x", out.Bytes(), data[consumed:consumed+n])
			}
			consumed += n
			switch fr.Type {
			case FrameMethod:
				checkMethodRoundTrip(t, fr.Payload)
			case FrameHeader:
				checkContentHeaderRoundTrip(t, fr.Payload)
			}
		}
	})
}

func FuzzDecodeMethod(f *testing.F) {
	addGoldenSeeds(f, func(raw []byte) []byte {
		if raw[0] != FrameMethod {
			return nil
		}
		return raw[7 : len(raw)-1]
	})
	for _, m := range sampleMethods() {
		f.Add(m.Append(nil))
	}
	f.Fuzz(checkMethodRoundTrip)
}

func checkMethodRoundTrip(t *testing.T, payload []byte) {
	m, err := DecodeMethod(payload)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error of type %T: %v", err, err)
		}
		return
	}
	if got := m.Append(nil); !bytes.Equal(got, payload) {
		// Only bits the spec leaves undefined may be lost, and then the
		// re-encoded form must decode to the same value.
		again, err := DecodeMethod(got)
		if err != nil || !reflect.DeepEqual(again, m) || !undefinedBitsOnly(got, payload) {
			t.Fatalf("%s re-encoded as %x, decoded from %x", m.Name(), got, payload)
		}
	}
	if err := m.(validator).Validate(); err != nil {
		t.Fatalf("%s decoded but does not validate: %v", m.Name(), err)
	}
	// Decoding again into the used value gives the same value.
	before := reflect.ValueOf(m).Elem().Interface()
	if err := m.Decode(payload[4:]); err != nil || !reflect.DeepEqual(reflect.ValueOf(m).Elem().Interface(), before) {
		t.Fatalf("%s: reused decode differs (%v)", m.Name(), err)
	}
}

func FuzzDecodeTable(f *testing.F) {
	for _, table := range []Table{everyFieldType(), nil, allProperties().Properties.Headers} {
		b, _ := AppendTable(nil, table)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		table, n, err := DecodeTable(data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		got, err := AppendTable(nil, table)
		if err != nil {
			t.Fatalf("decoded table does not encode: %v", err)
		}
		if !bytes.Equal(got, data[:n]) {
			t.Fatalf("re-encoded as %x, decoded from %x", got, data[:n])
		}
		again, _, err := decodeTableReusing(data, table)
		if err != nil || !reflect.DeepEqual(again, table) {
			t.Fatalf("reused decode differs (%v)", err)
		}
	})
}

func FuzzContentHeader(f *testing.F) {
	addGoldenSeeds(f, func(raw []byte) []byte {
		if raw[0] != FrameHeader {
			return nil
		}
		return raw[7 : len(raw)-1]
	})
	all := allProperties()
	b, _ := all.Append(nil)
	f.Add(b)
	f.Fuzz(checkContentHeaderRoundTrip)
}

func checkContentHeaderRoundTrip(t *testing.T, payload []byte) {
	var h ContentHeader
	if err := h.Decode(payload); err != nil {
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("error of type %T: %v", err, err)
		}
		return
	}
	got, err := h.Append(nil)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("re-encoded as %x (%v), decoded from %x", got, err, payload)
	}
	headers := h.Properties.Headers
	if !h.Properties.Has(FlagHeaders) {
		headers = nil
	}
	replaced, err := ReplaceHeaders(nil, payload, headers)
	if err != nil || !bytes.Equal(replaced, payload) {
		t.Fatalf("ReplaceHeaders with the same headers gave %x (%v), want %x", replaced, err, payload)
	}
}

// undefinedBitsOnly reports whether two encodings of one method differ only
// in bits that a decoder drops: same length, and every differing byte of
// the original has only extra bits set.
func undefinedBitsOnly(canonical, original []byte) bool {
	if len(canonical) != len(original) {
		return false
	}
	for i := range canonical {
		if canonical[i] != original[i] && canonical[i]&^original[i] != 0 {
			return false
		}
	}
	return true
}
