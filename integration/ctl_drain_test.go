package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestCtlDrain runs `amqp-mirror ctl drain` on the master's backend of an ha-mode all queue
// while a publisher with confirms and a consumer with manual acks use it through the proxy:
// the master moves to the oldest synchronised slave (the first after it in ring order), the
// consumer keeps receiving on the same channel without doing anything, every confirmed
// message arrives (a duplicate only with redelivered set), and nothing is placed on the
// drained backend until `ctl undrain`, after which it holds a slave again.
func TestCtlDrain(t *testing.T) {
	queue := queueName(t)
	p := startMirrorProxy(t, mirrorPolicyYAML("drain-all", exactly(queue), map[string]any{"ha-mode": "all"}))
	conn := dialURL(t, p.url("guest", "guest"))
	declareMirrored(t, p, conn, queue, false, nil)

	before := awaitSynchronised(t, p, queue, 2, 30*time.Second)
	drained, successor := before.Master, before.SynchronisedSlaves[0]

	// The consumer: manual acks, counting what it received by message index.
	var mu sync.Mutex
	seen := map[int]bool{}
	received := 0
	var consumeErr error
	ch := openChannel(t, conn)
	if err := ch.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "drain-consumer", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume: %v", err)
	}
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for d := range deliveries {
			i, err := strconv.Atoi(strings.TrimPrefix(string(d.Body), "message "))
			mu.Lock()
			if err != nil && consumeErr == nil {
				consumeErr = fmt.Errorf("body %q: %w", d.Body, err)
			}
			if seen[i] && !d.Redelivered && consumeErr == nil {
				consumeErr = fmt.Errorf("message %d delivered twice, the second time without redelivered", i)
			}
			seen[i] = true
			received++
			mu.Unlock()
			if err := d.Ack(false); err != nil {
				mu.Lock()
				consumeErr = fmt.Errorf("ack of message %d: %w", i, err)
				mu.Unlock()
				return
			}
		}
	}()
	receivedSoFar := func() int {
		mu.Lock()
		defer mu.Unlock()
		return received
	}

	// The publisher: confirms, 100 in flight, until told to stop.
	pubCtx, stopPublishing := context.WithCancel(t.Context())
	defer stopPublishing()
	var confirmed counter
	published := make(chan error, 1)
	pubCh := openChannel(t, conn)
	go func() {
		published <- publishWindow(pubCtx, pubCh, "", queue, -1, 100, func(i int) amqp.Publishing {
			return amqp.Publishing{Body: fmt.Appendf(nil, "message %d", i)}
		}, &confirmed)
	}()
	awaitCondition(t, 30*time.Second, func() error {
		if n := receivedSoFar(); n < 300 {
			return fmt.Errorf("the consumer received %d messages, want 300 before the drain", n)
		}
		return nil
	})

	r := p.ctl(t, "drain", drained)
	r.check(t, 0, []string{
		"Draining backend " + drained + " ...\n",
		fmt.Sprintf("queue '%s' in vhost '/': master %s -> %s\n", queue, drained, successor),
		fmt.Sprintf("Backend %s drained: 1 master(s) moved, 0 master(s) kept, 0 slave(s) dropped.", drained),
	}, nil, nil)

	// The consumer goes on receiving what is published after the drain, from the new master.
	mark := receivedSoFar()
	awaitCondition(t, 30*time.Second, func() error {
		if n := receivedSoFar(); n < mark+500 {
			return fmt.Errorf("the consumer received %d messages since the drain, want 500", n-mark)
		}
		return nil
	})
	stopPublishing()
	if err := <-published; err != nil {
		t.Fatalf("publisher: %v", err)
	}
	total := confirmed.get()
	awaitCondition(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if consumeErr != nil {
			return nil // reported below
		}
		for i := range total {
			if !seen[i] {
				return fmt.Errorf("confirmed message %d of %d not received", i, total)
			}
		}
		return nil
	})
	mu.Lock()
	if consumeErr != nil {
		t.Error(consumeErr)
	}
	t.Logf("%d messages confirmed, %d deliveries (%d since the drain was asked)", total, received, received-mark)
	mu.Unlock()
	select {
	case <-consumed:
		t.Error("the consumer's deliveries ended: the drain cancelled or closed it")
	default:
	}

	after, err := queueStatus(t, p, queue)
	if err != nil {
		t.Fatal(err)
	}
	if after.Master != successor || slices.Contains(after.copies(), drained) {
		t.Errorf("after the drain: %v; want master %s and nothing on %s", after, successor, drained)
	}

	p.ctl(t, "drain", "nosuchbackend").check(t, 65, nil, []string{"Error: drain: backend 'nosuchbackend' (configured: " + strings.Join(mirrorBackends(), ", ") + "): unknown backend"}, nil)

	// Undrain: ha-mode all mirrors to the backend again (its stale copy purged first).
	p.ctl(t, "undrain", drained).check(t, 0, []string{"Undraining backend " + drained + " ...\n"}, nil, nil)
	awaitCondition(t, 30*time.Second, func() error {
		row, err := queueStatus(t, p, queue)
		if err != nil {
			return err
		}
		if row.Master != successor || !slices.Contains(row.Slaves, drained) {
			return fmt.Errorf("%v; want master %s and a slave on %s again", row, successor, drained)
		}
		return nil
	})
	if err := ch.Cancel("drain-consumer", false); err != nil {
		t.Errorf("basic.cancel: %v", err)
	}
}
