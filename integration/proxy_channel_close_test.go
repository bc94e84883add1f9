package integration

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// TestProxyClosesChannelsBetweenDeliveries: when the proxy itself closes a
// channel (here for an unknown delivery tag) while deliveries stream to the
// client, its channel.close reaches the client between two whole messages,
// never between a delivery's method and its content, and only once the
// backend has closed its side, so that the client can reuse the channel id at
// once; the connection stays usable.
func TestProxyClosesChannelsBetweenDeliveries(t *testing.T) {
	p := serveProxy(t, node(t, "rabbit1"))
	queue := queueName(t)
	fill := openChannel(t, dialURL(t, p.url))
	if _, err := fill.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	body := make([]byte, 20000) // several body frames with a small frame_max
	for i := 0; i < 2000; i++ {
		if err := fill.Publish("", queue, false, false, amqp.Publishing{Body: body}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}

	client := dialRaw(t, p.addr)
	client.open(login{user: "guest", password: "guest", vhost: "/", frameMax: 4096}) // and channel 1
	send := func(m frames.Method) {
		t.Helper()
		if err := client.sendMethod(1, m); err != nil {
			t.Fatalf("send %s: %v", m.Name(), err)
		}
	}
	send(&frames.BasicConsume{Queue: queue})

	var (
		deliveries   int
		contentLeft  uint64 // body bytes still owed to the current delivery
		inContent    bool   // a content-bearing method came, its header not yet
		channelClose *frames.ChannelClose
	)
	for channelClose == nil {
		f, m, err := client.next(rawTimeout)
		if err != nil {
			t.Fatalf("after %d deliveries: %v", deliveries, err)
		}
		if f.Channel != 1 {
			continue
		}
		switch {
		case f.Type == frames.FrameHeader:
			if !inContent {
				t.Fatalf("a content header with no method before it")
			}
			size, err := frames.HeaderBodySize(f.Payload)
			if err != nil {
				t.Fatal(err)
			}
			inContent, contentLeft = false, size
		case f.Type == frames.FrameBody:
			if inContent || uint64(len(f.Payload)) > contentLeft {
				t.Fatalf("a body frame outside a message")
			}
			contentLeft -= uint64(len(f.Payload))
		case f.Type == frames.FrameMethod:
			if inContent || contentLeft > 0 {
				t.Fatalf("%s arrived inside delivery %d's content", m.Name(), deliveries)
			}
			switch m := m.(type) {
			case *frames.BasicDeliver:
				deliveries++
				inContent = true
				if deliveries == 10 { // an ack the broker never delivered
					send(&frames.BasicAck{DeliveryTag: 1 << 40})
				}
			case *frames.ChannelClose:
				channelClose = m
			}
		}
	}
	want := fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", uint64(1)<<40)
	if channelClose.ReplyCode != frames.PreconditionFailed || channelClose.ReplyText != want {
		t.Errorf("channel.close: got %d %q, want 406 %q", channelClose.ReplyCode, channelClose.ReplyText, want)
	}
	send(&frames.ChannelCloseOk{})
	// The channel id is free again and the connection serves.
	send(&frames.ChannelOpen{})
	if _, err := expect[*frames.ChannelOpenOk](client); err != nil {
		t.Fatalf("reopening channel 1: %v", err)
	}
	t.Logf("channel closed after %d deliveries", deliveries)
}
