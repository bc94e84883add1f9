package integration

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// TestHomeIsABackendThatIsUp: with the first backend (every connection's
// home by default) killed and its mirrored queue failed over, a new client
// connects through the proxy and works, as it would reconnect to a
// surviving node of a RabbitMQ cluster. Its home is the first backend up
// in config order, whose connection.start it sees as from that broker; a
// wrong password and an unknown vhost get that broker's answers. A proxy
// whose node is the third backend keeps its clients there. Once the first
// backend is back, new connections are at home there again.
func TestHomeIsABackendThatIsUp(t *testing.T) {
	nodes := cluster.Nodes()
	first, second, third := nodes[0], nodes[1], nodes[2]
	queue := queueName(t)
	p := startMirrorProxy(t, mirrorPolicyYAML("home-all", exactly(queue),
		map[string]any{"ha-mode": "all", "ha-sync-mode": "automatic"}))
	beside := startMirrorProxy(t, "node: "+third.Name+"\n")
	homeOf := func(p *cliProxy) (string, error) {
		conn, err := amqp.Dial(p.url("guest", "guest"))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		name, _ := conn.Properties["cluster_name"].(string)
		return name, nil
	}
	if got, err := homeOf(beside); got != third.ErlangName {
		t.Fatalf("through a proxy beside %s, a connection's home says cluster_name %q (%v), want %s", third.Name, got, err, third.ErlangName)
	}

	conn := dialURL(t, p.url("guest", "guest"))
	if got := conn.Properties["cluster_name"]; got != first.ErlangName {
		t.Fatalf("with every backend up, a connection's home says cluster_name %v, want the first backend's %s", got, first.ErlangName)
	}
	setup := openChannel(t, conn)
	if _, err := setup.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare %s: %v", queue, err)
	}
	t.Cleanup(func() { ctlDeleteEverywhere(t, conn, queue) })
	restoreClusterOnCleanup(t) // before the deletes: they need every node
	publishConfirmed(t, conn, queue, 1, persistentBody("before the kill"))
	testutil.Eventually(t, 30*time.Second, func() error {
		row, err := queueStatus(t, p, queue)
		if err == nil && len(row.SynchronisedSlaves) != len(nodes)-1 {
			err = fmt.Errorf("%v, want every other backend a synchronised slave", row)
		}
		return err
	})

	killNode(t, first)
	testutil.Eventually(t, 60*time.Second, func() error {
		row, err := queueStatus(t, p, queue)
		if err == nil && row.Master == first.Name {
			err = fmt.Errorf("%v, want a master on a live backend", row)
		}
		return err
	})

	client, err := amqp.Dial(p.url("guest", "guest"))
	if err != nil {
		t.Fatalf("a new connection with %s down: %v", first.Name, err)
	}
	t.Cleanup(func() { client.Close() })
	direct := dialURL(t, second.URL())
	if got := client.Properties["cluster_name"]; got != second.ErlangName {
		t.Errorf("with %s down, the connection.start says cluster_name %v, want the next backend's %s", first.Name, got, second.ErlangName)
	}
	if got, want := slices.Sorted(maps.Keys(client.Properties)), slices.Sorted(maps.Keys(direct.Properties)); !slices.Equal(got, want) {
		t.Errorf("server properties through the proxy: %v, want the broker's own %v", got, want)
	}
	publishConfirmed(t, client, queue, 1, persistentBody("after the kill"))
	if got, err := homeOf(beside); got != third.ErlangName {
		t.Errorf("with %s down, through the proxy beside %s, a connection's home says cluster_name %q (%v), want %s", first.Name, third.Name, got, err, third.ErlangName)
	}
	ch := openChannel(t, client)
	for _, want := range []string{"before the kill", "after the kill"} {
		d, ok, err := ch.Get(queue, true)
		if err != nil || !ok || string(d.Body) != want {
			t.Fatalf("basic.get from %s: %q, found %v, %v; want %q", queue, d.Body, ok, err, want)
		}
	}

	_, err = amqp.Dial(p.url("guest", "wrong"))
	if !errors.Is(err, amqp.ErrCredentials) {
		t.Errorf("a wrong password with %s down: got %v, want the broker's refusal (%v)", first.Name, err, amqp.ErrCredentials)
	}
	_, err = amqp.Dial(p.url("guest", "guest") + "no-such-vhost")
	var refusal *amqp.Error
	if !errors.As(err, &refusal) || refusal.Code != amqp.NotAllowed {
		t.Errorf("an unknown vhost with %s down: got %v, want the broker's 530 NOT_ALLOWED", first.Name, err)
	}

	restartNode(t, first)
	testutil.Eventually(t, 60*time.Second, func() error {
		got, err := homeOf(p)
		if err == nil && got != first.ErlangName {
			err = fmt.Errorf("a new connection says cluster_name %q, want %s's %s", got, first.Name, first.ErlangName)
		}
		return err
	})
}

// persistentBody is a persistent message with the given body, whatever its number.
func persistentBody(text string) func(int) amqp.Publishing {
	return func(int) amqp.Publishing { return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(text)} }
}
