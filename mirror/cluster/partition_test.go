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
