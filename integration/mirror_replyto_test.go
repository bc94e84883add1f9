package integration

// Direct reply-to (amq.rabbitmq.reply-to) with a mirrored request queue:
// the RPC pattern of every tutorial, through the proxy.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestMirrorDirectReplyTo: an RPC client consumes amq.rabbitmq.reply-to and publishes
// requests with reply_to=amq.rabbitmq.reply-to to a queue mirrored on every node whose
// master is not the client's home backend. Each request is on every copy before a server
// takes it; the server, on another connection, gets it from the master, replies to the
// reply_to it sees through the default exchange, and the client gets the reply with the
// request's correlation id: through the client's proxy, and through a second proxy in front
// of the same brokers that never saw the request.
func TestMirrorDirectReplyTo(t *testing.T) {
	t.Parallel()
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	other := startMirrorProxy(t, "")
	conn := dialURL(t, p.url("guest", "guest"))
	requests := requestQueue(t, p, conn)

	client := openChannel(t, conn)
	closed := client.NotifyClose(make(chan *amqp.Error, 1))
	replies, err := client.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume amq.rabbitmq.reply-to through the proxy: %v", err)
	}
	server := openChannel(t, dialURL(t, p.url("guest", "guest")))
	replier := openChannel(t, dialURL(t, other.url("guest", "guest")))

	for _, round := range []struct {
		name    string
		replier *amqp.Channel // where the server publishes its reply
	}{
		{"reply through the client's proxy", server},
		{"reply through another proxy", replier},
	} {
		correlation := round.name
		ctx := testContext(t, time.Minute)
		if err := client.PublishWithContext(ctx, "", requests, false, false, amqp.Publishing{
			ReplyTo: "amq.rabbitmq.reply-to", CorrelationId: correlation, Body: []byte("2+2"),
		}); err != nil {
			t.Fatalf("%s: publishing the request: %v", round.name, err)
		}
		select {
		case err := <-closed:
			t.Fatalf("%s: the client's channel closed after the request: %v", round.name, err)
		default:
		}
		awaitHeld(t, 30*time.Second, map[string]map[string]int{requests: onEvery(1, backends...)})

		request := getRequest(t, ctx, server, requests)
		if !strings.HasPrefix(request.ReplyTo, "amq.rabbitmq.reply-to.") {
			t.Fatalf("%s: the server sees reply_to %q; want a name the broker made of amq.rabbitmq.reply-to", round.name, request.ReplyTo)
		}
		t.Logf("%s: the server sees reply_to %s", round.name, request.ReplyTo)
		if err := round.replier.PublishWithContext(ctx, "", request.ReplyTo, false, false, amqp.Publishing{
			CorrelationId: request.CorrelationId, Body: []byte("4"),
		}); err != nil {
			t.Fatalf("%s: publishing the reply to %s: %v", round.name, request.ReplyTo, err)
		}
		if err := request.Ack(false); err != nil {
			t.Fatalf("%s: acking the request: %v", round.name, err)
		}

		select {
		case reply := <-replies:
			if reply.CorrelationId != correlation || string(reply.Body) != "4" {
				t.Fatalf("%s: the client got a reply with correlation id %q and body %q; want %q and \"4\"",
					round.name, reply.CorrelationId, reply.Body, correlation)
			}
		case err := <-closed:
			t.Fatalf("%s: the client's channel closed before the reply: %v", round.name, err)
		case <-ctx.Done():
			t.Fatalf("%s: no reply to %s reached the client: %v", round.name, request.ReplyTo, ctx.Err())
		}
		// The acked request leaves every copy.
		awaitHeld(t, 30*time.Second, map[string]map[string]int{requests: onEvery(0, backends...)})
	}
}

// TestMirrorDirectReplyToPika is TestMirrorDirectReplyTo's first round with python3-pika
// for the client and the server (testdata/pika/direct_reply_to.py).
func TestMirrorDirectReplyToPika(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(systemPython); err != nil {
		t.Fatalf("%s not found: apt-get install -y python3-pika", systemPython)
	}
	backends := mirrorBackends()
	p := startMirrorProxy(t, "")
	requests := requestQueue(t, p, dialURL(t, p.url("guest", "guest")))

	var stderr bytes.Buffer
	script := exec.CommandContext(testContext(t, 2*time.Minute), systemPython, "testdata/pika/direct_reply_to.py", p.url("guest", "guest"), requests)
	script.Stderr = &stderr
	stdin, err := script.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := script.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := script.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != `{"published": true}` {
		stdin.Close()
		script.Wait()
		t.Fatalf("the pika client did not publish its request: %q\n%s", lines.Text(), stderr.Bytes())
	}
	awaitHeld(t, 30*time.Second, map[string]map[string]int{requests: onEvery(1, backends...)})
	io.WriteString(stdin, "go\n")
	var last string
	for lines.Scan() {
		last = lines.Text()
	}
	if err := script.Wait(); err != nil {
		t.Fatalf("pika: %v\n%s", err, stderr.Bytes())
	}
	var seen struct {
		Request *struct {
			ReplyTo string `json:"reply_to"`
		}
		Replies []struct {
			CorrelationID string `json:"correlation_id"`
			Body          string
		}
	}
	if err := json.Unmarshal([]byte(last), &seen); err != nil {
		t.Fatalf("pika printed no JSON: %v\n%s\n%s", err, last, stderr.Bytes())
	}
	if seen.Request == nil {
		t.Fatalf("the pika server found no request in %s", requests)
	}
	if !strings.HasPrefix(seen.Request.ReplyTo, "amq.rabbitmq.reply-to.") {
		t.Fatalf("the pika server sees reply_to %q; want a name the broker made of amq.rabbitmq.reply-to", seen.Request.ReplyTo)
	}
	if len(seen.Replies) != 1 || seen.Replies[0].CorrelationID != "pika-1" || seen.Replies[0].Body != "4" {
		t.Fatalf("the pika client got replies %+v; want one with correlation id pika-1 and body 4", seen.Replies)
	}
	awaitHeld(t, 30*time.Second, map[string]map[string]int{requests: onEvery(0, backends...)})
}

// requestQueue declares through p a queue mirrored on every backend, whose master is not
// the first backend: a drop-in proxy's connections are at home there, and min-masters puts
// a decoy queue's master there first.
func requestQueue(t testing.TB, p *cliProxy, conn *amqp.Connection) string {
	t.Helper()
	prefix := queueName(t)
	decoy, requests := prefix+"-decoy", prefix+"-requests"
	backends := mirrorBackends()
	setPolicy(t, p, "direct-reply-to", exactly(decoy, requests), `{"ha-mode":"all"}`)
	locator := amqp.Table{"x-queue-master-locator": "min-masters"}
	declareMirrored(t, p, conn, decoy, false, locator)
	declareMirrored(t, p, conn, requests, false, locator)
	row, err := queueStatus(t, p, requests)
	if err != nil {
		t.Fatal(err)
	}
	if row.Master == "" || row.Master == backends[0] || len(row.Slaves) != len(backends)-1 {
		t.Fatalf("ctl list_queues: %v; want a master other than %s (the connections' home) and every other backend a slave", row, backends[0])
	}
	return requests
}

// getRequest gets a message from queue with basic.get (manual ack), polling until there is one.
func getRequest(t testing.TB, ctx context.Context, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	var got amqp.Delivery
	err := poll(ctx, 30*time.Second, func() error {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("basic.get %s: %v", queue, err)
		}
		if !ok {
			return errors.New("get-empty")
		}
		got = d
		return nil
	})
	if err != nil {
		t.Fatalf("basic.get %s: %v", queue, err)
	}
	return got
}
