package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestSidecarSyncCopiesWhatClientsHold: in a sidecar cluster a slave that synchronises
// gets every message the queue holds, also those a client holds unacknowledged at the
// master, as a RabbitMQ mirror's sync does. rabbit3's broker restarts while a consumer
// holds all ten of the queue's messages; its copy rejoins, purged, and synchronises.
// The consumer then gives the messages back, rabbit2's broker and then the master's die,
// and rabbit3, the one synchronised slave left, is promoted: the ten are there.
func TestSidecarSyncCopiesWhatClientsHold(t *testing.T) {
	const queue, messages = "sync_held_1", 10
	restoreClusterOnCleanup(t)
	t.Cleanup(func() { removeLeftovers(t, queue) })
	nodes := startKillSidecars(t, "^sync_held_")
	declareSidecarQueues(t, nodes, []string{queue}) // through proxy 1: mastered on rabbit1

	conn, err := nodes.connect(0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	publisher := openChannel(t, conn)
	if err := publisher.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := range messages {
		confirmation, err := publisher.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "held-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := confirmation.WaitContext(testContext(t, 20*time.Second)); err != nil || !ok {
			t.Fatalf("publish %d: confirmed %v, %v", i, ok, err)
		}
	}
	holder := openChannel(t, conn)
	if err := holder.Qos(messages, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := holder.Consume(queue, "holder", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range messages {
		select {
		case <-deliveries:
		case <-time.After(20 * time.Second):
			t.Fatal("the consumer did not receive the queue's messages")
		}
	}

	// rabbit3 comes back empty-handed: its copy rejoins purged and synchronises while
	// the consumer holds every message.
	rabbit1, rabbit2, rabbit3 := nodes.brokers[0], nodes.brokers[1], nodes.brokers[2]
	killNode(t, rabbit3)
	restartNode(t, rabbit3)
	nodes.awaitSynchronised(t, 0, []string{queue})

	if err := holder.Close(); err != nil { // the ten go back to the master
		t.Fatal(err)
	}
	killNode(t, rabbit2)
	awaitCondition(t, 60*time.Second, func() error {
		row, err := queueStatus(t, nodes.proxy(2), queue)
		if err != nil {
			return err
		}
		if slices.Contains(row.SynchronisedSlaves, rabbit2.Name) {
			return fmt.Errorf("%v: the slave on the killed %s still counts as synchronised", row, rabbit2.Name)
		}
		return nil
	})
	killNode(t, rabbit1)
	awaitCondition(t, 60*time.Second, func() error {
		row, err := queueStatus(t, nodes.proxy(2), queue)
		if err != nil {
			return err
		}
		if row.Master != rabbit3.Name {
			return fmt.Errorf("%v: want it mastered on %s", row, rabbit3.Name)
		}
		return nil
	})

	survivor, err := nodes.connect(2)
	if err != nil {
		t.Fatal(err)
	}
	defer survivor.Close()
	ch := openChannel(t, survivor)
	got := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < messages && time.Now().Before(deadline) {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		got[string(d.Body)] = true
	}
	if len(got) != messages {
		t.Fatalf("after the failover to %s the queue gave %d of the %d confirmed messages: %v", rabbit3.Name, len(got), messages, got)
	}

	restartNode(t, rabbit1)
	restartNode(t, rabbit2)
	nodes.awaitSynchronised(t, 0, []string{queue}) // the returned copies rejoin before the delete
	if err := nodes.deleteQueue(2, queue); err != nil {
		t.Fatal(err)
	}
}
