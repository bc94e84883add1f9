package integration

// Conversations in raw bytes, run once directly against a RabbitMQ 3.10 node
// and once through the proxy in front of it: the proxy must answer bad input
// as the broker does, in the bytes it sends back, the connection.close it
// sends (or not), and how soon it closes the socket afterwards.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// wireResult is how a server answered one conversation.
type wireResult struct {
	transcript []byte                  // every byte it sent, from connect to close
	close      *frames.ConnectionClose // its connection.close, nil if it sent none
	// closedIn is the time from the client's last write (its close-ok, when
	// the server sent connection.close) to the end: the server closing the
	// socket, or its close-ok to the client's connection.close, after which
	// the client closes it, as the spec has it.
	closedIn time.Duration
	methods  []string // the methods it sent, in order
}

// atOnce is how soon a socket closed "at once" must close: below the
// proxy's CloseTimeout, which a proxy still waiting for something would use
// up, and above what a loaded machine takes (a proxy under -race at load 8
// took 2.97 s, the broker 0.9 s).
const atOnce = 4 * time.Second

func TestProxyWireAnswersLikeTheBroker(t *testing.T) {
	n := node(t, "rabbit1")
	const closeTimeout = 2 * atOnce // a proxy that waits for it is not "at once"
	p := serveProxy(t, n, func(o *proxy.Options) { o.CloseTimeout = closeTimeout })
	method := func(channel uint16, m frames.Method) []byte {
		return frame(frames.FrameMethod, channel, m.Append(nil), frames.FrameEnd)
	}
	undefined := func(channel, classID, methodID uint16) []byte {
		return frame(frames.FrameMethod, channel, []byte{byte(classID >> 8), byte(classID), byte(methodID >> 8), byte(methodID)}, frames.FrameEnd)
	}
	// A whole 0-9-1 session sent in one go, without waiting for the server.
	session := bytes.Join([][]byte{
		method(0, &frames.ConnectionStartOk{Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"}),
		method(0, &frames.ConnectionTuneOk{ChannelMax: 2047, FrameMax: frames.DefaultMaxFrameSize}),
		method(0, &frames.ConnectionOpen{VirtualHost: "/"}),
		method(1, &frames.ChannelOpen{}),
		method(0, &frames.ConnectionClose{ReplyCode: frames.ReplySuccess, ReplyText: "bye"}),
	}, nil)

	cases := []struct {
		name   string
		prefix fuzzPrefix // how far the client gets first (the raw client's steps)
		bytes  []byte     // then sent as they are
		// What the broker does, wanted of both: its connection.close code (0:
		// none, the socket just closes) and the methods it sends (nil: not
		// checked), and whether the proxy's bytes must be the broker's, byte
		// for byte (false where the close text is the proxy's own).
		wantCode    uint16
		wantMethods []string
		sameBytes   bool
		// brokerWaits: RabbitMQ keeps the socket about 3 s after the
		// close-ok (it stops reading frames after a bad frame-end); the
		// timing is then not compared.
		brokerWaits bool
		// silent: the client does not answer connection.close, so only
		// the bytes sent decide when the socket closes.
		silent bool
	}{
		{
			name: "legacy AMQP 0-9 header: served as 0-9-1", prefix: prefixNone,
			bytes: append([]byte("AMQP\x01\x01\x00\x09"), session...),
			wantMethods: []string{"connection.start", "connection.tune", "connection.open-ok",
				"channel.open-ok", "connection.close-ok"},
			sameBytes: true,
		},
		{name: "undefined method 999.999 on channel 1", prefix: prefixChannel, bytes: undefined(1, 999, 999), sameBytes: true},
		{name: "undefined basic method 60.99 on channel 1", prefix: prefixChannel, bytes: undefined(1, 60, 99), sameBytes: true},
		{name: "undefined class 100 on channel 1", prefix: prefixChannel, bytes: undefined(1, 100, 10), sameBytes: true},
		{name: "undefined method on a channel never opened", prefix: prefixChannel, bytes: undefined(5, 999, 1), sameBytes: true},
		{name: "undefined method 999.999 on channel 0", prefix: prefixOpen, bytes: undefined(0, 999, 999), sameBytes: true},
		{name: "undefined connection method 10.99 on channel 0", prefix: prefixOpen, bytes: undefined(0, 10, 99), sameBytes: true},
		{name: "undefined method instead of start-ok", prefix: prefixHeader, bytes: undefined(0, 999, 999), sameBytes: true},
		{
			name: "undefined method on channel 0 after the client's connection.close", prefix: prefixChannel,
			bytes:     append(method(0, &frames.ConnectionClose{ReplyCode: frames.ReplySuccess}), undefined(0, 999, 999)...),
			sameBytes: true,
		},
		{
			name: "undefined method on channel 0 instead of close-ok", prefix: prefixChannel,
			bytes:    append(frame(frames.FrameHeartbeat, 5, nil, frames.FrameEnd), undefined(0, 999, 999)...),
			wantCode: frames.UnexpectedFrame, silent: true,
		},
		{
			// A closing broker ignores what comes on the other channels.
			name: "undefined method on channel 1 before close-ok", prefix: prefixChannel,
			bytes:    append(frame(frames.FrameHeartbeat, 5, nil, frames.FrameEnd), undefined(1, 999, 999)...),
			wantCode: frames.UnexpectedFrame,
		},
		{
			// Deprecated in 0-9-1 and missing from the codec's spec, but
			// defined for RabbitMQ, which grants ticket 1: it must pass.
			name: "access.request, which RabbitMQ still answers", prefix: prefixChannel,
			bytes:       append(frame(frames.FrameMethod, 1, []byte{0, 30, 0, 10, 5, '/', 'd', 'a', 't', 'a', 0x1f}, frames.FrameEnd), method(0, &frames.ConnectionClose{ReplyCode: frames.ReplySuccess})...),
			wantMethods: []string{"connection.start", "connection.tune", "connection.open-ok", "channel.open-ok", "unknown(30,11)", "connection.close-ok"},
			sameBytes:   true,
		},
		{
			// The frame-end octet must be read with the heartbeat, or the
			// close-ok behind it is not seen and the proxy waits CloseTimeout.
			name: "heartbeat on channel 5, close-ok at once", prefix: prefixChannel,
			bytes: frame(frames.FrameHeartbeat, 5, nil, frames.FrameEnd), wantCode: frames.UnexpectedFrame,
		},
		{
			name: "heartbeat on channel 5 with frames behind it", prefix: prefixChannel,
			bytes:    append(frame(frames.FrameHeartbeat, 5, nil, frames.FrameEnd), method(1, &frames.BasicAck{DeliveryTag: 1})...),
			wantCode: frames.UnexpectedFrame,
		},
		{
			name: "unknown frame type with a payload", prefix: prefixChannel,
			bytes: frame(9, 1, []byte("payload of a frame type that does not exist"), frames.FrameEnd), wantCode: frames.FrameError,
		},
		{
			name: "heartbeat with a payload", prefix: prefixChannel,
			bytes: frame(frames.FrameHeartbeat, 0, []byte{1, 2, 3}, frames.FrameEnd), wantCode: frames.FrameError,
		},
		{
			// RabbitMQ checks the frame-end before the type: 501, not 505.
			name: "heartbeat on channel 1 with a bad frame-end", prefix: prefixChannel,
			bytes: frame(frames.FrameHeartbeat, 1, nil, 0), wantCode: frames.FrameError, brokerWaits: true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			results := map[string]wireResult{}
			for _, to := range directAndProxied(n, p) {
				r, err := converse(t, to.addr, c.prefix, c.bytes, !c.silent)
				if err != nil {
					t.Fatalf("%s: %v", to.name, err)
				}
				results[to.name] = r
				t.Logf("%s: methods %v, close %v, socket closed %v after the client's last write",
					to.name, r.methods, r.close, r.closedIn.Round(time.Millisecond))
			}
			direct, proxied := results["direct"], results["proxy"]
			checks := []check{
				{"broker's close code", closeCode(direct.close), c.wantCode},
				{"proxy's close code", closeCode(proxied.close), c.wantCode},
				{"proxy's close class and method", closeCause(proxied.close), closeCause(direct.close)},
			}
			if !c.brokerWaits {
				checks = append(checks,
					check{"broker closed the socket at once", direct.closedIn < atOnce, true},
					check{"proxy closed the socket at once", proxied.closedIn < atOnce, true})
			}
			if c.wantMethods != nil {
				checks = append(checks,
					check{"broker's methods", direct.methods, c.wantMethods},
					check{"proxy's methods", proxied.methods, c.wantMethods})
			}
			verify(t, checks)
			if c.sameBytes && !bytes.Equal(proxied.transcript, direct.transcript) {
				at := firstDifference(proxied.transcript, direct.transcript)
				t.Errorf("proxy's bytes differ from the broker's at offset %d of %d: from there got %q, want %q",
					at, len(direct.transcript), proxied.transcript[at:], direct.transcript[at:])
			}
		})
	}
	assertServes(t, p.url)
}

// converse runs one conversation against addr: the prefix's steps, then the
// bytes, then it reads until the server closes the socket or confirms the
// client's connection.close, answering a connection.close with close-ok as
// a client does when answerClose is set.
func converse(t *testing.T, addr string, prefix fuzzPrefix, input []byte, answerClose bool) (wireResult, error) {
	client := dialRaw(t, addr)
	var transcript bytes.Buffer
	client.in = frames.NewReader(io.TeeReader(client.conn, &transcript), 4096)
	var r wireResult
	if err := prefix.run(client); err != nil {
		return r, fmt.Errorf("%s: %w", prefix, err)
	}
	if err := client.write(input); err != nil {
		return r, fmt.Errorf("writing the input: %w", err)
	}
	lastWrite := time.Now()
	client.conn.SetReadDeadline(lastWrite.Add(rawTimeout))
	for {
		f, err := client.in.ReadFrame()
		if err != nil {
			r.closedIn = time.Since(lastWrite)
			r.transcript = transcript.Bytes()
			r.methods = methodsIn(r.transcript)
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
				return r, nil
			}
			return r, fmt.Errorf("reading the server's answer, %v after the client's last write (%q so far): %w", r.closedIn, r.transcript, err)
		}
		if f.Type != frames.FrameMethod || f.Channel != 0 {
			continue
		}
		m, err := frames.DecodeMethod(f.Payload)
		if err != nil {
			continue
		}
		switch m := m.(type) {
		case *frames.ConnectionClose:
			r.close = m
			if answerClose {
				client.sendMethod(0, &frames.ConnectionCloseOk{})
				lastWrite = time.Now()
			}
		case *frames.ConnectionCloseOk:
			r.closedIn = time.Since(lastWrite)
			r.transcript = transcript.Bytes()
			r.methods = methodsIn(r.transcript)
			return r, nil
		}
	}
}

// methodsIn names the method frames in a server's bytes, in order; it stops
// at the first thing that is not a whole frame.
func methodsIn(transcript []byte) []string {
	var names []string
	in := frames.NewReader(bytes.NewReader(transcript), 4096)
	for {
		f, err := in.ReadFrame()
		if err != nil {
			return names
		}
		if f.Type != frames.FrameMethod {
			continue
		}
		if classID, methodID, _, err := frames.ParseMethodID(f.Payload); err == nil {
			names = append(names, frames.MethodName(classID, methodID))
		}
	}
}

func firstDifference(a, b []byte) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

func closeCode(cl *frames.ConnectionClose) uint16 {
	if cl == nil {
		return 0
	}
	return cl.ReplyCode
}

func closeCause(cl *frames.ConnectionClose) [2]uint16 {
	if cl == nil {
		return [2]uint16{}
	}
	return [2]uint16{cl.ClassID, cl.MethodID}
}
