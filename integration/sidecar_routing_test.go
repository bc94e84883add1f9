package integration

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A binding made through one proxy of a sidecar cluster routes the publishes of every
// other proxy from the moment the client has its bind-ok. Publishes to an exchange go only
// to the backends holding a queue it routes to, by each proxy's own copy of the metadata
// log; a proxy whose copy lagged would send a publish made right after the bind only to
// the backends of the queues bound before, and the new queue would miss it. The binding
// proxy answers bind-ok once every other proxy has applied the binding (cluster
// WaitApplied); without that wait this test failed in every run.
func TestSidecarBindingRoutesThroughEveryProxyAtOnce(t *testing.T) {
	const rounds = 5
	prefix := queueName(t)
	far := prefix + "-far"
	queues := []string{far}
	var exchanges []string
	for r := range rounds {
		queues = append(queues, fmt.Sprintf("%s-%d", prefix, r))
		exchanges = append(exchanges, fmt.Sprintf("%s-x%d", prefix, r))
	}
	t.Cleanup(func() { removeLeftovers(t, queues...) })
	nodes := cluster.Nodes()
	t.Cleanup(func() {
		for _, n := range nodes {
			if conn, err := amqp.Dial(n.URL()); err == nil {
				for _, x := range exchanges {
					deleteExchange(conn, x)
				}
				conn.Close()
			}
		}
	})
	proxies := startSidecars(t)

	binder := dialProxy(t, proxies[0])
	defer binder.Close()
	ch := openChannel(t, binder)
	// A queue on rabbit2 (client-local through node 2), bound to each round's exchange
	// first: publishes with key k have a known route there before the round's binding.
	awaitCondition(t, 60*time.Second, func() error { return declareThrough(proxies[1], far) })
	publishers := make([]*amqp.Channel, 0, 2)
	for _, p := range proxies[1:] {
		conn := dialProxy(t, p)
		defer conn.Close()
		pub := openChannel(t, conn)
		if err := pub.Confirm(false); err != nil {
			t.Fatal(err)
		}
		publishers = append(publishers, pub)
	}
	for r, queue := range queues[1:] {
		exchange := exchanges[r]
		if err := ch.ExchangeDeclare(exchange, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
			t.Fatalf("round %d: declaring %s through node 1: %v", r, exchange, err)
		}
		if err := ch.QueueBind(far, "k", exchange, false, nil); err != nil {
			t.Fatalf("round %d: binding %s: %v", r, far, err)
		}
		// Mastered on rabbit1 (client-local through node 1), bound, and published to
		// through nodes 2 and 3 the moment bind-ok is in.
		if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
			t.Fatalf("round %d: declaring %s: %v", r, queue, err)
		}
		if err := ch.QueueBind(queue, "k", exchange, false, nil); err != nil {
			t.Fatalf("round %d: binding %s: %v", r, queue, err)
		}
		for i, pub := range publishers {
			confirm, err := pub.PublishWithDeferredConfirmWithContext(testContext(t, 10*time.Second), exchange, "k", false, false,
				amqp.Publishing{Body: fmt.Appendf(nil, "round %d through node %d", r, i+2)})
			if err != nil {
				t.Fatalf("round %d: publishing through node %d: %v", r, i+2, err)
			}
			if ok, err := confirm.WaitContext(testContext(t, 10*time.Second)); err != nil || !ok {
				t.Fatalf("round %d: the publish through node %d was not confirmed (ack %v, err %v)", r, i+2, ok, err)
			}
		}
		// A confirmed publish routed to rabbit1 is enqueued there.
		if got := queueDepth(t, nodes[0], queue); got != len(publishers) {
			t.Errorf("round %d: %s holds %d messages on %s, want %d: a proxy routed a publish made after bind-ok without the new binding",
				r, queue, got, nodes[0].Name, len(publishers))
		}
	}
	if got := queueDepth(t, nodes[1], far); got != rounds*len(publishers) {
		t.Errorf("%s holds %d messages on %s, want %d", far, got, nodes[1].Name, rounds*len(publishers))
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Errorf("deleting %s through node 1: %v", q, err)
		}
	}
	for _, x := range exchanges {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			t.Errorf("deleting %s through node 1: %v", x, err)
		}
	}
}
