package node

// The sidecar cluster: with cluster.bind set, the proxy joins the other
// proxies (mirror/cluster: serf membership, a raft voter of the metadata
// log) instead of keeping a single-voter log of its own, hands its engine
// the cluster's forwarding writes and settle delivery, and pauses while it
// sees a minority of them.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
	"github.com/amqp-mirror/amqp-mirror/proxy"
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
	if err := checkProtected(cfg, raftBind, logger); err != nil {
		return nil, err
	}
	raftTLS, err := clusterTLS(cfg.Cluster.TLS)
	if err != nil {
		return nil, err
	}
	gossipKey, err := cfg.Cluster.GossipKey()
	if err != nil {
		return nil, err
	}
	c, err := cluster.Start(cluster.Config{
		NodeName:        cfg.Node,
		Bind:            cfg.Cluster.Bind,
		Advertise:       cfg.Cluster.Advertise,
		Join:            cfg.Cluster.Join,
		RaftBind:        raftBind,
		RaftAdvertise:   raftAdvertise,
		DataDir:         filepath.Join(cfg.StateDir, "raft"),
		BootstrapExpect: cfg.Cluster.BootstrapExpect,
		GossipKey:       gossipKey,
		RaftTLS:         raftTLS,
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
	opts.Peers = c.Peers()
}

// The engine's settles arrive through the cluster, and the cluster gives
// the engine those of other proxies.
var (
	_ engine.MetaWriter = (*cluster.Cluster)(nil)
	_ engine.Peers      = (*cluster.Peers)(nil)
)

// pausing is what a proxy in a minority pauses: the engine first, so that
// it records no backend loss while clients are cut off, then the clients;
// resuming goes the other way.
type pausing struct {
	srv *proxy.Server
	eng *engine.Engine
}

func (p pausing) Pause() {
	p.eng.Member().SetPaused(true)
	p.srv.Pause()
}

func (p pausing) Resume() {
	p.srv.Resume()
	p.eng.Member().SetPaused(false)
}

// clusterTLS loads the raft port's mutual TLS; nil when cluster.tls is
// not set.
func clusterTLS(t config.ClusterTLS) (*cluster.MutualTLS, error) {
	if !t.Enabled() {
		return nil, nil
	}
	server, client, err := pki.Mutual(pki.Files{CA: t.CA, Cert: t.Cert, Key: t.Key}, t.Identity)
	if err != nil {
		return nil, fmt.Errorf("cluster.tls: %w", err)
	}
	return &cluster.MutualTLS{Server: server, Client: client}, nil
}

// checkProtected warns loudly, or with cluster.require_encryption refuses
// to start, when gossip or raft listens beyond loopback unprotected:
// anyone who reaches gossip without a key can join the cluster, and
// anyone who reaches raft without TLS can vote and write its metadata.
func checkProtected(cfg *config.Config, raftBind string, logger *slog.Logger) error {
	var open []string
	if !loopback(cfg.Cluster.Bind) && !gossipEncrypted(cfg) {
		open = append(open, "gossip on "+cfg.Cluster.Bind+" is not encrypted: set cluster.encrypt (amqp-mirror keygen prints a key)")
	}
	if !loopback(raftBind) && !cfg.Cluster.TLS.Enabled() {
		open = append(open, "raft on "+raftBind+" is plaintext: set cluster.tls.ca, cert and key (amqp-mirror tls makes them)")
	}
	if len(open) == 0 {
		return nil
	}
	if cfg.Cluster.RequireEncryption {
		return fmt.Errorf("cluster.require_encryption: %s", strings.Join(open, "; "))
	}
	logger.Warn("sidecar cluster: NOT protected on a non-loopback address: any process that reaches it can join the cluster or write its metadata; set the keys on every proxy, or cluster.require_encryption: true to refuse",
		"problems", strings.Join(open, "; "))
	return nil
}

// gossipEncrypted reports whether gossip runs encrypted: a key in the
// config, or the keyring an earlier start left in the state directory.
func gossipEncrypted(cfg *config.Config) bool {
	if cfg.Cluster.Encrypt != "" || cfg.Cluster.EncryptFile != "" {
		return true
	}
	_, err := os.Stat(filepath.Join(cfg.StateDir, "raft", cluster.KeyringFileName))
	return err == nil
}

// loopback reports whether addr's host is a loopback address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
