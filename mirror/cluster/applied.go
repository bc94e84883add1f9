package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Bindings take effect everywhere before the client hears of them. A
// publish to an exchange goes only to the backends holding a queue it
// routes to, by each proxy's own copy of the log; a binding recorded
// through one proxy must be applied by every other before its bind-ok
// reaches the client, or a publish through a proxy that lags (raft tells
// a follower what is committed only with its next message) could leave out
// the queue just bound, which RabbitMQ would have delivered to.

// waitAppliedCall is the kind of the call that asks a proxy to answer once
// it has applied the log up to an index.
const waitAppliedCall = "wait-applied"

// maxWaitApplied bounds the wait for the other proxies: one that does not
// answer by then is frozen or cut off (and paused, or soon judged failed by
// serf), not lagging.
const maxWaitApplied = 2 * time.Second

func (c *Cluster) handleWaitApplied() { c.peers.HandleWaitApplied(c.store.WaitApplied) }

// HandleWaitApplied sets the function that waits until this proxy has
// applied the log up to an index, for other proxies' WaitApplied: the
// store's by default, the engine's (which also shows it to the routing of
// publishes) once it runs.
func (p *Peers) HandleWaitApplied(f func(ctx context.Context, index uint64) error) {
	p.calls.Store(waitAppliedCall, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var index uint64
		if err := json.Unmarshal(payload, &index); err != nil {
			return nil, fmt.Errorf("decoding a wait for the applied index: %w", err)
		}
		return nil, f(ctx, index)
	}))
}

// WaitApplied returns once every other alive proxy has applied the log up
// to index, or after maxWaitApplied with an error naming those that had
// not answered.
func (p *Peers) WaitApplied(ctx context.Context, index uint64) error {
	ctx, cancel := context.WithTimeout(ctx, maxWaitApplied)
	defer cancel()
	payload, err := json.Marshal(index)
	if err != nil {
		return err
	}
	addrs := *p.addrs.Load()
	errs := make(chan error, len(addrs))
	for node := range addrs {
		go func() {
			if _, err := p.call(ctx, node, waitAppliedCall, payload); err != nil {
				errs <- fmt.Errorf("%s: %w", node, err)
				return
			}
			errs <- nil
		}()
	}
	var failed []error
	for range addrs {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("waiting for the other proxies to apply index %d: %w", index, errors.Join(failed...))
	}
	return nil
}
