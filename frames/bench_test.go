package frames

import (
	"testing"
)

// loopReader replays the same bytes forever, so that a Reader can be
// benchmarked without a socket and without allocating.
type loopReader struct {
	data []byte
	off  int
}

func (l *loopReader) Read(p []byte) (int, error) {
	n := copy(p, l.data[l.off:])
	l.off = (l.off + n) % len(l.data)
	return n, nil
}

// benchMessage returns a method, the content header and a 1 KiB body as
// three encoded frames.
func benchMessage(b *testing.B, m Method) (method Method, header ContentHeader, body []byte, wire []byte) {
	b.Helper()
	header = ContentHeader{ClassID: 60, BodySize: 1024, Properties: Properties{
		Flags:        FlagContentType | FlagHeaders | FlagDeliveryMode | FlagMessageID | FlagTimestamp,
		ContentType:  "application/json",
		Headers:      Table{{Key: "x-mirror-id", Value: "node1-000042"}, {Key: "attempt", Value: int32(1)}},
		DeliveryMode: 2,
		MessageID:    "msg-42",
		Timestamp:    1700000000,
	}}
	body = make([]byte, 1024)
	var out loopWriter
	w := NewWriter(&out, 8192)
	if err := w.WriteMethod(1, m); err != nil {
		b.Fatal(err)
	}
	if err := w.WriteContentHeader(1, &header); err != nil {
		b.Fatal(err)
	}
	if err := w.WriteFrame(FrameBody, 1, body); err != nil {
		b.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	return m, header, body, out.data
}

type loopWriter struct{ data []byte }

func (l *loopWriter) Write(p []byte) (int, error) { l.data = append(l.data, p...); return len(p), nil }

// benchRead reads and decodes method + header + body per iteration into
// reused values, as a proxy's read loop would.
func benchRead(b *testing.B, sample Method, into Method) {
	_, _, _, wire := benchMessage(b, sample)
	r := NewReader(&loopReader{data: wire}, 64*1024)
	var header ContentHeader
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		f, err := r.ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		_, _, args, err := ParseMethodID(f.Payload)
		if err != nil {
			b.Fatal(err)
		}
		if err := into.Decode(args); err != nil {
			b.Fatal(err)
		}
		if f, err = r.ReadFrame(); err != nil {
			b.Fatal(err)
		}
		if err := header.Decode(f.Payload); err != nil {
			b.Fatal(err)
		}
		if f, err = r.ReadFrame(); err != nil || len(f.Payload) != int(header.BodySize) {
			b.Fatal(err)
		}
	}
}

// benchWrite encodes and writes method + header + body per iteration.
func benchWrite(b *testing.B, sample Method) {
	m, header, body, wire := benchMessage(b, sample)
	w := NewWriter(discard{}, 64*1024)
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		if err := w.WriteMethod(1, m); err != nil {
			b.Fatal(err)
		}
		if err := w.WriteContentHeader(1, &header); err != nil {
			b.Fatal(err)
		}
		if err := w.WriteFrame(FrameBody, 1, body); err != nil {
			b.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadPublish(b *testing.B) {
	benchRead(b, &BasicPublish{Exchange: "orders", RoutingKey: "orders.created", Mandatory: true}, &BasicPublish{})
}

func BenchmarkWritePublish(b *testing.B) {
	benchWrite(b, &BasicPublish{Exchange: "orders", RoutingKey: "orders.created", Mandatory: true})
}

func BenchmarkReadDeliver(b *testing.B) {
	benchRead(b, &BasicDeliver{ConsumerTag: "amq.ctag-Ahq0rYq1", DeliveryTag: 1 << 20, Exchange: "orders", RoutingKey: "orders.created"}, &BasicDeliver{})
}

func BenchmarkWriteDeliver(b *testing.B) {
	benchWrite(b, &BasicDeliver{ConsumerTag: "amq.ctag-Ahq0rYq1", DeliveryTag: 1 << 20, Exchange: "orders", RoutingKey: "orders.created"})
}

// BenchmarkReplaceHeaders is the proxy's message-identity step: swap the
// headers table of a content header without decoding anything else.
func BenchmarkReplaceHeaders(b *testing.B) {
	_, header, _, _ := benchMessage(b, &BasicPublish{})
	payload, _ := header.Append(nil)
	headers := Table{{Key: "x-mirror-id", Value: "node1-000043"}}
	dst := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = ReplaceHeaders(dst[:0], payload, headers); err != nil {
			b.Fatal(err)
		}
	}
}
