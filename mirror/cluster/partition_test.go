package cluster

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// partition cuts all gossip and raft traffic between the two groups.
func partition(a, b []*testNode) {
	for _, n := range a {
		n.net.cut(addresses(b)...)
	}
	for _, n := range b {
		n.net.cut(addresses(a)...)
	}
}

func addresses(nodes []*testNode) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.LocalMember().Gossip, n.LocalMember().Raft)
	}
	return out
}

// A node cut off from the other two is a minority: it loses its leader
// (or its leadership), cannot write, and says so through Majority; the
// two others elect a leader if they need one and go on writing. When the
// partition heals, the minority receives what it missed.
func TestPartitionMinorityCannotWrite(t *testing.T) {
	tests := []struct {
		name      string
		cutLeader bool
	}{
		{name: "leader cut off", cutLeader: true},
		{name: "follower cut off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := startCluster(t, 3)
			all := names(nodes)
			leader := waitLeader(t, nodes)
			isolated := without(nodes, leader)[0]
			if tt.cutLeader {
				isolated = leader
			}
			majority := without(nodes, isolated)
			before := put(t, leader, queueMeta("before", "rabbit1", "rabbit2"))
			waitReplicated(t, nodes, before)

			cut := time.Now()
			partition([]*testNode{isolated}, majority)
			testutil.Eventually(t, 5*time.Second, func() error {
				if isolated.Majority() {
					return errors.New("the isolated node still reports a majority")
				}
				return nil
			})
			t.Logf("%s knew it was a minority %v after the cut", isolated.cfg.NodeName, time.Since(cut))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := isolated.Store().Put(ctx, queueMeta("minority", isolated.cfg.NodeName), 0); !errors.Is(err, store.ErrNotLeader) {
				t.Errorf("put on the minority side's store: err = %v, want ErrNotLeader", err)
			}
			if _, err := isolated.Put(ctx, queueMeta("minority", isolated.cfg.NodeName), 0); !errors.Is(err, store.ErrNotLeader) {
				t.Errorf("put through the minority side's cluster: err = %v, want ErrNotLeader", err)
			}

			newLeader := waitLeader(t, majority)
			t.Logf("majority led by %s %v after the cut", newLeader.cfg.NodeName, time.Since(cut))
			for _, n := range majority {
				if !n.Majority() {
					t.Errorf("%s on the majority side: Majority() = false", n.cfg.NodeName)
				}
			}
			majorityCtx, cancelMajority := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancelMajority()
			during, err := without(majority, newLeader)[0].Put(majorityCtx, queueMeta("during", "rabbit3", "rabbit1"), 0)
			if err != nil {
				t.Fatalf("put through the majority's follower: %v", err)
			}
			waitReplicated(t, majority, during)
			if _, ok := isolated.Store().Get(during.ID); ok {
				t.Errorf("the isolated node has %s, written after the cut", during.ID)
			}
			// The majority sees the isolated node fail, and it keeps its vote.
			waitMembers(t, majority, names(majority), []string{isolated.cfg.NodeName})
			if got := voterNames(t, newLeader); !slices.Equal(got, all) {
				t.Errorf("voters during the partition = %v, want %v: a failure must not shrink the quorum", got, all)
			}

			for _, n := range nodes {
				n.net.heal()
			}
			healed := time.Now()
			waitReplicated(t, nodes, during)
			waitLeader(t, nodes)
			for _, n := range nodes {
				if !n.Majority() {
					t.Errorf("%s after the heal: Majority() = false", n.cfg.NodeName)
				}
			}
			t.Logf("log healed %v after the partition ended", time.Since(healed))
			waitMembers(t, nodes, all, nil)
			t.Logf("membership healed %v after the partition ended", time.Since(healed))
			waitVoters(t, nodes, all)
		})
	}
}

// contactLimit is the engine's limit on a follower's silence from the leader
// (engine.leaderContactLimit).
const contactLimit = 400 * time.Millisecond

// A node cut off from the other two knows that it has lost contact with the log's
// leader (Store.InContact) before the majority can act on its failure (serf's verdict,
// held for memberFailedFor): the engine holds its deliveries from then on, so that the
// majority's promotions never race deliveries of the cut-off node's deposed masters.
func TestCutOffNodeLosesContactBeforeTheMajorityActs(t *testing.T) {
	for _, cutLeader := range []bool{true, false} {
		name := "follower cut off"
		if cutLeader {
			name = "leader cut off"
		}
		t.Run(name, func(t *testing.T) {
			nodes := startCluster(t, 3)
			leader := waitLeader(t, nodes)
			isolated := without(nodes, leader)[0]
			if cutLeader {
				isolated = leader
			}
			majority := without(nodes, isolated)
			testutil.Eventually(t, 5*time.Second, func() error {
				if !isolated.Store().InContact(contactLimit) {
					return errors.New("the node to be cut off is not in contact with the leader yet")
				}
				return nil
			})

			cut := time.Now()
			partition([]*testNode{isolated}, majority)
			var lostContact, judged time.Duration
			deadline := time.Now().Add(30 * time.Second)
			for (lostContact == 0 || judged == 0) && time.Now().Before(deadline) {
				if lostContact == 0 && !isolated.Store().InContact(contactLimit) {
					lostContact = time.Since(cut)
				}
				if judged == 0 && failedBy(majority[0], isolated.cfg.NodeName) {
					judged = time.Since(cut)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if lostContact == 0 || judged == 0 {
				t.Fatalf("30s after the cut: lost contact after %v, judged failed after %v (0: not yet)", lostContact, judged)
			}
			t.Logf("the cut-off node lost contact with the leader %v after the cut; the majority judged it failed after %v, and acts %v later",
				lostContact.Round(time.Millisecond), judged.Round(time.Millisecond), memberFailedFor)
			if acts := judged + memberFailedFor; lostContact >= acts {
				t.Errorf("the cut-off node lost contact %v after the cut, not before the majority acts (%v): its deliveries would race the promotion", lostContact, acts)
			}
			for _, n := range nodes {
				n.net.heal()
			}
		})
	}
}

// failedBy reports whether n's serf holds the member named name failed.
func failedBy(n *testNode, name string) bool {
	for _, m := range n.Members() {
		if m.Name == name {
			return m.Status == StatusFailed
		}
	}
	return false
}
