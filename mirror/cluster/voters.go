package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Voters follow membership as in Consul: serf says who exists, the raft
// leader turns that into configuration changes, one at a time through the
// log.
//
//   - alive member with a raft address, not a voter (or at another address):
//     the leader adds it (AddVoter also updates a changed address);
//   - member that left gracefully, or was reaped after ReconnectTimeout:
//     the leader removes its voter, and the quorum shrinks with it;
//   - failed member: nothing. It keeps its vote, so a failure never shrinks
//     the quorum: with five voters, two sides of a partition cannot each
//     shrink the quorum to their own size and elect two leaders.
//
// reconcileLoop runs on every node, but only the leader changes voters; the
// others only bootstrap (once, see maybeBootstrap). It runs after each serf
// event, each leadership change and every ReconcileInterval, so an event
// missed during an election is handled by the next leader's first pass.
func (c *Cluster) reconcileLoop() {
	defer c.wg.Done()
	leaderChanges, stopLeaderChanges := c.store.LeaderChanges()
	defer stopLeaderChanges()
	ticker := time.NewTicker(c.cfg.ReconcileInterval)
	defer ticker.Stop()
	wasLeading := false
	for {
		select {
		case <-c.stop:
			return
		case <-c.reconcile:
		case <-leaderChanges:
		case <-ticker.C:
		}
		members := c.Members()
		c.maybeBootstrap(members)
		leading := c.store.IsLeader()
		if leading != wasLeading {
			c.log.Info("metadata log leadership", "leading", leading)
			wasLeading = leading
		}
		if leading {
			c.reconcileVoters(members)
		}
	}
}

func (c *Cluster) reconcileVoters(members []Member) {
	voters, err := c.store.Voters()
	if err != nil {
		c.log.Warn("reading voters", "error", err)
		return
	}
	address := make(map[string]string, len(voters))
	for _, v := range voters {
		address[v.ID] = v.Address
	}
	status := make(map[string]Status, len(members))
	for _, m := range members {
		status[m.Name] = m.Status
		switch {
		case m.Raft == "":
			// Not a proxy of this cluster (no raft tag): never a voter.
		case m.Status == StatusAlive && address[m.Name] != m.Raft:
			if err := c.provesMember(m); err != nil {
				c.refuseVoter(m, err)
				continue
			}
			c.changeVoters("adding voter", m.Name, c.store.AddVoter(store.Voter{ID: m.Name, Address: m.Raft}))
		case m.Status == StatusLeft && address[m.Name] != "" && m.Name != c.cfg.NodeName:
			c.changeVoters("removing voter of a member that left", m.Name, c.store.RemoveVoter(m.Name))
		}
	}

	c.mu.Lock()
	reaped := make([]string, 0, len(c.reaped))
	for name := range c.reaped {
		reaped = append(reaped, name)
	}
	c.mu.Unlock()
	for _, name := range reaped {
		if s, known := status[name]; known && s == StatusAlive {
			continue // back again
		}
		if address[name] != "" && name != c.cfg.NodeName {
			err := c.store.RemoveVoter(name)
			c.changeVoters("removing voter of a reaped member", name, err)
			if err != nil {
				continue
			}
		}
		c.mu.Lock()
		delete(c.reaped, name)
		c.mu.Unlock()
	}
}

// proveTimeout bounds the TLS handshake that proves a member.
const proveTimeout = 3 * time.Second

// provesMember checks, when the raft port runs mutual TLS, that m's raft
// address answers with a member's certificate before m gets a vote.
// Gossip may admit a process that holds the gossip key alone; without this
// check the leader would make it a voter that can never answer raft (its
// peers refuse it), which raises the quorum until it is removed, and a few
// of them would stop every write. Without TLS nothing is proved: every
// gossiping member is trusted, as the doc says.
func (c *Cluster) provesMember(m Member) error {
	if c.cfg.RaftTLS == nil || m.Name == c.cfg.NodeName {
		return nil
	}
	conn, err := c.raftLayer.Dial(raft.ServerAddress(m.Raft), proveTimeout)
	if err != nil {
		return err
	}
	return conn.Close()
}

// refuseVoter logs, once per member and address, that m gets no vote.
func (c *Cluster) refuseVoter(m Member, err error) {
	c.mu.Lock()
	first := c.refusedVoters[m.Name] != m.Raft
	c.refusedVoters[m.Name] = m.Raft
	c.mu.Unlock()
	if first {
		c.log.Warn("not a voter: its raft port did not show a member's certificate", "member", m.Name, "raft", m.Raft, "error", err)
	}
}

func (c *Cluster) changeVoters(what, member string, err error) {
	if err != nil {
		// Lost leadership or timed out; the next leader's pass retries.
		c.log.Warn(what, "member", member, "error", err)
		return
	}
	c.log.Info(what, "member", member)
}

// maybeBootstrap forms a new cluster, once, the bootstrap_expect way: when
// BootstrapExpect alive members with the same BootstrapExpect are seen, and
// none of them is in a log already, the one with the lowest name
// bootstraps the log with all of them as voters; the others wait without a
// configuration (a node without one never starts an election) until that
// leader contacts them. A single bootstrapper cannot race another with a
// different member list. Split brain would need two groups of
// BootstrapExpect fresh nodes that do not gossip with each other, which
// the operator rules out by giving every node of a cluster its size.
//
// Members with BootstrapExpect 0 are not counted: they join a log that
// exists. A node that sees a member already in a log (tag in_log) does not
// bootstrap either, whatever its BootstrapExpect: a cluster exists, and
// its leader will add this node. Once this node's log has a configuration
// it says so in its own tags.
func (c *Cluster) maybeBootstrap(members []Member) {
	c.mu.Lock()
	done := c.bootstrapped
	c.mu.Unlock()
	if done {
		return
	}
	voters, err := c.store.Voters()
	if err != nil {
		return
	}
	if len(voters) > 0 {
		c.markInLog()
		return
	}
	expect := c.cfg.BootstrapExpect
	if expect == 0 {
		return
	}
	var peers []store.Voter
	for _, m := range members {
		if m.Status != StatusAlive || m.Raft == "" {
			continue
		}
		if m.InLog {
			return // a cluster exists: wait to be added
		}
		if m.Expect == 0 {
			continue // waits to be added once a leader exists
		}
		if err := c.provesMember(m); err != nil {
			c.refuseVoter(m, err)
			continue
		}
		if m.Expect != expect {
			c.log.Error("not bootstrapping: members disagree on bootstrap_expect",
				"member", m.Name, "its_expect", m.Expect, "our_expect", expect)
			return
		}
		peers = append(peers, store.Voter{ID: m.Name, Address: m.Raft})
	}
	if len(peers) < expect {
		return
	}
	slices.SortFunc(peers, func(a, b store.Voter) int { return strings.Compare(a.ID, b.ID) })
	if peers[0].ID != c.cfg.NodeName {
		return // the lowest name bootstraps; this node waits to be contacted
	}
	if err := c.peersOutsideALog(peers); err != nil {
		c.log.Info("not bootstrapping yet", "reason", err)
		return // the next pass decides again
	}
	err = c.store.Bootstrap(peers)
	switch {
	case err == nil:
		c.bootstraps.Add(1)
		c.log.Info("bootstrapped the metadata log", "voters", len(peers))
	case errors.Is(err, raft.ErrCantBootstrap):
	default:
		c.log.Error("bootstrapping the metadata log", "error", err)
		return
	}
	c.markInLog()
}

// inLogCall is the kind of the call that asks a proxy whether its log has
// a configuration (it is a voter of a cluster, or was).
const inLogCall = "in-log"

// handleInLog answers inLogCall.
func (c *Cluster) handleInLog() {
	c.peers.calls.Store(inLogCall, callHandler(func(context.Context, []byte) ([]byte, error) {
		voters, err := c.store.Voters()
		if err != nil {
			return nil, err
		}
		return json.Marshal(len(voters) > 0)
	}))
}

// peersOutsideALog asks every other peer of a bootstrap whether its log
// has a configuration already, and returns an error when one has, or does
// not answer. The in_log tag says so too, but gossip carries a tag change
// in its own time: a node that joins a formed cluster may see the members
// before their tags, and bootstrap a second configuration beside theirs.
func (c *Cluster) peersOutsideALog(peers []store.Voter) error {
	ctx, cancel := context.WithTimeout(context.Background(), inLogTimeout)
	defer cancel()
	for _, p := range peers {
		if p.ID == c.cfg.NodeName {
			continue
		}
		raw, err := c.peers.call(ctx, p.ID, inLogCall, nil)
		if err != nil {
			return fmt.Errorf("asking %s whether it is in a log: %w", p.ID, err)
		}
		var inLog bool
		if err := json.Unmarshal(raw, &inLog); err != nil {
			return fmt.Errorf("%s's answer: %w", p.ID, err)
		}
		if inLog {
			return fmt.Errorf("%s is in a log already: this node waits to be added", p.ID)
		}
	}
	return nil
}

// inLogTimeout bounds the calls of peersOutsideALog.
const inLogTimeout = 3 * time.Second

// markInLog records that this node's log has a configuration, here and in
// its serf tags.
func (c *Cluster) markInLog() {
	c.mu.Lock()
	c.bootstrapped = true
	c.tags[tagInLog] = "1"
	tags := maps.Clone(c.tags)
	c.mu.Unlock()
	if err := c.serf.SetTags(tags); err != nil {
		c.log.Warn("publishing that this node is in the log", "error", err)
	}
}
