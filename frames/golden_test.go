package frames

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// goldenFrame is one line of a testdata/golden/*.hex dump: whole frames
// captured between amqp091-go and a real RabbitMQ 3.10 node.
type goldenFrame struct {
	what string // the comment line above it
	raw  []byte
}

func loadGolden(t testing.TB, name string) []goldenFrame {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "golden", name))
	if err != nil {
		t.Fatalf("opening golden file: %v", err)
	}
	defer f.Close()
	var out []goldenFrame
	what := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
		case strings.HasPrefix(line, "#"):
			what = strings.TrimSpace(strings.TrimPrefix(line, "#"))
		default:
			raw, err := hex.DecodeString(line)
			if err != nil {
				t.Fatalf("%s: %q: %v", name, what, err)
			}
			out = append(out, goldenFrame{what: what, raw: raw})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	return out
}

var goldenFiles = []string{"client-to-server.hex", "server-to-client.hex"}

// TestGoldenFramesRoundTrip decodes every captured frame and re-encodes it,
// byte for byte: methods through their generated type, content headers
// through ContentHeader, and each whole stream through Reader and Writer.
func TestGoldenFramesRoundTrip(t *testing.T) {
	for _, file := range goldenFiles {
		t.Run(file, func(t *testing.T) {
			frames := loadGolden(t, file)
			var stream bytes.Buffer
			for _, g := range frames {
				stream.Write(g.raw)
			}
			r := NewReader(bytes.NewReader(stream.Bytes()), 4096)
			var rewritten bytes.Buffer
			w := NewWriter(&rewritten, 4096)
			for i, g := range frames {
				if g.what == "protocol header" {
					if err := r.ReadProtocolHeader(); err != nil {
						t.Fatalf("ReadProtocolHeader: %v", err)
					}
					if err := w.WriteProtocolHeader(); err != nil {
						t.Fatal(err)
					}
					continue
				}
				f, err := r.ReadFrame()
				if err != nil {
					t.Fatalf("frame %d (%s): ReadFrame: %v", i, g.what, err)
				}
				checkGoldenFrame(t, g, f)
				if err := w.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(rewritten.Bytes(), stream.Bytes()) {
				t.Errorf("stream through Reader and Writer differs from the capture")
			}
		})
	}
}

func checkGoldenFrame(t *testing.T, g goldenFrame, f Frame) {
	t.Helper()
	switch f.Type {
	case FrameMethod:
		m, err := DecodeMethod(f.Payload)
		if err != nil {
			t.Fatalf("%s: DecodeMethod: %v", g.what, err)
		}
		if !strings.HasSuffix(g.what, m.Name()) {
			t.Errorf("%s: decoded as %s", g.what, m.Name())
		}
		if got := m.Append(nil); !bytes.Equal(got, f.Payload) {
			t.Errorf("%s: re-encoded\n%x\nwant\n%x", g.what, got, f.Payload)
		}
		// Decoding into the same value again must give the same value.
		again := reflect.New(reflect.TypeOf(m).Elem()).Interface().(Method)
		_ = again.Decode(f.Payload[4:])
		if err := m.Decode(f.Payload[4:]); err != nil || !reflect.DeepEqual(m, again) {
			t.Errorf("%s: decoding into a reused value: %v, %+v want %+v", g.what, err, m, again)
		}
	case FrameHeader:
		var h ContentHeader
		if err := h.Decode(f.Payload); err != nil {
			t.Fatalf("%s: ContentHeader.Decode: %v", g.what, err)
		}
		got, err := h.Append(nil)
		if err != nil {
			t.Fatalf("%s: ContentHeader.Append: %v", g.what, err)
		}
		if !bytes.Equal(got, f.Payload) {
			t.Errorf("%s: re-encoded\n%x\nwant\n%x", g.what, got, f.Payload)
		}
	case FrameHeartbeat:
		if f.Channel != 0 || len(f.Payload) != 0 {
			t.Errorf("%s: heartbeat on channel %d with %d bytes", g.what, f.Channel, len(f.Payload))
		}
	}
}

// TestGoldenHeadersTable checks the decoded values of the headers amqp091-go
// published and RabbitMQ delivered, one per field type.
func TestGoldenHeadersTable(t *testing.T) {
	var h ContentHeader
	found := false
	for _, g := range loadGolden(t, "server-to-client.hex") {
		if strings.HasSuffix(g.what, "body size 17") {
			if err := h.Decode(g.raw[7 : len(g.raw)-1]); err != nil {
				t.Fatal(err)
			}
			found = true
			break
		}
	}
	if !found {
		t.Fatal("no delivery of the message with headers in the capture")
	}
	p := h.Properties
	if p.ContentType != "application/json" || p.DeliveryMode != 2 || p.Priority != 5 ||
		p.MessageID != "msg-1" || p.Timestamp != 1700000001 || p.UserID != "guest" || p.AppID != "goldencap" {
		t.Errorf("properties = %+v", p)
	}
	want := map[string]any{
		"bool": true, "int8": int8(-8), "int16": int16(-16), "int32": int32(-32), "int64": int64(-64),
		"float32": float32(1.5), "float64": float64(-2.25), "decimal": Decimal{Scale: 2, Value: 12345},
		"string": "héllo", "bytes": []byte{0, 1, 2, 0xff}, "array": []any{int32(1), "two", true},
		"time": Timestamp(1700000000), "table": Table{{Key: "nested", Value: "yes"}}, "void": nil,
	}
	for key, w := range want {
		got, ok := p.Headers.Get(key)
		if !ok {
			t.Errorf("header %q missing", key)
			continue
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("header %q = %#v, want %#v", key, got, w)
		}
	}
}
