package cluster

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Catching up after a restart. A node that restarts has the metadata it
// had when it stopped, and raft applies the rest only once the leader has
// told it what is committed; its proxy must not serve from the stale copy
// (route a publish to a master since replaced, or adopt a queue the log
// already holds). So Store().WaitLeader on a follower asks the leader how
// far it has applied the log, a call like the others between proxies, and
// waits until this node has applied that far.

// appliedIndexCall is the kind of the call that asks the leader how far it
// has applied the log.
const appliedIndexCall = "applied-index"

// handleAppliedIndex answers appliedIndexCall, on the leader only: a
// follower may lag.
func (c *Cluster) handleAppliedIndex() {
	c.peers.calls.Store(appliedIndexCall, callHandler(func(context.Context, []byte) ([]byte, error) {
		if !c.store.IsLeader() {
			return nil, store.ErrNotLeader
		}
		return json.Marshal(c.store.AppliedIndex())
	}))
}

// leaderAppliedIndex asks the leader this node knows how far it has
// applied the log.
func (c *Cluster) leaderAppliedIndex(ctx context.Context) (uint64, error) {
	leader, ok := c.Leader()
	if !ok {
		return 0, fmt.Errorf("%w: no leader known among the members", store.ErrNotLeader)
	}
	payload, err := c.peers.call(ctx, leader.Name, appliedIndexCall, nil)
	if err != nil {
		return 0, fmt.Errorf("asking leader %s how far it applied the log: %w", leader.Name, err)
	}
	var index uint64
	if err := json.Unmarshal(payload, &index); err != nil {
		return 0, fmt.Errorf("the applied index of leader %s: %w", leader.Name, err)
	}
	return index, nil
}
