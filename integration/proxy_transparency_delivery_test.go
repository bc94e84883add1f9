package integration

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// Transparency scenarios about message contents, channels and acknowledgements;
// TestTransparency in proxy_transparency_test.go runs them.

// Message contents.

func observeMessageContents(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	frameMax := conn.Config.FrameSize
	random := rand.NewChaCha8([32]byte{'a', 'm', 'q', 'p'}) // the same bodies in every run
	randomBody := func(n int) []byte {
		b := make([]byte, n)
		random.Read(b)
		return b
	}
	messages := []amqp.Publishing{
		fullyDecorated(nil),
		{Body: nil},
		{Body: randomBody(frameMax - 8)}, // fills one body frame exactly
		{Body: randomBody(frameMax - 7)}, // one byte into a second frame
		{ContentType: "application/octet-stream", Body: randomBody(5 << 20)},
		fullyDecorated(randomBody(20 << 20)),
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	for _, m := range messages {
		publishTo(t, ch, queue, m)
	}
	for i, sent := range messages {
		d := receive(t, deliveries)
		got := describeProperties(deliveryProperties(d))
		if !bytes.Equal(d.Body, sent.Body) {
			t.Errorf("message %d: body of %d bytes differs from the %d sent", i, len(d.Body), len(sent.Body))
		}
		if want := describeProperties(sent); got != want {
			t.Errorf("message %d properties:\n got %s\nwant %s", i, got, want)
		}
		j.add("message %d: %d bytes, sha256 %x, %s", i, len(d.Body), sha256.Sum256(d.Body), got)
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
}

// fullyDecorated sets every property amqp091-go can send, with nested header tables.
func fullyDecorated(body []byte) amqp.Publishing {
	return amqp.Publishing{
		Headers: amqp.Table{
			"string": "text", "empty": "", "bool": true, "int16": int16(-3), "int32": int32(-70000),
			"int64": int64(1) << 40, "float32": float32(1.5), "float64": 2.25, "bytes": []byte{0, 1, 0xce},
			"decimal": amqp.Decimal{Scale: 2, Value: 12345}, "timestamp": time.Unix(1_700_000_000, 0), "void": nil,
			"array": []any{"a", int32(1), amqp.Table{"in": "array"}, []any{"nested", "array"}},
			"table": amqp.Table{"nested": amqp.Table{"deeper": amqp.Table{"deepest": "yes"}}},
		},
		ContentType:     "application/x-test",
		ContentEncoding: "identity",
		DeliveryMode:    amqp.Persistent,
		Priority:        7,
		CorrelationId:   "correlation",
		ReplyTo:         "reply-queue",
		Expiration:      "600000",
		MessageId:       "message",
		Timestamp:       time.Unix(1_700_000_000, 0),
		Type:            "test.type",
		UserId:          "guest", // RabbitMQ checks it against the connection's user
		AppId:           "amqp-mirror-tests",
		Body:            body,
	}
}

func deliveryProperties(d amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: d.DeliveryMode, Priority: d.Priority, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageId: d.MessageId, Timestamp: d.Timestamp,
		Type: d.Type, UserId: d.UserId, AppId: d.AppId,
	}
}

func describeProperties(p amqp.Publishing) string {
	headers := strings.Join(flattenTable("", p.Headers), "; ")
	p.Headers, p.Body = nil, nil
	return fmt.Sprintf("%+v headers {%s}", p, headers)
}

// Channels and acknowledgements.

func observeAllChannels(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)
	first := openChannel(t, conn)
	queue := declareSessionQueue(t, first, nil)
	channels := []*amqp.Channel{first}
	for len(channels) < int(conn.Config.ChannelMax) {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("channel %d: %v", len(channels)+1, err)
		}
		channels = append(channels, ch)
	}
	j.add("opened %d channels, channel_max %d", len(channels), conn.Config.ChannelMax)
	for i, ch := range channels {
		if err := ch.Publish("", queue, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "%d", i)}); err != nil {
			t.Fatalf("publish on channel %d: %v", i+1, err)
		}
	}
	var failed []error
	for _, ch := range channels[1:] {
		if err := ch.Close(); err != nil {
			failed = append(failed, err)
		}
	}
	j.add("closed %d channels, errors %v", len(channels)-1, failed)
	testutil.Eventually(t, 10*time.Second, func() error {
		if n := readyCount(t, first, queue); n != len(channels) {
			return fmt.Errorf("%d messages in the queue, want %d", n, len(channels))
		}
		return nil
	})
	j.add("every channel's message arrived")
	_, err := openChannel(t, conn).QueueDeclarePassive(queue, false, true, true, false, nil)
	j.add("a channel opened after closing them serves: %s", describeError(err))
}

func observeAcknowledgements(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	for i := 1; i <= 6; i++ {
		publishTo(t, ch, queue, amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)})
	}
	deliveries, err := ch.Consume(queue, "acker", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	record := func(n int) {
		for range n {
			d := receive(t, deliveries)
			j.add("delivered %q tag %d, redelivered %v", d.Body, d.DeliveryTag, d.Redelivered)
		}
	}
	record(6)
	j.add("ack 3 multiple: %s", describeError(ch.Ack(3, true)))
	j.add("nack 4 requeue: %s", describeError(ch.Nack(4, false, true)))
	record(1)
	j.add("reject 5 without requeue: %s", describeError(ch.Reject(5, false)))
	j.add("ack 0 multiple (everything outstanding): %s", describeError(ch.Ack(0, true)))
	j.add("%d ready", readyCount(t, ch, queue))

	publishTo(t, ch, queue, amqp.Publishing{Body: []byte("m7")})
	publishTo(t, ch, queue, amqp.Publishing{Body: []byte("m8")})
	record(2)
	j.add("nack 0 multiple requeue: %s", describeError(ch.Nack(0, true, true)))
	record(2)
	j.add("ack 11 multiple: %s", describeError(ch.Ack(11, true)))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	j.add("ack 11 twice: %s", describeError(ch.Ack(11, false)))
	j.add("channel closed with %s", describeError(awaitCloseNotice(t, closed)))
	j.add("%d ready after the channel closed", readyCount(t, openChannel(t, conn), queue))
}

// observeAcksOneByOne keeps enough deliveries outstanding for the proxy to compact its tag
// map while the client acks them in order.
func observeAcksOneByOne(t *testing.T, url string, j *journal) {
	const count = 40
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	for i := 1; i <= count; i++ {
		publishTo(t, ch, queue, amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)})
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	var outstanding []amqp.Delivery
	for range count {
		outstanding = append(outstanding, receive(t, deliveries))
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	for _, d := range outstanding {
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack %d: %v", d.DeliveryTag, err)
		}
	}
	// A synchronous round trip: any error the acks caused has closed the channel by now.
	_, err = ch.QueueDeclarePassive(queue, false, false, true, false, nil)
	j.add("acked tags 1 to %d one by one, then queue.declare: %s", count, describeError(err))
	recordChannelEnd(t, j, conn, ch, closed, queue)
}

func observeMixedConsumers(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	automatic, manual := declareSessionQueue(t, ch, nil), declareSessionQueue(t, ch, nil)
	publishThree := func(queue, prefix string) {
		for i := 1; i <= 3; i++ {
			publishTo(t, ch, queue, amqp.Publishing{Body: fmt.Appendf(nil, "%s%d", prefix, i)})
		}
	}
	publishThree(automatic, "auto")
	autoDeliveries, err := ch.Consume(automatic, "auto-ack", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume no-ack: %v", err)
	}
	for range 3 { // first alone, so that the tags are the same in every run
		d := receive(t, autoDeliveries)
		j.add("no-ack consumer got %q tag %d", d.Body, d.DeliveryTag)
	}
	publishThree(manual, "manual")
	manualDeliveries, err := ch.Consume(manual, "manual-ack", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume with acks: %v", err)
	}
	for range 3 {
		d := receive(t, manualDeliveries)
		j.add("acking consumer got %q tag %d, ack: %s", d.Body, d.DeliveryTag, describeError(d.Ack(false)))
	}
	// Both consumers at once: the interleaving is the broker's, so only the sets are compared.
	publishThree(automatic, "auto")
	publishThree(manual, "manual")
	var autoBodies, manualBodies []string
	var tags []uint64
	for len(autoBodies)+len(manualBodies) < 6 {
		select {
		case d := <-autoDeliveries:
			autoBodies, tags = append(autoBodies, string(d.Body)), append(tags, d.DeliveryTag)
		case d := <-manualDeliveries:
			manualBodies, tags = append(manualBodies, string(d.Body)), append(tags, d.DeliveryTag)
			if err := d.Ack(false); err != nil {
				t.Fatalf("ack: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("deliveries stopped")
		}
	}
	slices.Sort(tags)
	j.add("concurrently: no-ack got %v, acking got %v, tags %v", autoBodies, manualBodies, tags)
	j.add("ready: %d and %d", readyCount(t, ch, automatic), readyCount(t, ch, manual))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	j.add("ack of a no-ack delivery (tag 2): %s", describeError(ch.Ack(2, false)))
	j.add("channel closed with %s", describeError(awaitCloseNotice(t, closed)))
	observer := openChannel(t, conn)
	j.add("ready after the channel closed: %d and %d", readyCount(t, observer, automatic), readyCount(t, observer, manual))
}
