package integration

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestSidecarMaxLengthDropHead: drop-head in a sidecar cluster, where the proxy beside the
// source's master forwards what its broker drops and the proxies beside the slaves trim
// them. The source is mastered on rabbit2, its dead-letter queue on rabbit1, and the
// messages come through the proxy beside rabbit3: every broker ends with the newest
// messages of the source and the dropped ones in the dead-letter queue, each once, with
// x-death reason maxlen.
func TestSidecarMaxLengthDropHead(t *testing.T) {
	const limit, published, dropped = 3, 7, 4
	prefix := queueName(t)
	source, target := prefix+"-source", prefix+"-target"
	t.Cleanup(func() { removeLeftovers(t, source, target) })
	proxies := startSidecars(t)
	setPolicy(t, proxies[0], prefix, exactly(source, target), `{"ha-mode":"all","ha-sync-mode":"automatic"}`)

	awaitCondition(t, 60*time.Second, func() error { return declareThrough(proxies[0], target) })
	declarer := dialProxy(t, proxies[1]) // client-local: the source's master is rabbit2
	defer declarer.Close()
	ch := openChannel(t, declarer)
	if _, err := ch.QueueDeclare(source, true, false, false, false, amqp.Table{
		"x-max-length":              int32(limit),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": target,
	}); err != nil {
		t.Fatalf("declaring %s through the proxy beside rabbit2: %v", source, err)
	}
	backends := mirrorBackends()
	awaitHeld(t, time.Minute, map[string]map[string]int{source: onEvery(0, backends...), target: onEvery(0, backends...)})

	publisher := dialProxy(t, proxies[2])
	defer publisher.Close()
	publishConfirmed(t, publisher, source, published, func(i int) amqp.Publishing {
		return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "message %d", i)}
	})
	awaitHeld(t, time.Minute, map[string]map[string]int{source: onEvery(limit, backends...), target: onEvery(dropped, backends...)})

	consumer := dialProxy(t, proxies[0])
	defer consumer.Close()
	consumeDeadLettered(t, consumer, target, dropped, func(d amqp.Delivery) { checkDeath(t, d, source, "maxlen") })
	for _, d := range consumeAcked(t, consumer, source, limit) {
		if i := bodyIndex(t, d.Body); i < dropped {
			t.Errorf("consumed message %d, which the master dropped", i)
		}
	}
	for _, q := range []string{source, target} {
		if err := deleteThrough(proxies[0], q); err != nil {
			t.Errorf("deleting %s: %v", q, err)
		}
	}
}
