package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Exchange records written through a follower reach the leader, and
// WaitApplied returns only once every other proxy has applied them.
func TestExchangeWritesAndWaitApplied(t *testing.T) {
	nodes := startCluster(t, 3)
	leader := waitLeader(t, nodes)
	follower := without(nodes, leader)[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	x := mirror.ExchangeMeta{ID: mirror.ExchangeID{VHost: "/", Name: "orders"}, Type: "topic", Fresh: []string{"rabbit1", "rabbit2"}}
	written, err := follower.PutExchange(ctx, x, 0)
	if err != nil {
		t.Fatalf("exchange put through follower %s: %v", follower.cfg.NodeName, err)
	}
	if written.Version == 0 || written.Type != "topic" {
		t.Errorf("exchange put through a follower returned %+v, want the record with its version", written)
	}
	// WaitApplied waits for the other proxies; the writer waits for its
	// own copy itself, as the engine does.
	if err := follower.Store().WaitApplied(ctx, written.Version); err != nil {
		t.Fatalf("the writer's own WaitApplied: %v", err)
	}
	if err := follower.Peers().WaitApplied(ctx, written.Version); err != nil {
		t.Fatalf("WaitApplied: %v", err)
	}
	for _, n := range nodes {
		if got, ok := n.Store().GetExchange(x.ID); !ok || got.Version != written.Version {
			t.Errorf("%s has %+v, %v after WaitApplied; want version %d", n.cfg.NodeName, got, ok, written.Version)
		}
	}
	if _, err := follower.PutExchange(ctx, x, 0); !errors.Is(err, store.ErrConflict) {
		t.Errorf("forwarded exchange put with a stale version: err = %v, want ErrConflict", err)
	}
	if err := follower.DeleteExchange(ctx, x.ID, written.Version); err != nil {
		t.Fatalf("exchange delete through a follower: %v", err)
	}

	// An index nobody reaches: the wait ends with an error naming the
	// proxies, bounded by maxWaitApplied.
	start := time.Now()
	if err := leader.Peers().WaitApplied(ctx, written.Version+1000); err == nil {
		t.Error("WaitApplied for an index never written returned no error")
	}
	// The bound leaves a loaded machine its slowness; without one the
	// wait would last the context's minute.
	if waited := time.Since(start); waited > maxWaitApplied+10*time.Second {
		t.Errorf("WaitApplied waited %v, want at most about %v", waited, maxWaitApplied)
	}
}
