package integration

import (
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// systemPython is Debian's interpreter, which sees the python3-pika package; a python3
// earlier on PATH (pyenv...) may not.
const systemPython = "/usr/bin/python3"

func dial(t testing.TB, n *localbroker.Node) *amqp.Connection {
	t.Helper()
	connection, err := amqp.Dial(n.URL())
	if err != nil {
		t.Fatalf("dial %s at %s: %v", n.Name, n.URL(), err)
	}
	t.Cleanup(func() { connection.Close() })
	return connection
}

func openChannel(t testing.TB, connection *amqp.Connection) *amqp.Channel {
	t.Helper()
	channel, err := connection.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	return channel
}

// queueName is unique per test and per run, so that tests and reruns never share a queue.
func queueName(t testing.TB) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
}

// receive waits for one delivery.
func receive(t testing.TB, deliveries <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case delivery, ok := <-deliveries:
		if !ok {
			t.Fatal("delivery channel closed")
		}
		return delivery
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10s")
	}
	return amqp.Delivery{}
}

type check struct {
	name      string
	got, want any
}

func verify(t testing.TB, checks []check) {
	t.Helper()
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %#v, want %#v", c.name, c.got, c.want)
		}
	}
}

func TestAmqp091PublishConfirmConsumeAck(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 30*time.Second)
	channel := openChannel(t, dial(t, node(t, "rabbit1")))
	queue, err := channel.QueueDeclare(queueName(t), false, true, false, false, nil)
	if err != nil {
		t.Fatalf("declare queue: %v", err)
	}
	if err := channel.Confirm(false); err != nil {
		t.Fatalf("enable confirms: %v", err)
	}
	confirms := channel.NotifyPublish(make(chan amqp.Confirmation, 1))

	timestamp := time.Unix(1_700_000_000, 0)
	sent := amqp.Publishing{
		ContentType:   "application/json",
		DeliveryMode:  amqp.Persistent,
		CorrelationId: "correlation-1",
		MessageId:     "message-1",
		Timestamp:     timestamp,
		Headers:       amqp.Table{"attempt": int32(1), "source": "amqp091-go"},
		Body:          []byte(`{"hello":"broker"}`),
	}
	if err := channel.PublishWithContext(ctx, "", queue.Name, true, false, sent); err != nil {
		t.Fatalf("publish: %v", err)
	}
	select {
	case confirmation := <-confirms:
		if !confirmation.Ack || confirmation.DeliveryTag != 1 {
			t.Fatalf("confirmation: got %+v, want ack of delivery tag 1", confirmation)
		}
	case <-ctx.Done():
		t.Fatal("no publisher confirm")
	}

	deliveries, err := channel.ConsumeWithContext(ctx, queue.Name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	delivery := receive(t, deliveries)
	verify(t, []check{
		{"body", string(delivery.Body), string(sent.Body)},
		{"content type", delivery.ContentType, sent.ContentType},
		{"delivery mode", delivery.DeliveryMode, sent.DeliveryMode},
		{"correlation id", delivery.CorrelationId, sent.CorrelationId},
		{"message id", delivery.MessageId, sent.MessageId},
		{"timestamp", delivery.Timestamp.Unix(), timestamp.Unix()},
		{"headers", delivery.Headers, sent.Headers},
		{"redelivered", delivery.Redelivered, false},
	})
	if err := delivery.Ack(false); err != nil {
		t.Fatalf("ack: %v", err)
	}
	// A second channel sees the queue empty once the ack has been processed.
	observer := openChannel(t, dial(t, node(t, "rabbit1")))
	testutil.Eventually(t, 5*time.Second, func() error {
		inspected, err := observer.QueueDeclarePassive(queue.Name, false, true, false, false, nil)
		if err != nil {
			return err
		}
		if inspected.Messages != 0 {
			return fmt.Errorf("queue holds %d messages after the ack, want 0", inspected.Messages)
		}
		return nil
	})
}

func TestPikaPublishesAmqp091Consumes(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(systemPython); err != nil {
		t.Fatalf("%s not found: apt-get install -y python3-pika", systemPython)
	}
	const count = 3
	n := node(t, "rabbit2")
	queue := queueName(t)
	ctx := testContext(t, 30*time.Second)
	output, err := exec.CommandContext(ctx, systemPython, "testdata/pika_publish.py", n.URL(), queue, fmt.Sprint(count)).CombinedOutput()
	if err != nil {
		t.Fatalf("pika publisher: %v\n%s(python3-pika missing? apt-get install -y python3-pika)", err, output)
	}

	channel := openChannel(t, dial(t, n))
	t.Cleanup(func() { channel.QueueDelete(queue, false, false, false) })
	deliveries, err := channel.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	for i := range count {
		delivery := receive(t, deliveries)
		verify(t, []check{
			{fmt.Sprintf("message %d body", i), string(delivery.Body), fmt.Sprintf("pika %d", i)},
			{fmt.Sprintf("message %d id", i), delivery.MessageId, fmt.Sprint(i)},
			{fmt.Sprintf("message %d content type", i), delivery.ContentType, "text/plain"},
			{fmt.Sprintf("message %d delivery mode", i), delivery.DeliveryMode, amqp.Persistent},
			{fmt.Sprintf("message %d headers", i), delivery.Headers, amqp.Table{"client": "pika"}},
		})
		if err := delivery.Ack(false); err != nil {
			t.Fatalf("ack message %d: %v", i, err)
		}
	}
}
