package integration

// Acceptance tests of mirrored queues (issue 7): what clients see of them. One channel
// acking across two masters, message properties through amqp091-go and pika, priority
// queues and dead-lettering.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestMirrorMultipleAckAcrossMasters: one channel consumes two mirrored queues whose masters
// are on different backends; an ack with multiple=true settles exactly the messages up to
// its tag, on each queue's master and slaves.
func TestMirrorMultipleAckAcrossMasters(t *testing.T) {
	t.Parallel()
	const each = 10
	prefix := queueName(t)
	queues := []string{prefix + "-a", prefix + "-b"}
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	setPolicy(t, p, "multiple-ack", exactly(queues...), `{"ha-mode":"all"}`)
	conn := dialURL(t, p.url("guest", "guest"))
	// min-masters puts the second master on a backend the first is not on.
	locator := amqp.Table{"x-queue-master-locator": "min-masters"}
	for _, q := range queues {
		declareMirrored(t, p, conn, q, true, locator)
		publishConfirmed(t, conn, q, each, func(i int) amqp.Publishing {
			return amqp.Publishing{Body: fmt.Appendf(nil, "%s %d", q, i)}
		})
	}
	rows, err := listQueues(t, p)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := rows[queues[0]], rows[queues[1]]; a.Master == "" || a.Master == b.Master {
		t.Fatalf("ctl list_queues: %v and %v; want the masters on two backends (x-queue-master-locator min-masters)", a, b)
	}
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queues[0]: onEvery(each, backends...), queues[1]: onEvery(each, backends...)})

	ch := openChannel(t, conn)
	var streams []<-chan amqp.Delivery
	for _, q := range queues {
		deliveries, err := ch.Consume(q, q, false, false, false, false, nil)
		if err != nil {
			t.Fatalf("basic.consume %s: %v", q, err)
		}
		streams = append(streams, deliveries)
	}
	type delivered struct {
		queue int // index in queues
		index int // from the body
		tag   uint64
	}
	var got []delivered
	timeout := time.After(30 * time.Second)
	for len(got) < 2*each {
		select {
		case d := <-streams[0]:
			got = append(got, delivered{0, bodyIndex(t, d.Body), d.DeliveryTag})
		case d := <-streams[1]:
			got = append(got, delivered{1, bodyIndex(t, d.Body), d.DeliveryTag})
		case <-timeout:
			t.Fatalf("%d of %d deliveries within 30s", len(got), 2*each)
		}
	}
	sort.Slice(got, func(i, j int) bool { return got[i].tag < got[j].tag })
	for i, d := range got {
		if d.tag != uint64(i+1) {
			t.Fatalf("delivery tags %v: want 1..%d on the channel", got, 2*each)
		}
	}

	// The smallest tag at or below which at least half of each queue's messages lie: the
	// ack then settles some messages of both queues, whatever order they came in.
	var upTo uint64
	var settled [2]int
	for _, d := range got {
		settled[d.queue]++
		if settled[0] >= each/2 && settled[1] >= each/2 {
			upTo = d.tag
			break
		}
	}
	if err := ch.Ack(upTo, true); err != nil {
		t.Fatalf("basic.ack %d multiple: %v", upTo, err)
	}
	// A master counts its unacknowledged messages too, so each copy holds each-settled.
	awaitHeld(t, 30*time.Second, map[string]map[string]int{
		queues[0]: onEvery(each-settled[0], backends...),
		queues[1]: onEvery(each-settled[1], backends...),
	})

	// Exactly the messages after the tag come back once the channel is gone.
	if err := ch.Close(); err != nil {
		t.Fatalf("channel.close: %v", err)
	}
	for qi, q := range queues {
		var want []int
		for _, d := range got {
			if d.queue == qi && d.tag > upTo {
				want = append(want, d.index)
			}
		}
		var redelivered []int
		for _, d := range consumeAcked(t, conn, q, len(want)) {
			redelivered = append(redelivered, bodyIndex(t, d.Body))
		}
		slices.Sort(want)
		slices.Sort(redelivered)
		if !slices.Equal(redelivered, want) {
			t.Errorf("%s after basic.ack %d multiple and channel.close: got messages %v again, want %v", q, upTo, redelivered, want)
		}
	}
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queues[0]: onEvery(0, backends...), queues[1]: onEvery(0, backends...)})
}

// TestMirrorPropertiesUnchanged: consumers of a mirrored queue receive exactly the properties
// and body that were published, whatever the proxy added to find a message's copies; a
// message published without headers arrives without a headers table.
func TestMirrorPropertiesUnchanged(t *testing.T) {
	t.Parallel()
	withHeaders := fullyDecorated([]byte("with headers"))
	withoutHeaders := fullyDecorated([]byte("without headers"))
	withoutHeaders.Headers = nil
	sent := []amqp.Publishing{withHeaders, withoutHeaders}
	publish := func(t *testing.T, conn *amqp.Connection, queue string) {
		publishConfirmed(t, conn, queue, len(sent), func(i int) amqp.Publishing { return sent[i] })
	}

	p := startMirrorProxy(t, "")
	prefix := queueName(t)
	setPolicy(t, p, "properties", "^"+prefix, `{"ha-mode":"all"}`)
	conn := dialURL(t, p.url("guest", "guest"))

	t.Run("amqp091-go", func(t *testing.T) {
		queue := prefix + "-amqp091"
		declareMirrored(t, p, conn, queue, false, nil)
		publish(t, conn, queue)
		awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(len(sent), mirrorBackends()...)})
		for i, d := range consumeAcked(t, conn, queue, len(sent)) {
			if got, want := describeProperties(deliveryProperties(d)), describeProperties(sent[i]); got != want {
				t.Errorf("message %d properties:\n got %s\nwant %s", i, got, want)
			}
			if !bytes.Equal(d.Body, sent[i].Body) {
				t.Errorf("message %d: got body %q, want %q", i, d.Body, sent[i].Body)
			}
			if (d.Headers == nil) != (sent[i].Headers == nil) {
				t.Errorf("message %d: got headers %#v, published %#v (nil: no headers table at all)", i, d.Headers, sent[i].Headers)
			}
		}
	})

	t.Run("pika", func(t *testing.T) {
		// pika's view of the messages consumed from a broker directly is the reference.
		directQueue := queueName(t)
		direct := dial(t, node(t, "rabbit1"))
		t.Cleanup(func() { deleteQueue(direct, directQueue) })
		if _, err := openChannel(t, direct).QueueDeclare(directQueue, false, true, false, false, nil); err != nil {
			t.Fatalf("queue.declare on rabbit1 directly: %v", err)
		}
		publish(t, direct, directQueue)
		want := pikaConsume(t, node(t, "rabbit1").URL(), directQueue, len(sent))

		queue := prefix + "-pika"
		declareMirrored(t, p, conn, queue, false, nil)
		publish(t, conn, queue)
		awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(len(sent), mirrorBackends()...)})
		got := pikaConsume(t, p.url("guest", "guest"), queue, len(sent))
		if len(got) != len(want) {
			t.Fatalf("pika consumed %d messages through the proxy, %d directly", len(got), len(want))
		}
		for i := range got {
			if string(got[i]) != string(want[i]) {
				t.Errorf("message %d as pika saw it:\nthrough the proxy %s\ndirectly          %s", i, got[i], want[i])
			}
		}
		var second struct {
			Properties struct{ Headers map[string]any } `json:"properties"`
		}
		if err := json.Unmarshal(got[1], &second); err != nil || second.Properties.Headers["NoneType"] != "None" {
			t.Errorf("message published without headers: pika saw headers %v (%v), want None", second.Properties.Headers, err)
		}
	})
}

// pikaConsumeScript consumes COUNT messages from QUEUE at URL with pika and manual acks and
// prints them as a JSON array: body in hex and every property, each value as its Python type
// and repr, tables with their keys sorted (the wire order of a table is the publisher's
// map order, which is random in Go).
const pikaConsumeScript = `
import json, sys
import pika

NAMES = ["content_type", "content_encoding", "headers", "delivery_mode", "priority",
         "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
         "user_id", "app_id", "cluster_id"]

def describe(v):
    if isinstance(v, dict):
        return {"table": [[k, describe(v[k])] for k in sorted(v)]}
    if isinstance(v, list):
        return {"array": [describe(x) for x in v]}
    return {type(v).__name__: repr(v)}

url, queue, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
connection = pika.BlockingConnection(pika.URLParameters(url))
channel = connection.channel()
seen = []
for method, properties, body in channel.consume(queue, inactivity_timeout=20):
    if method is None:
        break
    seen.append({"body": body.hex(),
                 "properties": {name: describe(getattr(properties, name)) for name in NAMES}})
    channel.basic_ack(method.delivery_tag)
    if len(seen) == count:
        break
channel.cancel()
connection.close()
print(json.dumps(seen, sort_keys=True))
`

// pikaConsume runs pikaConsumeScript and returns each message's JSON.
func pikaConsume(t testing.TB, url, queue string, count int) []json.RawMessage {
	t.Helper()
	var stdout, stderr bytes.Buffer
	command := exec.CommandContext(testContext(t, time.Minute), systemPython, "-c", pikaConsumeScript, url, queue, fmt.Sprint(count))
	command.Stdout, command.Stderr = &stdout, &stderr
	if err := command.Run(); err != nil {
		t.Fatalf("pika consumer: %v\n%s(python3-pika missing? apt-get install -y python3-pika)", err, stderr.Bytes())
	}
	var messages []json.RawMessage
	if err := json.Unmarshal(stdout.Bytes(), &messages); err != nil {
		t.Fatalf("pika consumer printed no JSON array: %v\n%s", err, stdout.Bytes())
	}
	if len(messages) != count {
		t.Fatalf("pika consumed %d messages from %s, want %d", len(messages), queue, count)
	}
	return messages
}

// TestMirrorPriorityQueue: a mirrored queue declared with x-max-priority 10 delivers by
// priority, and a message consumed through the proxy leaves every copy.
func TestMirrorPriorityQueue(t *testing.T) {
	t.Parallel()
	queue := queueName(t)
	p := startMirrorProxy(t, "")
	setPolicy(t, p, "priority", exactly(queue), `{"ha-mode":"all"}`)
	conn := dialURL(t, p.url("guest", "guest"))
	declareMirrored(t, p, conn, queue, true, amqp.Table{"x-max-priority": int32(10)})
	priorities := []uint8{3, 0, 10, 7, 1, 9, 5, 2, 8, 4, 6}
	publishConfirmed(t, conn, queue, len(priorities), func(i int) amqp.Publishing {
		return amqp.Publishing{Priority: priorities[i], Body: fmt.Appendf(nil, "priority %d", priorities[i])}
	})
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(len(priorities), mirrorBackends()...)})

	ch := openChannel(t, conn)
	var got []uint8
	for range priorities {
		d, ok, err := ch.Get(queue, false)
		if err != nil || !ok {
			t.Fatalf("basic.get after %v: ok %v, error %v", got, ok, err)
		}
		if want := fmt.Sprintf("priority %d", d.Priority); string(d.Body) != want {
			t.Errorf("got body %q with priority %d, want %q", d.Body, d.Priority, want)
		}
		got = append(got, d.Priority)
		if err := d.Ack(false); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	want := slices.Sorted(slices.Values(priorities))
	slices.Reverse(want)
	if !slices.Equal(got, want) {
		t.Errorf("priorities in delivery order: got %v, want %v", got, want)
	}
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(0, mirrorBackends()...)})
}

// TestMirrorDeadLettering: messages that expire in a mirrored queue with x-message-ttl leave
// every copy of it once, and are dead-lettered into a mirrored target queue, whose copies
// each hold them once.
func TestMirrorDeadLettering(t *testing.T) {
	t.Parallel()
	const messages = 5
	prefix := queueName(t)
	source, target, exchange := prefix+"-source", prefix+"-target", prefix+"-dead-letters"
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	setPolicy(t, p, "dead-lettering", exactly(source, target), `{"ha-mode":"all"}`)
	conn := dialURL(t, p.url("guest", "guest"))

	ch := openChannel(t, conn)
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
		t.Fatalf("exchange.declare: %v", err)
	}
	t.Cleanup(func() {
		if c, err := amqp.Dial(p.url("guest", "guest")); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.ExchangeDelete(exchange, false, false)
			}
			c.Close()
		}
	})
	declareMirrored(t, p, conn, target, true, nil)
	if err := ch.QueueBind(target, "dead", exchange, false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	declareMirrored(t, p, conn, source, true, amqp.Table{
		"x-message-ttl":             int32(200),
		"x-dead-letter-exchange":    exchange,
		"x-dead-letter-routing-key": "dead",
	})
	publishConfirmed(t, conn, source, messages, func(i int) amqp.Publishing {
		return amqp.Publishing{Body: fmt.Appendf(nil, "expiring %d", i)}
	})
	awaitHeld(t, 30*time.Second, map[string]map[string]int{
		source: onEvery(0, backends...),
		target: onEvery(messages, backends...),
	})

	consumeDeadLettered(t, conn, target, messages, func(d amqp.Delivery) {
		// RabbitMQ 3.10 adds these headers when it dead-letters; nothing else may show.
		for key := range d.Headers {
			if key != "x-death" && !strings.HasPrefix(key, "x-first-death-") {
				t.Errorf("dead-lettered %q has header %q = %v, which RabbitMQ does not add", d.Body, key, d.Headers[key])
			}
		}
		if d.Headers["x-first-death-queue"] != source || d.Headers["x-first-death-reason"] != "expired" {
			t.Errorf("dead-lettered %q: headers %v, want x-first-death-queue %s, x-first-death-reason expired", d.Body, d.Headers, source)
		}
	})
	awaitHeld(t, 30*time.Second, map[string]map[string]int{target: onEvery(0, backends...)})
}

// TestMirrorTransactionalRequeueKeepsSlaves: a nack with requeue inside a transaction gives
// the messages back to the master at tx.commit, and leaves every slave copy of them in place.
func TestMirrorTransactionalRequeueKeepsSlaves(t *testing.T) {
	t.Parallel()
	const messages = 4
	queue := queueName(t)
	p := startMirrorProxy(t, "")
	setPolicy(t, p, "transactional-requeue", exactly(queue), `{"ha-mode":"all"}`)
	conn := dialURL(t, p.url("guest", "guest"))
	declareMirrored(t, p, conn, queue, true, nil)
	publishConfirmed(t, conn, queue, messages, func(i int) amqp.Publishing {
		return amqp.Publishing{Body: fmt.Appendf(nil, "requeued %d", i)}
	})
	all := map[string]map[string]int{queue: onEvery(messages, mirrorBackends()...)}
	awaitHeld(t, 30*time.Second, all)
	ch, deliveries := takeDeliveries(t, conn, queue, messages)
	if err := ch.Tx(); err != nil {
		t.Fatalf("tx.select: %v", err)
	}
	if err := deliveries[len(deliveries)-1].Nack(true, true); err != nil {
		t.Fatalf("basic.nack: %v", err)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatalf("tx.commit: %v", err)
	}
	if err := ch.Close(); err != nil {
		t.Fatalf("channel.close: %v", err)
	}
	awaitHeld(t, 30*time.Second, all)
	if got := len(consumeAcked(t, conn, queue, messages)); got != messages {
		t.Errorf("consumed %d messages after the requeue, want %d", got, messages)
	}
	awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(0, mirrorBackends()...)})
}
