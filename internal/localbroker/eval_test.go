package localbroker

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
)

// TestEvalAndQueues looks at a node through erl_call: a value of every kind of iodata, an
// expression that raises, and the counts of queues in two vhosts, one with a name that
// needs escaping, set up over AMQP.
func TestEvalAndQueues(t *testing.T) {
	defer leaktest.VerifyNone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Names: []string{"eval1"}})
	if err != nil {
		t.Fatalf("starting the node: %v", err)
	}
	defer c.Close()
	node := c.Nodes()[0]

	for _, tc := range []struct{ expression, want string }{
		{`"a string"`, "a string"},
		{`""`, ""},
		{`<<"a binary with \"quotes\" and \\">>`, `a binary with "quotes" and \`},
		{`X = 40, [integer_to_list(X + 2), <<"!">>]`, "42!"},
		{`binary:copy(<<"x">>, 100000)`, strings.Repeat("x", 100000)},
	} {
		got, err := node.Eval(ctx, tc.expression)
		if err != nil || string(got) != tc.want {
			t.Errorf("Eval(%.40s) = %.40q, %.200v; want %.40q", tc.expression, got, err, tc.want)
		}
	}
	if _, err := node.Eval(ctx, `erlang:error(on_purpose)`); err == nil || !strings.Contains(err.Error(), "on_purpose") {
		t.Errorf("Eval of an expression that raises: %v, want an error naming the reason", err)
	}
	if err := node.FlushMetadata(ctx); err != nil {
		t.Error(err)
	}

	const vhost = `other "vhost"`
	if _, err := node.Ctl(ctx, "add_vhost", vhost); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Ctl(ctx, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"); err != nil {
		t.Fatal(err)
	}
	fill := func(vhost, queue string, publish int, get int) {
		t.Helper()
		url := amqp.URI{Scheme: "amqp", Host: "127.0.0.1", Port: node.Port, Username: "guest", Password: "guest", Vhost: vhost}
		conn, err := amqp.Dial(url.String())
		if err != nil {
			t.Fatalf("connect to vhost %q: %v", vhost, err)
		}
		t.Cleanup(func() { conn.Close() })
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		for range publish {
			if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte("m")}); err != nil {
				t.Fatal(err)
			}
		}
		for range get {
			// Left unacknowledged until the connection closes.
			if _, ok, err := ch.Get(queue, false); err != nil || !ok {
				t.Fatalf("get from %q: %v, %v", queue, ok, err)
			}
		}
	}
	fill("/", "root", 3, 1)
	fill(vhost, `q"uoted`, 5, 2)
	fill(vhost, "empty", 0, 0)

	want := map[string]map[string]QueueCounts{
		"/":   {"root": {Messages: 3, MessagesReady: 2, MessagesUnacknowledged: 1}},
		vhost: {`q"uoted`: {Messages: 5, MessagesReady: 3, MessagesUnacknowledged: 2}, "empty": {}},
	}
	for vhost, want := range want {
		// Publishes without confirms reach the queue a moment after they were sent.
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := node.Queues(ctx, vhost)
			if err == nil && maps.Equal(got, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Queues(%q) = %v, %v; want %v", vhost, got, err, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got, err := node.Queues(ctx, "no such vhost"); err != nil || len(got) != 0 {
		t.Errorf("Queues of a missing vhost = %v, %v; want none", got, err)
	}
}
