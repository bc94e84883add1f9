package integration

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// TestProxyMirroredChannelErrorInsidePublish: with mirroring, a publish to
// an exchange reaches every backend, and each closes the channel when the
// exchange does not exist. When the first close arrives while the client is
// between the frames of its next publish, the proxy's channel.close to the
// other backends must wait for that publish's last frame: a broker takes
// no other frame on a channel between a publish's method and its content,
// and closes the whole connection with 505 UNEXPECTED_FRAME (amqp091-go's
// TestRepeatedChannelExceptionWithPublishAndMaxProcsIssue46 did this through
// a mirrored proxy). The client hears of the close after that publish, and
// no link is lost.
func TestProxyMirroredChannelErrorInsidePublish(t *testing.T) {
	var warnings warningRecorder
	text := slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})
	p := startMirroredProxyWith(t, node(t, "rabbit1"), mirroredOptions{logger: slog.New(warnings.wrap(text))})
	client := dialRaw(t, strings.TrimSuffix(strings.TrimPrefix(p.url, "amqp://guest:guest@"), "/"))
	client.open(guest)

	exchange := uniqueName(t, "missing")
	body := []byte("inside a publish")
	send := rawSender(t, client)
	publish := func(withBody bool) {
		t.Helper()
		send("publish", func() error {
			if err := client.out.WriteMethod(1, &frames.BasicPublish{Exchange: exchange, RoutingKey: "key"}); err != nil {
				return err
			}
			header := &frames.ContentHeader{ClassID: frames.ClassBasic, BodySize: uint64(len(body))}
			if err := client.out.WriteContentHeader(1, header); err != nil {
				return err
			}
			if withBody {
				return client.out.WriteFrame(frames.FrameBody, 1, body)
			}
			return nil
		})
	}
	publish(true)  // every backend closes channel 1 for it
	publish(false) // its method and header; its body comes later

	// The backends close the channel within milliseconds of message 1. When
	// message 2's method reached a backend before its close did, the proxy's
	// close to the other backends, and so the client's notice, wait for its
	// body. When every backend's close came first (a loaded machine can be
	// that slow to read message 2), no backend is inside the publish and the
	// proxy may tell the client at once, as a broker would.
	closed, early := (*frames.ChannelClose)(nil), false
	if f, m, err := client.next(time.Second); !isTimeout(err) {
		if closed, early = m.(*frames.ChannelClose); !early || err != nil {
			t.Fatalf("inside message 2's content: got %s %v (err %v), want nothing until its body is sent, or the channel's close",
				frames.FrameTypeName(f.Type), m, err)
		}
		t.Log("every backend closed the channel before message 2 reached the proxy; the client heard at once")
	}
	send("message 2's body", func() error { return client.out.WriteFrame(frames.FrameBody, 1, body) })
	if !early {
		var err error
		if closed, err = expect[*frames.ChannelClose](client); err != nil {
			t.Fatalf("after message 2: %v", err)
		}
	}
	if closed.ReplyCode != frames.NotFound || !strings.Contains(closed.ReplyText, exchange) {
		t.Errorf("channel.close: got %d %q, want 404 for exchange %s", closed.ReplyCode, closed.ReplyText, exchange)
	}
	send("channel.close-ok", func() error { return client.out.WriteMethod(1, &frames.ChannelCloseOk{}) })
	send("channel.open", func() error { return client.out.WriteMethod(1, &frames.ChannelOpen{}) })
	if _, err := expect[*frames.ChannelOpenOk](client); err != nil {
		t.Fatalf("reopening channel 1: %v", err)
	}
	// An exchange declare reaches every backend and answers when all did.
	send("exchange.declare", func() error {
		return client.out.WriteMethod(1, &frames.ExchangeDeclare{Exchange: exchange, Type: "direct", AutoDelete: true})
	})
	if _, err := expect[*frames.ExchangeDeclareOk](client); err != nil {
		t.Fatalf("exchange.declare on the reopened channel: %v", err)
	}
	if lost := warnings.containing("backend link lost"); len(lost) > 0 {
		t.Errorf("links lost: got %q, want none", lost)
	}
}

func isTimeout(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// warningRecorder keeps the messages of the WARN and ERROR records that pass
// through the handlers it wraps, with their attributes.
type warningRecorder struct {
	mu       sync.Mutex
	messages []string
}

func (w *warningRecorder) wrap(h slog.Handler) slog.Handler {
	return recordingHandler{Handler: h, to: w}
}

// containing returns the recorded messages that contain s.
func (w *warningRecorder) containing(s string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, m := range w.messages {
		if strings.Contains(m, s) {
			out = append(out, m)
		}
	}
	return out
}

type recordingHandler struct {
	slog.Handler
	to    *warningRecorder
	attrs []slog.Attr
}

func (h recordingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		var b strings.Builder
		b.WriteString(r.Message)
		for _, a := range h.attrs {
			b.WriteString(" " + a.String())
		}
		r.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.String())
			return true
		})
		h.to.mu.Lock()
		h.to.messages = append(h.to.messages, b.String())
		h.to.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h recordingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return recordingHandler{Handler: h.Handler.WithAttrs(attrs), to: h.to, attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], attrs...)}
}

func (h recordingHandler) WithGroup(name string) slog.Handler {
	return recordingHandler{Handler: h.Handler.WithGroup(name), to: h.to, attrs: h.attrs}
}

// TestProxyMirroredChannelErrorOnEveryBackendOnce: a publish to a missing
// exchange reaches every backend, and all three close the channel at about
// the same time; the client must get one channel.close, as from one broker,
// and after its close-ok the connection goes on. Link loops that handled
// their closes at the same moment once each took the channel's close for
// the client: the client got two or three, and its second close-ok reached
// a broker that had freed the channel (504, the connection closed), as
// amqp091-go's TestRepeatedChannelExceptionWithPublishAndMaxProcsIssue46
// showed through a mirrored proxy. Repeated, since it is a race.
func TestProxyMirroredChannelErrorOnEveryBackendOnce(t *testing.T) {
	p := startMirroredProxyWith(t, node(t, "rabbit1"), mirroredOptions{
		logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	client := dialRaw(t, strings.TrimSuffix(strings.TrimPrefix(p.url, "amqp://guest:guest@"), "/"))
	client.open(guest) // channel 1
	exchange := uniqueName(t, "missing")
	send := rawSender(t, client)
	const channels = 200
	for id := uint16(1); id <= channels; id++ {
		if id > 1 {
			send("channel.open", func() error { return client.out.WriteMethod(id, &frames.ChannelOpen{}) })
			if _, err := expect[*frames.ChannelOpenOk](client); err != nil {
				t.Fatalf("channel %d: channel.open: %v", id, err)
			}
		}
		send("publish", func() error { return writePublishTo(client, id, exchange) })
		closed, err := expect[*frames.ChannelClose](client)
		if err != nil {
			t.Fatalf("channel %d: %v", id, err)
		}
		if closed.ReplyCode != frames.NotFound {
			t.Fatalf("channel %d: channel.close %d %q, want 404", id, closed.ReplyCode, closed.ReplyText)
		}
		send("channel.close-ok", func() error { return client.out.WriteMethod(id, &frames.ChannelCloseOk{}) })
	}
	// A second notice for the last channel would come before this answer.
	send("channel.open", func() error { return client.out.WriteMethod(channels+1, &frames.ChannelOpen{}) })
	if _, err := expect[*frames.ChannelOpenOk](client); err != nil {
		t.Fatalf("after %d channel errors: channel.open: %v", channels, err)
	}
}

// TestProxyMirroredClientCloseCrossesChannelErrors: the client closes a
// channel right behind a publish to a missing exchange, so every backend's
// channel error crosses the client's close. A broker answers a close with
// close-ok even while closing, so the client must get exactly one close-ok,
// as from one broker, and nothing more on the channel when it reopens it.
// The proxy once answered each broker's close at once and passed each
// broker's later close-ok on to the client: two or three close-oks, the last
// ones on the reopened channel.
func TestProxyMirroredClientCloseCrossesChannelErrors(t *testing.T) {
	p := startMirroredProxyWith(t, node(t, "rabbit1"), mirroredOptions{})
	client := dialRaw(t, strings.TrimSuffix(strings.TrimPrefix(p.url, "amqp://guest:guest@"), "/"))
	client.open(guest) // channel 1
	exchange := uniqueName(t, "missing")
	send := rawSender(t, client)
	const id, rounds = 2, 50
	for round := range rounds {
		send("channel.open", func() error { return client.out.WriteMethod(id, &frames.ChannelOpen{}) })
		if _, err := expect[*frames.ChannelOpenOk](client); err != nil {
			t.Fatalf("round %d: channel.open: %v", round, err)
		}
		send("publish and close", func() error {
			if err := writePublishTo(client, id, exchange); err != nil {
				return err
			}
			return client.out.WriteMethod(id, &frames.ChannelClose{ReplyCode: frames.ReplySuccess, ReplyText: "bye"})
		})
		if _, err := expect[*frames.ChannelCloseOk](client); err != nil {
			t.Fatalf("round %d: channel.close: %v", round, err)
		}
	}
	// A stray close-ok for the last round would come before this answer.
	send("channel.open", func() error { return client.out.WriteMethod(id+1, &frames.ChannelOpen{}) })
	if _, err := expect[*frames.ChannelOpenOk](client); err != nil {
		t.Fatalf("after %d crossed closes: channel.open: %v", rounds, err)
	}
}

// rawSender returns a function that runs write, which queues frames on the
// raw client, and flushes them, failing the test on an error.
func rawSender(t *testing.T, client *rawClient) func(what string, write func() error) {
	return func(what string, write func() error) {
		t.Helper()
		client.conn.SetWriteDeadline(time.Now().Add(rawTimeout))
		if err := write(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := client.out.Flush(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// writePublishTo queues a small publish to exchange on channel id.
func writePublishTo(client *rawClient, id uint16, exchange string) error {
	body := []byte("to no exchange")
	if err := client.out.WriteMethod(id, &frames.BasicPublish{Exchange: exchange}); err != nil {
		return err
	}
	if err := client.out.WriteContentHeader(id, &frames.ContentHeader{ClassID: frames.ClassBasic, BodySize: uint64(len(body))}); err != nil {
		return err
	}
	return client.out.WriteFrame(frames.FrameBody, id, body)
}
