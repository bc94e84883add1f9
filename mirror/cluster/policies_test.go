package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

func haPolicy(t *testing.T, name, pattern string) *config.Policy {
	t.Helper()
	p, err := config.Policy{Name: name, VHost: "/", Pattern: pattern, ApplyTo: config.ApplyQueues, Definition: config.Definition{HAMode: config.HAAll}}.Validated(false)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

func policyNames(r store.RuntimePolicies) string {
	var out []string
	for _, p := range r.Policies {
		out = append(out, p.Name)
	}
	return fmt.Sprint(out)
}

// changePolicies changes the runtime policies through n, retrying while an
// election on a loaded machine leaves no leader.
func changePolicies(t *testing.T, n *testNode, change store.PolicyChange) store.PolicyResult {
	t.Helper()
	var res store.PolicyResult
	testutil.Eventually(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		res, err = n.ChangePolicies(ctx, change)
		return err
	})
	return res
}

// Runtime policies go through the log from any node: the node that made
// the change shows it when the call returns (it waited for its own copy
// of the log), the others within moments, and every node holds the same
// list in the same order.
func TestPolicyChangesFromAnyNode(t *testing.T) {
	nodes := startCluster(t, 3)
	leader := waitLeader(t, nodes)
	followers := without(nodes, leader)

	set := changePolicies(t, followers[0], store.PolicyChange{Op: store.PolicySet, Policy: haPolicy(t, "ha-all", "^queue_")})
	written := time.Now()
	if got := followers[0].Store().Policies(); got.Index != set.Index || policyNames(got) != "[ha-all]" {
		t.Errorf("the follower that set the policy reads %s at index %d when the call returns, want [ha-all] at %d", policyNames(got), got.Index, set.Index)
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		for _, n := range nodes {
			if got := n.Store().Policies(); policyNames(got) != "[ha-all]" || got.Index != set.Index {
				return fmt.Errorf("%s has %s at index %d, want [ha-all] at %d", n.cfg.NodeName, policyNames(got), got.Index, set.Index)
			}
		}
		return nil
	})
	t.Logf("every node had the policy %v after the set returned", time.Since(written))

	changePolicies(t, leader, store.PolicyChange{Op: store.PolicySet, Policy: haPolicy(t, "ha-two", "^two_")})
	res := changePolicies(t, followers[1], store.PolicyChange{Op: store.PolicyClear, VHost: "/", Name: "ha-all"})
	testutil.Eventually(t, 5*time.Second, func() error {
		for _, n := range nodes {
			if got := n.Store().Policies(); policyNames(got) != "[ha-two]" || got.Index != res.Index {
				return fmt.Errorf("%s has %s at index %d, want [ha-two] at %d", n.cfg.NodeName, policyNames(got), got.Index, res.Index)
			}
		}
		return nil
	})

	tests := []struct {
		name        string
		through     *testNode
		change      store.PolicyChange
		wantErr     error
		wantChanged bool
	}{
		{name: "clear of a missing policy through a follower", through: followers[0],
			change: store.PolicyChange{Op: store.PolicyClear, VHost: "/", Name: "ha-all"}, wantErr: config.ErrPolicyNotFound},
		{name: "clear of a missing policy on the leader", through: leader,
			change: store.PolicyChange{Op: store.PolicyClear, VHost: "/", Name: "nope"}, wantErr: config.ErrPolicyNotFound},
		{name: "import once the log has policies", through: followers[1],
			change: store.PolicyChange{Op: store.PolicyImport, Import: &store.RuntimePolicies{Policies: []config.Policy{*haPolicy(t, "old", "^old_")}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			got, err := tt.through.ChangePolicies(ctx, tt.change)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if got.Changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", got.Changed, tt.wantChanged)
			}
			if names := policyNames(tt.through.Store().Policies()); names != "[ha-two]" {
				t.Errorf("policies after it = %s, want [ha-two] unchanged", names)
			}
		})
	}
}

// A node cut off from the majority cannot change the runtime policies: the
// change fails with ErrNotLeader and is not applied there or anywhere.
func TestPolicyChangeInMinorityFails(t *testing.T) {
	nodes := startCluster(t, 3)
	leader := waitLeader(t, nodes)
	isolated := without(nodes, leader)[0]
	majority := without(nodes, isolated)
	partition([]*testNode{isolated}, majority)
	testutil.Eventually(t, 5*time.Second, func() error {
		if isolated.Majority() {
			return errors.New("the isolated node still reports a majority")
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	began := time.Now()
	_, err := isolated.ChangePolicies(ctx, store.PolicyChange{Op: store.PolicySet, Policy: haPolicy(t, "minority", "^m_")})
	if !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("set_policy on the minority side: err = %v, want ErrNotLeader", err)
	}
	t.Logf("the minority's set_policy failed after %v: %v", time.Since(began), err)
	for _, n := range nodes {
		if got := n.Store().Policies(); got.Index != 0 {
			t.Errorf("%s has runtime policies %s at index %d after a refused change, want none", n.cfg.NodeName, policyNames(got), got.Index)
		}
	}
}

// Deleting a queue leaves a tombstone on every node (with the backends
// that held a copy); declaring it again removes the tombstone everywhere.
func TestDeleteLeavesTombstoneOnEveryNode(t *testing.T) {
	nodes := startCluster(t, 3)
	leader := waitLeader(t, nodes)
	follower := without(nodes, leader)[0]
	written := put(t, follower, queueMeta("queue_1", "rabbit1", "rabbit2", "rabbit3"))
	waitReplicated(t, nodes, written)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := follower.Delete(ctx, written.ID, written.Version); err != nil {
		t.Fatalf("delete through %s: %v", follower.cfg.NodeName, err)
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		for _, n := range nodes {
			ts, ok := n.Store().Tombstone(written.ID)
			if !ok || fmt.Sprint(ts.Backends) != "[rabbit1 rabbit2 rabbit3]" || ts.At.IsZero() {
				return fmt.Errorf("%s: tombstone %+v (present %v), want one naming rabbit1, rabbit2, rabbit3 with a time", n.cfg.NodeName, ts, ok)
			}
		}
		return nil
	})
	again := put(t, leader, queueMeta("queue_1", "rabbit2"))
	waitReplicated(t, nodes, again)
	for _, n := range nodes {
		if ts, ok := n.Store().Tombstone(written.ID); ok {
			t.Errorf("%s keeps the tombstone %+v of a queue declared again", n.cfg.NodeName, ts)
		}
	}
}

// Every survivor of a node failure proposes the same promotion at once
// (serf tells them all within a second): the log takes exactly one, the
// others get ErrConflict, and all nodes end with the same master and epoch.
func TestConcurrentPromotionsOneWins(t *testing.T) {
	nodes := startCluster(t, 3)
	written := put(t, nodes[0], queueMeta("queue_2", "rabbit2", "rabbit3", "rabbit1"))
	waitReplicated(t, nodes, written)

	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i, n := range nodes {
		proposal := written.Clone()
		// Each node proposes a different new master, as proxies with
		// different views of liveness might.
		proposal.Master, proposal.Epoch = []string{"rabbit3", "rabbit1", "rabbit3"}[i], written.Epoch+1
		proposal.Slaves = nil
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, errs[i] = n.Put(ctx, proposal, written.Version)
		}()
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrConflict):
			t.Errorf("%s's proposal: err = %v, want nil or ErrConflict", nodes[i].cfg.NodeName, err)
		}
	}
	if won != 1 {
		t.Errorf("%d proposals committed, want exactly 1 (errors %v)", won, errs)
	}
	final, _ := waitLeader(t, nodes).Store().Get(written.ID)
	waitReplicated(t, nodes, final)
	if final.Epoch != written.Epoch+1 {
		t.Errorf("epoch after the promotion = %d, want %d", final.Epoch, written.Epoch+1)
	}
}
