package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// TestCtlDrainMidPublish: a consumer whose queue's master moves while its
// channel is between a publish's frames is cancelled on the old master once
// the publish is whole, whether it moves to the new master or, declared with
// x-cancel-on-ha-failover, is cancelled for the client. A consumer left there
// would keep what that broker sent it unacknowledged, and take its tag: were
// the master to come back to that broker, the consume would be refused (530)
// and the client's connection closed. The test completes the publish only
// after the proxy's check of the masters has found the move.
func TestCtlDrainMidPublish(t *testing.T) {
	for _, tc := range []struct {
		name string
		args frames.Table // basic.consume's
		// cancelled: the client gets basic.cancel; otherwise the moved
		// consumer gets the completed publish.
		cancelled bool
	}{
		{name: "moved"},
		{name: "cancel-on-ha-failover", args: frames.Table{{Key: "x-cancel-on-ha-failover", Value: true}}, cancelled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queue := queueName(t)
			p := startMirrorProxy(t, mirrorPolicyYAML("drain-mid-publish", exactly(queue), map[string]any{"ha-mode": "all"}))
			conn := dialURL(t, p.url("guest", "guest"))
			declareMirrored(t, p, conn, queue, false, nil)
			drained := awaitSynchronised(t, p, queue, 2, 30*time.Second).Master

			const tag = "mid-publish"
			client := dialRaw(t, p.amqpAddr)
			notifying := guest
			notifying.cancelNotify = true
			if _, err := client.handshake(notifying); err != nil {
				t.Fatalf("handshake: %v", err)
			}
			send := func(what string, m frames.Method) {
				t.Helper()
				if err := client.sendMethod(1, m); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}
			send("channel.open", &frames.ChannelOpen{})
			if _, err := expect[*frames.ChannelOpenOk](client); err != nil {
				t.Fatalf("channel.open: %v", err)
			}
			send("basic.consume", &frames.BasicConsume{Queue: queue, ConsumerTag: tag, Arguments: tc.args})
			if _, err := expect[*frames.BasicConsumeOk](client); err != nil {
				t.Fatalf("basic.consume: %v", err)
			}
			awaitCondition(t, 30*time.Second, func() error { return consumersOn(t, drained, queue, 1) })

			// The publish's method frame alone: the channel is between its
			// frames while the master moves, and while the proxy finds out.
			send("basic.publish", &frames.BasicPublish{RoutingKey: queue})
			mark := len(p.stderr.String())
			p.ctl(t, "drain", drained).check(t, 0, []string{"1 master(s) moved"}, nil, nil)
			p.awaitRecordAfter(t, mark, "the consumer's move", map[string]string{"msg": "queue master changed under live consumers; moving them", "old": drained})

			body := []byte("completed after the drain")
			client.conn.SetWriteDeadline(time.Now().Add(rawTimeout))
			if err := client.out.WriteContentHeader(1, &frames.ContentHeader{ClassID: frames.ClassBasic, BodySize: uint64(len(body))}); err != nil {
				t.Fatal(err)
			}
			if err := client.out.WriteFrame(frames.FrameBody, 1, body); err != nil {
				t.Fatal(err)
			}
			if err := client.out.Flush(); err != nil {
				t.Fatal(err)
			}
			if tc.cancelled {
				cancel, err := expect[*frames.BasicCancel](client)
				if err != nil {
					t.Fatalf("the client was not told its consumer was cancelled: %v", err)
				}
				if cancel.ConsumerTag != tag {
					t.Errorf("basic.cancel of consumer %q, want %q", cancel.ConsumerTag, tag)
				}
			} else {
				deliver, err := expect[*frames.BasicDeliver](client)
				if err != nil {
					t.Fatalf("the moved consumer got no delivery of the completed publish: %v", err)
				}
				if deliver.ConsumerTag != tag {
					t.Errorf("delivery to consumer %q, want %q", deliver.ConsumerTag, tag)
				}
			}
			awaitCondition(t, 30*time.Second, func() error { return consumersOn(t, drained, queue, 0) })
			p.ctl(t, "undrain", drained).check(t, 0, nil, nil, nil)
		})
	}
}

// consumersOn fails unless the copy of queue on node has want consumers,
// as the broker lists them.
func consumersOn(t testing.TB, node, queue string, want int) error {
	n := cluster.Node(node)
	if n == nil {
		t.Fatalf("no node %s in the shared cluster", node)
	}
	out, err := n.Ctl(t.Context(), "list_consumers", "queue_name", "consumer_tag")
	if err != nil {
		return err
	}
	got := 0
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.HasPrefix(line, queue+"\t") {
			got++
		}
	}
	if got != want {
		return fmt.Errorf("%s lists %d consumers of %s, want %d:\n%s", node, got, queue, want, out)
	}
	return nil
}
