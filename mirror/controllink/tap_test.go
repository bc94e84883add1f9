package controllink

import (
	"bytes"
	"math/rand/v2"
	"net"
	"reflect"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// tapStream builds a broker's byte stream frame by frame, and what a tap
// registered for some consumers must pass on of it.
type tapStream struct {
	t         *testing.T
	all, pass bytes.Buffer
}

func (s *tapStream) frame(typ uint8, channel uint16, payload []byte, passes bool) {
	s.t.Helper()
	var b bytes.Buffer
	w := frames.NewWriter(&b, 0)
	if err := w.WriteFrame(typ, channel, payload); err != nil {
		s.t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		s.t.Fatal(err)
	}
	s.all.Write(b.Bytes())
	if passes {
		s.pass.Write(b.Bytes())
	}
}

func (s *tapStream) method(channel uint16, m frames.Method, passes bool) {
	s.t.Helper()
	s.frame(frames.FrameMethod, channel, m.Append(nil), passes)
}

// deliver adds a delivery to consumer tag on channel: its method, content
// header and body, cut into body frames of at most frameBody bytes.
func (s *tapStream) deliver(channel uint16, tag string, deliveryTag uint64, props frames.Properties, body []byte, frameBody int, passes bool) {
	s.t.Helper()
	s.method(channel, &frames.BasicDeliver{ConsumerTag: tag, DeliveryTag: deliveryTag, Exchange: "", RoutingKey: "q"}, passes)
	header, err := (&frames.ContentHeader{ClassID: 60, BodySize: uint64(len(body)), Properties: props}).Append(nil)
	if err != nil {
		s.t.Fatal(err)
	}
	s.frame(frames.FrameHeader, channel, header, passes)
	for len(body) > 0 {
		n := min(len(body), frameBody)
		s.frame(frames.FrameBody, channel, body[:n], passes)
		body = body[n:]
	}
}

// identified are the properties of a message the proxy published: its
// headers table ends with the identity.
func identified(n int, more ...frames.Field) frames.Properties {
	id := messageID(n)
	fields := append(frames.Table{{Key: "app", Value: "orders"}}, more...)
	fields = append(fields, frames.Field{Key: mirror.IdentityHeader, Value: string(id[:])})
	return frames.Properties{Flags: frames.FlagHeaders | frames.FlagDeliveryMode, Headers: fields, DeliveryMode: 2}
}

// TestTapTakesRegisteredDeliveries: the deliveries of registered consumer
// tags leave the stream whole, each read as the trimmer reads it, however
// the stream is cut into reads; every other frame passes unchanged and in
// order.
func TestTapTakesRegisteredDeliveries(t *testing.T) {
	var tap Tap
	tag, sink := tap.register("amqp-mirror-trimmer")
	otherTag, otherSink := tap.register("amqp-mirror-trimmer")

	s := &tapStream{t: t}
	s.frame(frames.FrameHeartbeat, 0, nil, true)
	s.method(1, &frames.BasicConsumeOk{ConsumerTag: tag}, true)
	s.deliver(1, tag, 1, identified(1), []byte("one"), 4096, false)
	s.deliver(2, "amq.ctag-client", 1, identified(2), []byte("not ours"), 4096, true)
	noID := []byte("a body without identity, in three frames")
	s.deliver(1, tag, 2, frames.Properties{Flags: frames.FlagContentType, ContentType: "text/plain"}, noID, 16, false)
	s.deliver(1, tag, 3, identified(3), nil, 4096, false)
	expiring := identified(4)
	expiring.Flags |= frames.FlagExpiration
	expiring.Expiration = "60000"
	s.deliver(1, tag, 4, expiring, bytes.Repeat([]byte{'x'}, 10_000), 4096, false)
	marked := identified(5, frames.Field{Key: SyncMarkerHeader, Value: true})
	s.deliver(1, tag, 5, marked, nil, 4096, false)
	// The identity elsewhere in the table, as a broker that reorders
	// headers leaves it.
	moved := identified(6)
	moved.Headers = append(frames.Table{moved.Headers[1]}, moved.Headers[0])
	s.deliver(1, tag, 6, moved, []byte("six"), 4096, false)
	s.deliver(3, otherTag, 9, identified(9), []byte("other"), 4096, false)
	s.method(1, &frames.BasicCancelOk{ConsumerTag: tag}, true)
	s.method(0, &frames.ConnectionCloseOk{}, true)

	want := []delivery{
		{tag: 1, id: messageID(1), identified: true},
		{tag: 2, body: noID},
		{tag: 3, id: messageID(3), identified: true},
		{tag: 4, id: messageID(4), identified: true, expiration: "60000"},
		{tag: 5, id: messageID(5), identified: true, marker: true},
		{tag: 6, id: messageID(6), identified: true},
	}
	for _, cut := range []int{0, 1, 2, 7, 100} {
		tap := Tap{}
		tap.sinks = map[string]*deliverySink{tag: sink, otherTag: otherSink}
		tap.active.Store(2)
		sink.take(nil)
		otherSink.take(nil)
		in := s.all.Bytes()
		var out []byte
		for len(in) > 0 {
			n := len(in)
			if cut > 0 {
				n = min(n, 1+rand.IntN(cut))
			}
			out = tap.process(in[:n], out)
			in = in[n:]
		}
		if !bytes.Equal(out, s.pass.Bytes()) {
			t.Errorf("reads of up to %d bytes: passed %d bytes, want the %d of the frames not taken", cut, len(out), s.pass.Len())
		}
		got := sink.take(nil)
		for i := range got {
			if got[i].body != nil && len(got[i].body) == 0 {
				got[i].body = nil
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("reads of up to %d bytes: the sink got\n%+v\nwant\n%+v", cut, got, want)
		}
		if other := otherSink.take(nil); len(other) != 1 || other[0].tag != 9 || other[0].id != messageID(9) {
			t.Errorf("reads of up to %d bytes: the other consumer's sink got %+v, want delivery 9", cut, other)
		}
	}
}

// TestTapWakesASinkOncePerRead: a sink's trimmer is woken once for all
// the deliveries one read brings, and not by a read that completes none.
func TestTapWakesASinkOncePerRead(t *testing.T) {
	var tap Tap
	tag, sink := tap.register("amqp-mirror-trimmer")
	_, idle := tap.register("amqp-mirror-trimmer")
	s := &tapStream{t: t}
	for n := 1; n <= 3; n++ {
		s.deliver(1, tag, uint64(n), identified(n), []byte("body"), 4096, false)
	}
	stream := s.all.Bytes()
	woken := func(sink *deliverySink) bool {
		select {
		case <-sink.ready():
			return true
		default:
			return false
		}
	}

	tap.process(stream, nil)
	if !woken(sink) || woken(sink) {
		t.Error("a read of three deliveries did not wake their sink exactly once")
	}
	if got := len(sink.take(nil)); got != 3 {
		t.Errorf("the sink holds %d deliveries, want 3", got)
	}
	if woken(idle) {
		t.Error("a sink that got nothing was woken")
	}

	const partOfTheFirst = 10 // bytes of its basic.deliver frame
	tap.process(stream[:partOfTheFirst], nil)
	if woken(sink) {
		t.Error("a read that completed no delivery of the sink woke it")
	}
	tap.process(stream[partOfTheFirst:], nil)
	if !woken(sink) {
		t.Error("the read that completed deliveries did not wake their sink")
	}
}

// TestTapPassesWhatItCannotFollow: a stream that loses its frame
// boundaries, and one with no registered consumer, pass unchanged, for
// amqp091-go to judge.
func TestTapPassesWhatItCannotFollow(t *testing.T) {
	s := &tapStream{t: t}
	s.method(1, &frames.BasicDeliver{ConsumerTag: "amqp-mirror-trimmer.1", DeliveryTag: 1}, true)
	broken := bytes.Clone(s.all.Bytes())
	broken[len(broken)-1] = 0 // not the frame-end octet
	broken = append(broken, 1, 2, 3)
	tests := []struct {
		name     string
		register bool
		in       []byte
	}{
		{"the protocol header a broker sends to refuse the version", true, []byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1}},
		{"a frame without its frame-end octet", true, broken},
		{"no registered consumer", false, s.all.Bytes()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tap Tap
			if tt.register {
				tap.register("amqp-mirror-trimmer") // the tag the stream's deliver names
			}
			out := tap.process(tt.in, nil)
			if !bytes.Equal(out, tt.in) {
				t.Errorf("passed %q, want %q", out, tt.in)
			}
		})
	}
}

// FuzzTap: whatever a broker sends, the tap does not panic; with no
// consumer registered it passes the stream unchanged but for the frame it
// has not read whole (a header, or a small channel-0 method it holds to
// see whether it is connection.close), and with one registered it passes
// at most what it read.
func FuzzTap(f *testing.F) {
	s := &tapStream{t: &testing.T{}}
	s.method(1, &frames.BasicConsumeOk{ConsumerTag: "amqp-mirror-trimmer.1"}, true)
	s.deliver(1, "amqp-mirror-trimmer.1", 1, identified(1), []byte("body"), 2, false)
	s.frame(frames.FrameHeartbeat, 0, nil, true)
	f.Add(s.all.Bytes(), uint8(3))
	f.Add([]byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1}, uint8(0))
	f.Fuzz(func(t *testing.T, stream []byte, cut uint8) {
		var idle, taking Tap
		taking.register("amqp-mirror-trimmer")
		var passed, took []byte
		for in := stream; len(in) > 0; {
			n := len(in)
			if cut > 0 {
				n = min(n, int(cut))
			}
			passed = idle.process(in[:n], passed)
			took = taking.process(in[:n], took)
			in = in[n:]
		}
		if !bytes.HasPrefix(stream, passed) || len(stream)-len(passed) > 7+maxClosePayload {
			t.Fatalf("with no consumer registered the tap passed %x of %x", passed, stream)
		}
		if len(took) > len(stream) {
			t.Fatalf("the tap passed %d bytes of %d", len(took), len(stream))
		}
	})
}

// TestObservedConnHeartbeatForTakenFrames: a read whose frames the tap
// all took gives amqp091-go a heartbeat, so that a connection carrying
// only a trimmer's deliveries does not look silent to it; what passes
// comes through unchanged.
func TestObservedConnHeartbeatForTakenFrames(t *testing.T) {
	broker, client := net.Pipe()
	defer broker.Close()
	c := observe(client)
	defer c.Close()
	tag, sink := c.tap.register("amqp-mirror-trimmer")

	taken := &tapStream{t: t}
	taken.deliver(1, tag, 1, identified(1), []byte("one"), 4096, false)
	passed := &tapStream{t: t}
	passed.method(1, &frames.BasicCancelOk{ConsumerTag: tag}, true)
	go func() {
		broker.Write(taken.all.Bytes())
		broker.Write(passed.all.Bytes())
	}()

	want := append(bytes.Clone(heartbeatFrame), passed.pass.Bytes()...)
	got := make([]byte, 0, len(want))
	buf := make([]byte, 4096)
	for len(got) < len(want) {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("read %x, want a heartbeat then the cancel-ok, %x", got, want)
	}
	if d := sink.take(nil); len(d) != 1 || d[0].id != messageID(1) {
		t.Errorf("the sink got %+v, want delivery 1", d)
	}
}
