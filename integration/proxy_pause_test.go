package integration

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestProxyPause: a paused proxy (a sidecar cut off from the majority of its
// cluster, pause_minority) closes its clients with 320, as a RabbitMQ node
// paused by pause_minority does, refuses new ones, and serves again once
// resumed.
func TestProxyPause(t *testing.T) {
	url, srv := startProxy(t, node(t, "rabbit1"))
	conn := dialURL(t, url)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	// A channel's open-ok comes from the proxy's client loop, which runs
	// only once the proxy counts the connection open: Dial returns at the
	// open-ok of the connection, which the proxy writes a moment before.
	if _, err := conn.Channel(); err != nil {
		t.Fatalf("open a channel: %v", err)
	}

	srv.Pause()
	select {
	case err := <-closed:
		if err == nil || err.Code != amqp.ConnectionForced {
			t.Fatalf("client closed with %v, want 320 CONNECTION_FORCED", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a paused proxy left its client connected")
	}
	if c, err := amqp.Dial(url); err == nil {
		c.Close()
		t.Fatal("a paused proxy accepted a new client")
	}

	srv.Resume()
	again, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("after Resume: %v", err)
	}
	again.Close()
}
