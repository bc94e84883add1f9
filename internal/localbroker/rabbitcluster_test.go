package localbroker

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
)

// TestJoinRabbitMQCluster forms a two-node RabbitMQ cluster and checks that
// RabbitMQ's own classic mirroring, the reference amqp-mirror is measured
// against, works on it.
func TestJoinRabbitMQCluster(t *testing.T) {
	defer leaktest.VerifyNone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Names: []string{"native1", "native2"}})
	if err != nil {
		t.Fatalf("starting nodes: %v", err)
	}
	defer c.Close()
	if err := c.JoinRabbitMQCluster(ctx); err != nil {
		t.Fatal(err)
	}
	first, second := c.Nodes()[0], c.Nodes()[1]
	status, err := second.Ctl(ctx, "cluster_status", "--formatter", "json")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if !strings.Contains(string(status), `"`+n.ErlangName+`"`) {
			t.Errorf("cluster_status of %s does not list %s:\n%s", second.Name, n.ErlangName, status)
		}
	}

	if _, err := first.Ctl(ctx, "set_policy", "ha-all", "^mirrored", `{"ha-mode":"all","ha-sync-mode":"automatic"}`, "--apply-to", "queues"); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(first.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("mirrored-q", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := first.Ctl(ctx, "list_queues", "name", "slave_pids", "--no-table-headers")
		if err == nil && strings.Contains(string(out), second.ErlangName) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue has no mirror on %s after 30s: %s %v", second.Name, out, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
