package integration

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestProxyPublishConsumeAck(t *testing.T) {
	url, _ := startProxy(t, node(t, "rabbit1"))
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	q, err := ch.QueueDeclare(queueName(t), false, true, false, false, nil)
	if err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 100))
	const n = 50
	for i := 0; i < n; i++ {
		err := ch.Publish("", q.Name, false, false, amqp.Publishing{
			Body:    []byte{byte(i)},
			Headers: amqp.Table{"i": int32(i)},
		})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	for i := 1; i <= n; i++ {
		select {
		case c := <-confirms:
			if !c.Ack || c.DeliveryTag != uint64(i) {
				t.Fatalf("confirm %d: got %+v", i, c)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no confirm %d", i)
		}
	}
	deliveries, err := ch.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	for i := 0; i < n; i++ {
		select {
		case d := <-deliveries:
			if d.Body[0] != byte(i) || d.Headers["i"] != int32(i) {
				t.Fatalf("delivery %d: body %v headers %v", i, d.Body, d.Headers)
			}
			if err := d.Ack(false); err != nil {
				t.Fatalf("ack: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no delivery %d", i)
		}
	}
}

// TestProxyCleanCloseReportsNoError: a client that closes its connection
// gets the close-ok before the proxy lets the socket go, so amqp091-go
// reports no error, as with the broker directly.
func TestProxyCleanCloseReportsNoError(t *testing.T) {
	url, _ := startProxy(t, node(t, "rabbit1"))
	for i := 0; i < 50; i++ {
		conn, err := amqp.Dial(url)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		if err := conn.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
		select {
		case err, ok := <-closed:
			if ok && err != nil {
				t.Fatalf("close %d: NotifyClose reported %v, want no error", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("close %d: NotifyClose not closed within 10s", i)
		}
	}
}

// TestProxyKeepsPublishesWholeOnFailingChannels: a client that keeps
// publishing to a missing exchange has publishes in flight when the backend
// closes the channel (404). The proxy must pass or drop each publish whole,
// method and content together, or the broker fails the whole connection with
// 505 UNEXPECTED_FRAME. (amqp091-go's issue 46 test, made heavier.)
func TestProxyKeepsPublishesWholeOnFailingChannels(t *testing.T) {
	url, _ := startProxy(t, node(t, "rabbit1"))
	conn := dialURL(t, url)
	for i := 0; i < 200; i++ {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("channel %d: %v", i, err)
		}
		for j := 0; j < 100 && !ch.IsClosed(); j++ {
			err := ch.Publish("missing-exchange", "key", false, false, amqp.Publishing{Body: []byte("data")})
			var amqpErr *amqp.Error
			if err != nil && (!errors.As(err, &amqpErr) || amqpErr.Code != amqp.ChannelError) {
				t.Fatalf("channel %d publish %d: %v, want nothing or 504 channel closed", i, j, err)
			}
		}
	}
	if conn.IsClosed() {
		t.Fatal("the connection was closed")
	}
}
