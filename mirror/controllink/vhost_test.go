package controllink

import (
	"context"
	"testing"
	"time"
)

func TestWithVHost(t *testing.T) {
	tests := []struct {
		url, vhost, want string
	}{
		{"amqp://u:p@host:5672/", "prod", "amqp://u:p@host:5672/prod"},
		{"amqp://u:p@host:5672", "/", "amqp://u:p@host:5672/%2F"},
		{"amqp://u:p@host:5672/prod", "/", "amqp://u:p@host:5672/%2F"},
		{"amqps://u:p@host/%2F", "a b/c", "amqps://u:p@host/a%20b%2Fc"},
		{"amqp://u:p@host/?heartbeat=5", "x", "amqp://u:p@host/x?heartbeat=5"},
	}
	for _, tt := range tests {
		got, err := WithVHost(tt.url, tt.vhost)
		if err != nil || got != tt.want {
			t.Errorf("WithVHost(%q, %q) = %q, %v; want %q", tt.url, tt.vhost, got, err, tt.want)
		}
		if v := vhostOf(got); v != tt.vhost {
			t.Errorf("vhostOf(%q) = %q; want %q", got, v, tt.vhost)
		}
	}
}

// TestWatcherVHostConn: the backend URL's vhost is the watcher's own connection; another
// vhost gets one connection of its own, handed out again until the backend goes down; a
// vhost the backend lacks is refused, and said so.
func TestWatcherVHostConn(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := broker.Ctl(ctx, "add_vhost", "other"); err != nil {
		t.Fatal(err)
	}
	defer broker.Ctl(context.Background(), "delete_vhost", "other")
	if _, err := broker.Ctl(ctx, "set_permissions", "-p", "other", "guest", ".*", ".*", ".*"); err != nil {
		t.Fatal(err)
	}

	w := startWatcher(t)
	expectEvent(t, w, 10*time.Second, Up, CauseNone)
	own, ownGen := w.Conn("rabbit1")
	if c, gen, err := w.VHostConn("rabbit1", "/"); err != nil || c != own || gen != ownGen {
		t.Errorf("VHostConn in the URL's vhost = %p, %d, %v; want the watcher's own %p, %d", c, gen, err, own, ownGen)
	}

	other, gen, err := w.VHostConn("rabbit1", "other")
	if err != nil {
		t.Fatalf("VHostConn(other): %v", err)
	}
	ch, err := other.Channel()
	if err != nil {
		t.Fatalf("a channel in vhost other: %v", err)
	}
	ch.Close()
	if again, genAgain, err := w.VHostConn("rabbit1", "other"); err != nil || again != other || genAgain != gen {
		t.Errorf("VHostConn(other) again = %p, %d, %v; want the same %p, %d", again, genAgain, err, other, gen)
	}

	if _, _, err := w.VHostConn("rabbit1", "missing"); err == nil {
		t.Error("VHostConn in a vhost the broker lacks: no error")
	}
	if !w.Refuses("rabbit1", "missing") || w.Refuses("rabbit1", "other") {
		t.Errorf("Refuses: missing %v, other %v; want true, false", w.Refuses("rabbit1", "missing"), w.Refuses("rabbit1", "other"))
	}
	if got := w.RefusedVHosts("rabbit1"); len(got) != 1 || got[0] != "missing" {
		t.Errorf("RefusedVHosts = %v; want [missing]", got)
	}

	// The backend goes down: its vhost connections close with the watcher's, and after
	// it is back a new one is handed out.
	restartBroker(t)
	expectEvent(t, w, 30*time.Second, Down, CauseShutdown)
	expectEvent(t, w, time.Minute, Up, CauseNone)
	if !other.IsClosed() {
		t.Error("the vhost connection is open after its backend went down")
	}
	fresh, freshGen, err := w.VHostConn("rabbit1", "other")
	if err != nil || fresh == other || freshGen == gen {
		t.Errorf("VHostConn(other) after a restart = %p, %d, %v; want a new connection", fresh, freshGen, err)
	}
}
