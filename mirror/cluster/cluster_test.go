package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

func TestClusterFormsAndReplicates(t *testing.T) {
	nodes := startCluster(t, 3)
	want := names(nodes)

	for _, n := range nodes {
		members := n.Members()
		var got []string
		for _, m := range members {
			got = append(got, m.Name)
			peer := nodes[slices.Index(want, m.Name)]
			if m.Raft != peer.LocalMember().Raft || m.Backend != m.Name || m.AMQP != "127.0.0.1:5672" || m.Expect != 3 {
				t.Errorf("%s sees %+v, want the tags %s publishes", n.cfg.NodeName, m, m.Name)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s sees members %v, want %v", n.cfg.NodeName, got, want)
		}
		if !n.Majority() {
			t.Errorf("%s: Majority() = false in a healthy cluster", n.cfg.NodeName)
		}
	}

	for _, n := range nodes {
		want := int32(0)
		if n.cfg.NodeName == "rabbit1" {
			want = 1 // the lowest name
		}
		if got := n.bootstraps.Load(); got != want {
			t.Errorf("%s bootstrapped %d times, want %d", n.cfg.NodeName, got, want)
		}
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		for _, m := range nodes[2].Members() {
			if !m.InLog {
				return fmt.Errorf("%s does not publish that it is in the log", m.Name)
			}
		}
		return nil
	})

	leader := waitLeader(t, nodes)
	if got, ok := nodes[1].Leader(); !ok || got.Name != leader.cfg.NodeName || got.Admin != "127.0.0.1:15680" {
		t.Errorf("Leader() = %+v, %v; want member %s", got, ok, leader.cfg.NodeName)
	}
	written := put(t, leader, queueMeta("queue_1", "rabbit1", "rabbit2", "rabbit3"))
	waitReplicated(t, nodes, written)

	for _, n := range without(nodes, leader) {
		_, err := n.Store().Put(context.Background(), queueMeta("queue_2", "rabbit2"), 0)
		if !errors.Is(err, store.ErrNotLeader) {
			t.Errorf("put on follower %s's own store: err = %v, want ErrNotLeader", n.cfg.NodeName, err)
		}
	}
}

// A write through any node reaches the leader, with the store's errors.
func TestWritesFromFollowersReachTheLeader(t *testing.T) {
	nodes := startCluster(t, 3)
	leader := waitLeader(t, nodes)
	follower := without(nodes, leader)[0]
	ctx := context.Background()

	written, err := follower.Put(ctx, queueMeta("queue_1", "rabbit2", "rabbit3"), 0)
	if err != nil {
		t.Fatalf("put through follower %s: %v", follower.cfg.NodeName, err)
	}
	if written.Version == 0 || written.Master != "rabbit2" {
		t.Errorf("put through a follower returned %+v, want the record with its version", written)
	}
	waitReplicated(t, nodes, written)

	if _, err := follower.Put(ctx, queueMeta("queue_1", "rabbit3"), 0); !errors.Is(err, store.ErrConflict) {
		t.Errorf("forwarded put with a stale version: err = %v, want ErrConflict", err)
	}
	if err := follower.Delete(ctx, written.ID, written.Version+1); !errors.Is(err, store.ErrConflict) {
		t.Errorf("forwarded delete with a wrong version: err = %v, want ErrConflict", err)
	}
	promoted := written.Clone()
	promoted.Master, promoted.Slaves, promoted.Epoch = "rabbit3", promoted.Slaves[1:], 1
	second, err := leader.Put(ctx, promoted, written.Version)
	if err != nil {
		t.Fatalf("put through the leader: %v", err)
	}
	if err := follower.Delete(ctx, second.ID, second.Version); err != nil {
		t.Fatalf("delete through a follower: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		for _, n := range nodes {
			if _, ok := n.Store().Get(written.ID); ok {
				return errors.New(n.cfg.NodeName + " still has the deleted queue")
			}
		}
		return nil
	})

	expired, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := follower.Put(expired, queueMeta("queue_2", "rabbit1"), 0); !errors.Is(err, context.Canceled) {
		t.Errorf("forwarded put with a cancelled context: err = %v, want context.Canceled", err)
	}
}

// A dead node (its proxy killed, no leave) is noticed within about a
// second, keeps its vote, and catches up when it comes back with its data,
// on the same raft port or on another one (the leader updates its voter's
// address).
func TestFailedNodeKeepsItsVoteAndCatchesUp(t *testing.T) {
	tests := []struct {
		name        string
		newRaftPort bool
	}{
		{name: "same addresses"},
		{name: "raft on a new port", newRaftPort: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { testFailedNode(t, tt.newRaftPort) })
	}
}

func testFailedNode(t *testing.T, newRaftPort bool) {
	nodes := startCluster(t, 3)
	all := names(nodes)
	leader := waitLeader(t, nodes)
	before := put(t, leader, queueMeta("before", "rabbit1"))
	waitReplicated(t, nodes, before)
	survivors := without(nodes, leader)

	killed := time.Now()
	if err := leader.Shutdown(); err != nil {
		t.Fatalf("shutdown of the leader: %v", err)
	}
	for _, n := range survivors {
		noticed := waitEvent(t, n, EventFail, leader.cfg.NodeName, 5*time.Second)
		detection := noticed.Sub(killed)
		t.Logf("%s noticed the failure of %s after %v", n.cfg.NodeName, leader.cfg.NodeName, detection)
		// The goal is about a second (probe interval 200ms, timeout 100ms,
		// suspicion 2×200ms); the bound leaves room for a machine loaded by
		// the rest of the suite, and is still below memberlist's LAN
		// defaults (about five seconds).
		if detection > 4*time.Second {
			t.Errorf("%s noticed the failure after %v, want about a second", n.cfg.NodeName, detection)
		}
	}
	newLeader := waitLeader(t, survivors)
	t.Logf("new leader %s elected %v after the kill", newLeader.cfg.NodeName, time.Since(killed))
	if elapsed := time.Since(killed); elapsed > 10*time.Second {
		t.Errorf("new leader after %v, want within a few seconds", elapsed)
	}
	// The reconciliation runs at once on a new leader and on the failure
	// event; give it a few passes, then check the dead node still votes.
	waitMembers(t, survivors, names(survivors), []string{leader.cfg.NodeName})
	waitVoters(t, survivors, all)
	missed := put(t, newLeader, queueMeta("missed", "rabbit2", "rabbit3"))
	waitReplicated(t, survivors, missed)

	back := leader.restart(t, newRaftPort, survivors[0].LocalMember().Gossip)
	if newRaftPort && back.LocalMember().Raft == leader.LocalMember().Raft {
		t.Fatalf("restarted on the same raft address %s", back.LocalMember().Raft)
	}
	// What the node missed is in its reads as soon as WaitLeader returns
	// (it asks the leader for its commit index): a proxy that restarts
	// must not serve from the metadata it had before.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := back.Store().WaitLeader(ctx); err != nil {
		t.Fatalf("WaitLeader on the restarted node: %v", err)
	}
	if got, ok := back.Store().Get(missed.ID); !ok || got.Version != missed.Version {
		t.Errorf("right after WaitLeader the restarted node reads %+v (found %t), want version %d", got, ok, missed.Version)
	}
	nodes = append(survivors, back)
	waitMembers(t, nodes, all, nil)
	waitReplicated(t, nodes, missed)
	waitReplicated(t, nodes, before)
	waitVoters(t, nodes, all)
	testutil.Eventually(t, 10*time.Second, func() error {
		voters, err := newLeader.Store().Voters()
		if err != nil {
			return err
		}
		for _, v := range voters {
			if v.ID == back.cfg.NodeName && v.Address != back.LocalMember().Raft {
				return fmt.Errorf("voter %s at %s, want %s", v.ID, v.Address, back.LocalMember().Raft)
			}
		}
		return nil
	})
	waitLeader(t, nodes)
}

// A graceful leave removes the node's vote, so the quorum shrinks with it:
// the two that stay still commit, and one more could leave or fail.
func TestLeaveRemovesVoter(t *testing.T) {
	tests := []struct {
		name   string
		leader bool // the leaving node leads the log
	}{
		{name: "follower leaves"},
		{name: "leader leaves", leader: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := startCluster(t, 3)
			leader := waitLeader(t, nodes)
			leaving := leader
			if !tt.leader {
				leaving = without(nodes, leader)[0]
			}
			stay := without(nodes, leaving)

			if err := leaving.Leave(); err != nil {
				t.Fatalf("Leave: %v", err)
			}
			for _, n := range stay {
				waitEvent(t, n, EventLeave, leaving.cfg.NodeName, 5*time.Second)
			}
			testutil.Eventually(t, 5*time.Second, func() error {
				for _, n := range stay {
					for _, m := range n.Members() {
						if m.Name == leaving.cfg.NodeName && m.Status != StatusLeft {
							return errors.New(n.cfg.NodeName + " sees the leaver as " + m.Status.String())
						}
					}
				}
				return nil
			})
			waitVoters(t, stay, names(stay))
			written := put(t, waitLeader(t, stay), queueMeta("after_leave", stay[0].cfg.NodeName))
			waitReplicated(t, stay, written)
		})
	}
}

// A node started later without BootstrapExpect joins the existing log: the
// leader adds its voter when serf reports it alive, and raft sends it the
// metadata written before it came.
func TestJoiningNodeBecomesVoter(t *testing.T) {
	nodes := startCluster(t, 3)
	leader := waitLeader(t, nodes)
	written := put(t, leader, queueMeta("queue_1", "rabbit1", "rabbit2"))

	late := startNode(t, newConfig(t, "rabbit4", 0, nodes[2].LocalMember().Gossip))
	nodes = append(nodes, late)
	waitMembers(t, nodes, names(nodes), nil)
	waitVoters(t, nodes, names(nodes))
	waitReplicated(t, nodes, written)
	if !late.Majority() {
		t.Errorf("the joined node: Majority() = false")
	}
}

// A node started later with the cluster's BootstrapExpect, and a name
// lower than every member's, sees members already in a log: it waits to be
// added instead of bootstrapping a configuration of its own.
func TestLateNodeWithBootstrapExpectJoins(t *testing.T) {
	nodes := startCluster(t, 3)
	written := put(t, nodes[0], queueMeta("queue_1", "rabbit1"))

	late := startNode(t, newConfig(t, "rabbit0", 3, nodes[1].LocalMember().Gossip))
	nodes = append(nodes, late)
	waitMembers(t, nodes, names(nodes), nil)
	waitVoters(t, nodes, names(nodes))
	waitReplicated(t, nodes, written)
	if got := late.bootstraps.Load(); got != 0 {
		t.Errorf("the late node bootstrapped %d times, want 0", got)
	}
}

// Members that disagree on BootstrapExpect never bootstrap: one of them
// was started with the wrong cluster size, and bootstrapping with either
// number could form a cluster the other nodes do not expect.
func TestBootstrapExpectMismatch(t *testing.T) {
	first := startNode(t, newConfig(t, "rabbit1", 2))
	second := startNode(t, newConfig(t, "rabbit2", 3, first.LocalMember().Gossip))
	nodes := []*testNode{first, second}
	waitMembers(t, nodes, names(nodes), nil)
	// Run the bootstrap decision now that both see each other, rather
	// than waiting for the passes the join events start.
	for _, n := range nodes {
		n.maybeBootstrap(n.Members())
	}
	for _, n := range nodes {
		if got := voterNames(t, n); len(got) != 0 {
			t.Errorf("%s has voters %v, want none", n.cfg.NodeName, got)
		}
		if n.Majority() {
			t.Errorf("%s: Majority() = true without a log", n.cfg.NodeName)
		}
	}
}
