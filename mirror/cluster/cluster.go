package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"

	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Cluster is this proxy's membership in the sidecar cluster: a serf member
// and a raft voter of the metadata log (Store).
//
// Goroutines: eventLoop (serf's events), reconcileLoop (voters and
// bootstrap), joinLoop (until a join succeeds), and those of the raft
// stream layer (one per accepted connection while it is classified or
// serves a forwarded write). Locks: Cluster.mu and tcpStreamLayer.mu are
// never held together, nor across a call into serf or raft.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	serf  *serf.Serf
	store *store.Store
	// encrypted is set when gossip runs with a keyring (keyring.go); it
	// does not change once serf started.
	encrypted bool
	// raftLayer dials other nodes' raft ports (wrapped in tests), for
	// forwarded writes.
	raftLayer raft.StreamLayer

	// serfEvents is serf's event channel; eventLoop drains it.
	serfEvents chan serf.Event
	// reconcile asks reconcileLoop to compare voters with members; one
	// pending request stands for many.
	reconcile chan struct{}

	mu sync.Mutex
	// reaped holds members serf forgot (EventReap) whose voter the leader
	// must still remove; reaped members vanish from serf.Members.
	reaped map[string]bool
	// refusedVoters are the members refused a vote (provesMember), by
	// the raft address they were refused at, so that each is logged once.
	refusedVoters map[string]string
	// bootstrapped is set once the log has a configuration here.
	bootstrapped bool
	// bootstraps counts the bootstraps this node made (tests check that
	// exactly one node of a new cluster makes one).
	bootstraps atomic.Int32
	// tags are this member's serf tags (SetTags replaces them all).
	tags map[string]string

	// peers carries messages between proxies outside the log (peers.go).
	peers *Peers

	stop         chan struct{}
	wg           sync.WaitGroup
	shutdownOnce sync.Once
	shutdownErr  error
	leaveOnce    sync.Once
	leaveErr     error
}

// Start opens the metadata log in cfg.DataDir with a raft transport on
// cfg.RaftBind, starts the serf member on cfg.Bind and joins cfg.Join in
// the background. It returns once both listen. The log has no leader until
// the cluster is bootstrapped (BootstrapExpect) or a leader adds this node;
// use Store().WaitLeader before the first write.
func Start(cfg Config) (*Cluster, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger.With("component", "cluster", "node", cfg.NodeName)

	transport, base, layer, err := newRaftTransport(cfg, log)
	if err != nil {
		return nil, err
	}
	var c *Cluster // set before Start returns, so before any WaitLeader
	metadata, err := store.Open(store.Config{
		Dir:             cfg.DataDir,
		NodeID:          cfg.NodeName,
		Transport:       transport,
		Logger:          cfg.Logger.With("node", cfg.NodeName),
		ElectionTimeout: cfg.ElectionTimeout,
		JoinCluster:     true,
		LeaderIndex:     func(ctx context.Context) (uint64, error) { return c.leaderAppliedIndex(ctx) },
	})
	if err != nil {
		transport.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}

	c = &Cluster{
		cfg:           cfg,
		log:           log,
		store:         metadata,
		serfEvents:    make(chan serf.Event, 256),
		reconcile:     make(chan struct{}, 1),
		reaped:        make(map[string]bool),
		refusedVoters: make(map[string]string),
		stop:          make(chan struct{}),
		raftLayer:     layer,
	}
	c.peers = &Peers{node: cfg.NodeName, dial: layer.Dial, log: log, stop: c.stop, wg: &c.wg, senders: make(map[string]*peerSender)}
	c.peers.refresh(nil) // until serf runs
	serve, servePeer, serveCall := c.serveForward, c.peers.servePeer, c.peers.serveCall
	base.forward.Store(&serve)
	base.peer.Store(&servePeer)
	base.call.Store(&serveCall)
	c.handleAppliedIndex()
	c.handleWaitApplied()
	c.handleInLog()
	if voters, err := metadata.Voters(); err == nil && len(voters) > 0 {
		c.bootstrapped = true
	}
	c.serf, err = c.startSerf(string(transport.LocalAddr()))
	if err != nil {
		metadata.Close()
		return nil, err
	}
	c.peers.refresh(c.Members())
	c.wg.Add(2)
	go c.eventLoop()
	go c.reconcileLoop()
	if len(cfg.Join) > 0 {
		c.wg.Add(1)
		go c.joinLoop(cfg.Join)
	}
	return c, nil
}

// newRaftTransport listens on cfg.RaftBind and returns raft's transport,
// the stream layer under it, and that layer as raft sees it (wrapped in
// tests).
func newRaftTransport(cfg Config, log *slog.Logger) (*raft.NetworkTransport, *tcpStreamLayer, raft.StreamLayer, error) {
	ln, err := net.Listen("tcp", cfg.RaftBind)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cluster: raft listener: %w", err)
	}
	advertise := ln.Addr()
	if cfg.RaftAdvertise != "" {
		if advertise, err = net.ResolveTCPAddr("tcp", cfg.RaftAdvertise); err != nil {
			ln.Close()
			return nil, nil, nil, fmt.Errorf("cluster: raft advertise: %w", err)
		}
	}
	base := newTCPStreamLayer(ln, advertise, cfg.RaftTLS, log.With("component", "raft-net"))
	var layer raft.StreamLayer = base
	if cfg.network != nil {
		layer = cfg.network.raft(layer)
	}
	transport := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  layer,
		MaxPool: 3,
		Timeout: 2 * time.Second,
		// Pipelined replication off: raft's pipeline can deadlock when a
		// follower rejects an append (its decoder stops while the sender
		// parks one more request). The leader then sends that follower
		// heartbeats but no entries, so no election heals it, and its
		// Shutdown waits for ever. The pipeline gains nothing at the
		// metadata log's rate of writes.
		MaxRPCsInFlight: 1,
		Logger:          store.HCLogger(log.With("component", "raft-net"), "raft-net"),
	})
	return transport, base, layer, nil
}

func (c *Cluster) startSerf(raftAddr string) (*serf.Serf, error) {
	cfg := c.cfg
	host, port, _ := splitHostPort(cfg.Bind)
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{host},
		BindPort:  port,
		Logger:    stdLogger(c.log.With("component", "memberlist")),
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: serf listener on %s: %w", cfg.Bind, err)
	}
	port = nt.GetAutoBindPort()
	var transport memberlist.NodeAwareTransport = nt
	if cfg.network != nil {
		transport = cfg.network.gossip(nt)
	}

	ml := memberlist.DefaultLANConfig()
	ml.Transport = transport
	ml.BindAddr, ml.BindPort = host, port
	ml.AdvertisePort = port
	if cfg.Advertise != "" {
		ml.AdvertiseAddr, ml.AdvertisePort, _ = splitHostPort(cfg.Advertise)
	}
	ml.Logger = stdLogger(c.log.With("component", "memberlist"))
	// Failure detection: see "Failure detection" in doc.go for the sums.
	ml.ProbeInterval = cfg.ProbeInterval
	ml.ProbeTimeout = cfg.ProbeTimeout
	ml.SuspicionMult = cfg.SuspicionMult
	ml.GossipInterval = 100 * time.Millisecond
	ml.TCPTimeout = 2 * time.Second
	ml.PushPullInterval = 15 * time.Second

	sc := serf.DefaultConfig()
	sc.NodeName = cfg.NodeName
	c.tags = map[string]string{
		tagAMQP:    cfg.AMQP,
		tagAdmin:   cfg.Admin,
		tagBackend: cfg.Backend,
		tagRaft:    raftAddr,
		tagExpect:  strconv.Itoa(cfg.BootstrapExpect),
	}
	if c.bootstrapped {
		c.tags[tagInLog] = "1"
	}
	sc.Tags = maps.Clone(c.tags)
	sc.EventCh = c.serfEvents
	keyringPath := filepath.Join(cfg.DataDir, KeyringFileName)
	keyring, err := loadKeyring(keyringPath, cfg.GossipKey)
	if err != nil {
		nt.Shutdown()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if keyring != nil {
		ml.Keyring = keyring
		sc.KeyringFile = keyringPath
		c.encrypted = true
	}
	sc.MemberlistConfig = ml
	sc.LogOutput = nil
	sc.Logger = stdLogger(c.log.With("component", "serf"))
	sc.ReconnectTimeout = cfg.ReconnectTimeout
	// After a partition heals, both sides hold each other as failed and
	// only serf's reconnect attempts merge them again (raft heals on its
	// own: the leader keeps dialling every voter). Serf's default of 30s
	// would leave the proxies' view of each other stale that long.
	sc.ReconnectInterval = 2 * time.Second
	sc.TombstoneTimeout = max(cfg.ReconnectTimeout, 24*time.Hour)
	// Peers stop probing a leaving node once they heard of the leave; a
	// few probe intervals are enough for that on a LAN.
	sc.LeavePropagateDelay = 5 * cfg.ProbeInterval
	// Two proxies must never share a name (it is the raft ID); serf
	// resolves a conflict by majority vote and shuts the loser down.
	sc.EnableNameConflictResolution = true

	s, err := serf.Create(sc)
	if err != nil {
		nt.Shutdown()
		return nil, fmt.Errorf("cluster: starting serf: %w", err)
	}
	return s, nil
}

// joinLoop joins the given proxies, retrying every second until one
// answers: at a whole-cluster start the others may come up later.
func (c *Cluster) joinLoop(addrs []string) {
	defer c.wg.Done()
	for attempt := 1; ; attempt++ {
		n, err := c.serf.Join(addrs, true)
		if n > 0 {
			c.log.Info("joined the cluster", "contacted", n)
			return
		}
		level := slog.LevelDebug
		if attempt%10 == 1 {
			level = slog.LevelWarn
		}
		c.log.Log(context.Background(), level, "joining the cluster failed, retrying", "join", addrs, "attempt", attempt, "error", err)
		select {
		case <-c.stop:
			return
		case <-time.After(time.Second):
		}
	}
}

// Join contacts the given serf addresses now and returns how many answered.
func (c *Cluster) Join(addrs ...string) (int, error) {
	n, err := c.serf.Join(addrs, true)
	if err != nil {
		return n, fmt.Errorf("cluster: joining %v: %w", addrs, err)
	}
	return n, nil
}

// eventLoop turns serf's events into Events: it records what the voter
// reconciliation needs, wakes it, then hands the events to Config.Events.
func (c *Cluster) eventLoop() {
	defer c.wg.Done()
	for {
		var se serf.Event
		select {
		case <-c.stop:
			return
		case se = <-c.serfEvents:
		}
		events := eventsFromSerf(se)
		c.mu.Lock()
		for _, e := range events {
			switch e.Kind {
			case EventReap:
				c.reaped[e.Member.Name] = true
			case EventJoin:
				delete(c.reaped, e.Member.Name)
			}
		}
		c.mu.Unlock()
		c.peers.refresh(c.Members())
		c.wake()
		for _, e := range events {
			c.log.Info("member "+e.Kind.String(), "member", e.Member.Name, "status", e.Member.Status)
			if c.cfg.Events == nil {
				continue
			}
			select {
			case c.cfg.Events <- e:
			case <-c.stop:
				return
			}
		}
	}
}

func (c *Cluster) wake() {
	select {
	case c.reconcile <- struct{}{}:
	default:
	}
}

// Store is the metadata log this node votes in.
func (c *Cluster) Store() *store.Store { return c.store }

// Peers returns the messages and calls between this cluster's proxies.
func (c *Cluster) Peers() *Peers { return c.peers }

// Members returns every member serf knows, this one included, sorted by
// name.
func (c *Cluster) Members() []Member { return membersFromSerf(c.serf.Members()) }

// LocalMember returns this proxy as the others see it.
func (c *Cluster) LocalMember() Member { return memberFromSerf(c.serf.LocalMember()) }

// Majority reports whether this node is on a side of the cluster that can
// commit to the metadata log: it leads, or it follows a leader whose
// heartbeats still arrive. A follower forgets its leader one to two
// ElectionTimeouts after the heartbeats stop, and a leader that cannot
// reach a majority steps down after half an ElectionTimeout, so a minority
// side answers false within about two ElectionTimeouts of a partition. The
// proxy stops serving mirrored queues while it is false (pause_minority).
// Store().LeaderChanges signals when to ask again.
func (c *Cluster) Majority() bool {
	id, _ := c.store.Leader()
	return id != ""
}

// Leader returns the member that leads the metadata log, as far as this
// node knows; false when it knows no leader or serf does not know it.
func (c *Cluster) Leader() (Member, bool) {
	id, _ := c.store.Leader()
	if id == "" {
		return Member{}, false
	}
	for _, m := range c.Members() {
		if m.Name == id {
			return m, true
		}
	}
	return Member{}, false
}

// Leave departs gracefully and then shuts down: a leader first removes its
// own voter (handing leadership to the others), a follower announces its
// leave and waits up to LeaveTimeout for the leader to remove its voter.
// Peers see the member as left, not failed, and the quorum shrinks with
// it. Use Shutdown instead to stop without leaving (a restart), keeping
// the vote.
func (c *Cluster) Leave() error {
	c.leaveOnce.Do(func() {
		c.leaveErr = errors.Join(c.leave(), c.Shutdown())
	})
	return c.leaveErr
}

func (c *Cluster) leave() error {
	var errs []error
	voters, err := c.store.Voters()
	if err != nil {
		errs = append(errs, err)
	}
	if c.store.IsLeader() && len(voters) > 1 {
		// Not an error yet when it fails (leadership lost mid-commit, which
		// may still commit): the next leader removes a member that left,
		// and the wait below tells.
		if err := c.store.RemoveVoter(c.cfg.NodeName); err != nil {
			c.log.Warn("leader removing its own voter", "error", err)
		}
	}
	if err := c.serf.Leave(); err != nil {
		errs = append(errs, fmt.Errorf("cluster: announcing the leave: %w", err))
	}
	if len(voters) > 1 {
		// Only a warning when it does not come: a removed follower learns
		// of its removal only if the leader's last replication to it gets
		// through, and the leader removes the voter of a member that left
		// whenever it next looks, this node gone or not.
		deadline := time.Now().Add(c.cfg.LeaveTimeout)
		for c.isVoter() {
			if time.Now().After(deadline) {
				c.log.Warn("left without seeing the leader remove this node's voter", "waited", c.cfg.LeaveTimeout)
				break
			}
			select {
			case <-time.After(50 * time.Millisecond):
			case <-c.stop:
				return errors.Join(errs...)
			}
		}
	}
	return errors.Join(errs...)
}

func (c *Cluster) isVoter() bool {
	voters, err := c.store.Voters()
	if err != nil {
		return false
	}
	for _, v := range voters {
		if v.ID == c.cfg.NodeName {
			return true
		}
	}
	return false
}

// Shutdown stops serf and raft without leaving: peers see a failure, and
// this node stays a voter, as after a crash. It is idempotent.
func (c *Cluster) Shutdown() error {
	c.shutdownOnce.Do(func() {
		// serf first, while eventLoop still drains its events: serf sends
		// member events without a timeout.
		serfErr := c.serf.Shutdown()
		// Under peers.mu, so that no peer sender starts after the wait.
		c.peers.mu.Lock()
		close(c.stop)
		c.peers.mu.Unlock()
		c.wg.Wait()
		c.shutdownErr = errors.Join(serfErr, c.store.Close())
	})
	return c.shutdownErr
}
