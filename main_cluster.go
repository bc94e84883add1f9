package main

// The sidecar cluster in serve: with cluster.bind set, the proxy joins the
// other proxies (mirror/cluster: serf membership, a raft voter of the
// metadata log) instead of keeping a single-voter log of its own, hands
// its engine the cluster's forwarding writes and settle delivery, and
// keeps its runtime policies in step with the other proxies'.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
)

// sidecar reports whether cfg makes this proxy a member of a sidecar
// cluster.
func sidecar(cfg *config.Config) bool { return cfg.Cluster.Bind != "" }

// startCluster joins the sidecar cluster: the metadata log in
// state_dir/raft with a voter per node. It waits up to leaderWait for the
// log to have a leader; a proxy without one still starts (its mirrored
// queues cannot be declared or failed over until a majority is there).
func startCluster(ctx context.Context, cfg *config.Config, logger *slog.Logger, leaderWait time.Duration) (*cluster.Cluster, error) {
	raftBind, raftAdvertise := cfg.Cluster.RaftAddresses()
	c, err := cluster.Start(cluster.Config{
		NodeName:        cfg.Node,
		Bind:            cfg.Cluster.Bind,
		Advertise:       cfg.Cluster.Advertise,
		Join:            cfg.Cluster.Join,
		RaftBind:        raftBind,
		RaftAdvertise:   raftAdvertise,
		DataDir:         filepath.Join(cfg.StateDir, "raft"),
		BootstrapExpect: cfg.Cluster.BootstrapExpect,
		AMQP:            cfg.Listen.AMQP,
		Admin:           cfg.Listen.Admin,
		Backend:         cfg.Node,
		Logger:          logger,
	})
	if err != nil {
		return nil, fmt.Errorf("cluster.bind %s: %w", cfg.Cluster.Bind, err)
	}
	logger.Info("sidecar cluster: waiting for the metadata log's leader", "node", cfg.Node, "bind", cfg.Cluster.Bind, "raft", raftBind, "join", cfg.Cluster.Join, "bootstrap_expect", cfg.Cluster.BootstrapExpect)
	waitCtx, cancel := context.WithTimeout(ctx, leaderWait)
	defer cancel()
	if err := c.Store().WaitLeader(waitCtx); err != nil {
		if ctx.Err() != nil {
			c.Shutdown()
			return nil, err
		}
		logger.Warn("sidecar cluster: no metadata leader yet; serving, but mirrored queues cannot change until a majority of the proxies is up", "waited", leaderWait)
	} else {
		leader, _ := c.Leader()
		logger.Info("sidecar cluster: metadata log ready", "leader", leader.Name, "members", len(c.Members()))
	}
	return c, nil
}

// clusterEngineOptions wires the engine to the cluster: writes forwarded
// to the leader, settles for other nodes' slaves delivered to them.
func clusterEngineOptions(opts *engine.Options, c *cluster.Cluster) {
	opts.Writer = c
	opts.Peers = c
}

// The engine's settles arrive through the cluster, and the cluster gives
// the engine those of other proxies.
var (
	_ engine.MetaWriter = (*cluster.Cluster)(nil)
	_ engine.Peers      = (*cluster.Cluster)(nil)
)

// policyKind is the peer message kind of runtime policies.
const policyKind = "runtime-policies"

// policyInterval is how often each proxy tells the others its runtime
// policies, so that a proxy that joins or missed a message catches up.
const policyInterval = 2 * time.Second

// runtimePolicies is what proxies tell each other: the runtime policies
// (set_policy and set_operator_policy) of the latest change any of them
// knows, stamped by when and where it was made.
type runtimePolicies struct {
	Stamp            int64           `json:"stamp"` // UnixNano of the change; 0: none in this run
	Node             string          `json:"node"`
	Policies         []config.Policy `json:"policies"`
	OperatorPolicies []config.Policy `json:"operator_policies"`
}

func (r runtimePolicies) newerThan(o runtimePolicies) bool {
	return r.Stamp > o.Stamp || r.Stamp == o.Stamp && r.Node > o.Node
}

// policySync keeps the runtime policies of the proxies alike, last writer
// wins: a change made through one proxy's ctl is sent to every other
// proxy, which applies it to its own policy store (and state_dir file).
// This is gossip, not the log: two changes made at once through two
// proxies end with the later stamp's, and proxies whose clocks differ
// order changes by their clocks. Policies in the config file are each
// proxy's own.
type policySync struct {
	cluster *cluster.Cluster
	store   *config.PolicyStore
	node    string
	log     *slog.Logger

	mu      sync.Mutex // serialises applying and announcing
	current runtimePolicies
}

func startPolicySync(ctx context.Context, c *cluster.Cluster, store *config.PolicyStore, node string, logger *slog.Logger) (stop func()) {
	s := &policySync{cluster: c, store: store, node: node, log: logger.With("component", "policy-sync")}
	s.current = s.local()
	c.Handle(policyKind, s.receive)
	changes, unsubscribe := store.Subscribe()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer unsubscribe()
		tick := time.NewTicker(policyInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-changes:
				s.changed()
			case <-tick.C:
				s.announce()
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// local reads this proxy's runtime policies, in the store's order.
func (s *policySync) local() runtimePolicies {
	snap := s.store.Snapshot()
	pick := func(list []config.Policy, source string) []config.Policy {
		out := []config.Policy{}
		for _, p := range list {
			if p.Source == source {
				p.OverridesFile = false // depends on each proxy's file
				out = append(out, p)
			}
		}
		return out
	}
	return runtimePolicies{
		Policies:         pick(snap.Policies, config.SourceRuntime),
		OperatorPolicies: pick(snap.OperatorPolicies, config.SourceOperatorRuntime),
	}
}

func samePolicies(a, b runtimePolicies) bool {
	ja, _ := json.Marshal([2][]config.Policy{a.Policies, a.OperatorPolicies})
	jb, _ := json.Marshal([2][]config.Policy{b.Policies, b.OperatorPolicies})
	return string(ja) == string(jb)
}

// changed stamps a change made here (ctl) and tells the others.
func (s *policySync) changed() {
	s.mu.Lock()
	local := s.local()
	if samePolicies(local, s.current) {
		s.mu.Unlock() // what receive applied, or nothing new
		return
	}
	local.Stamp = max(time.Now().UnixNano(), s.current.Stamp+1)
	local.Node = s.node
	s.current = local
	s.mu.Unlock()
	s.log.Info("runtime policies changed here; telling the other proxies", "policies", len(local.Policies), "operator_policies", len(local.OperatorPolicies))
	s.announce()
}

// announce sends this proxy's view to every other alive member.
func (s *policySync) announce() {
	s.mu.Lock()
	payload, err := json.Marshal(s.current)
	s.mu.Unlock()
	if err != nil {
		return
	}
	for _, m := range s.cluster.Members() {
		if m.Name != s.node && m.Status == cluster.StatusAlive {
			s.cluster.Send(m.Name, policyKind, payload)
		}
	}
}

// receive applies another proxy's runtime policies when they are newer.
func (s *policySync) receive(from string, payload []byte) {
	var r runtimePolicies
	if err := json.Unmarshal(payload, &r); err != nil {
		s.log.Warn("undecodable runtime policies from a peer", "from", from, "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !r.newerThan(s.current) {
		return
	}
	if err := s.apply(r); err != nil {
		s.log.Warn("cannot apply the runtime policies of a peer", "from", from, "err", err)
		return
	}
	s.current = r
	s.current.Policies, s.current.OperatorPolicies = s.local().Policies, s.local().OperatorPolicies
	s.log.Info("runtime policies taken from a peer", "from", from, "changed_on", r.Node, "policies", len(r.Policies), "operator_policies", len(r.OperatorPolicies))
}

// apply makes the store's runtime policies r's; call with s.mu held.
func (s *policySync) apply(r runtimePolicies) error {
	local := s.local()
	var errs []error
	for _, kind := range []struct {
		have, want []config.Policy
		set        func(config.Policy) (config.Policy, error)
		clear      func(vhost, name string) error
	}{
		{local.Policies, r.Policies, s.store.SetPolicy, s.store.ClearPolicy},
		{local.OperatorPolicies, r.OperatorPolicies, s.store.SetOperatorPolicy, s.store.ClearOperatorPolicy},
	} {
		for _, p := range kind.have {
			if !slices.ContainsFunc(kind.want, func(q config.Policy) bool { return q.VHost == p.VHost && q.Name == p.Name }) {
				if err := kind.clear(p.VHost, p.Name); err != nil && !errors.Is(err, config.ErrPolicyNotFound) {
					errs = append(errs, err)
				}
			}
		}
		for _, p := range kind.want {
			p.Source = ""
			if _, err := kind.set(p); err != nil {
				errs = append(errs, fmt.Errorf("policy %q in vhost %q: %w", p.Name, p.VHost, err))
			}
		}
	}
	return errors.Join(errs...)
}
