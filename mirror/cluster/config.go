package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
)

// Config configures one proxy's membership in the cluster. It is the
// library's own configuration, separate from the YAML file: `serve` fills
// it from config.Cluster and the proxy's listeners.
type Config struct {
	// NodeName names this node (config `node`: the backend beside the
	// proxy). It is the serf name and the raft server ID, so it must be
	// unique and stable across restarts.
	NodeName string
	// Bind is the serf address (host:port, UDP and TCP; config
	// `cluster.bind`). Port 0 picks a free port.
	Bind string
	// Advertise is the serf address other proxies reach this one at, when
	// Bind is not reachable as is (0.0.0.0, NAT). Empty means Bind.
	Advertise string
	// Join lists serf addresses of proxies to join (config
	// `cluster.join`). Start keeps retrying in the background until one
	// answers; empty means wait to be joined.
	Join []string
	// RaftBind is the address of the raft transport (TCP), a port of its
	// own. Port 0 picks a free port.
	RaftBind string
	// RaftAdvertise is the raft address other proxies dial, when RaftBind
	// is not reachable as is. Empty means RaftBind.
	RaftAdvertise string
	// DataDir holds the raft log, stable store and snapshots
	// (state_dir/raft). Keep it across restarts: a node that lost it must
	// be removed and join as a new voter.
	DataDir string
	// BootstrapExpect forms a new cluster: once this many members with the
	// same BootstrapExpect are alive, the one with the lowest name
	// bootstraps the log with all of them as voters. 0 means never
	// bootstrap: join a cluster that exists (a node added later). A node
	// with existing raft state never bootstraps.
	BootstrapExpect int
	// GossipKey is the base64 AES-256 key that encrypts gossip (config
	// `cluster.encrypt`): the keyring's first key, when DataDir holds no
	// keyring yet (keyring.go). Empty, with no keyring there, leaves
	// gossip unencrypted.
	GossipKey string
	// RaftTLS, when set, runs the raft port (raft, forwarded writes,
	// messages between proxies) under mutual TLS: a peer must present a
	// certificate RaftTLS.Server accepts. Nil leaves it plaintext.
	RaftTLS *MutualTLS
	// AMQP, Admin and Backend are published in this member's tags.
	AMQP, Admin, Backend string

	// Events, when set, receives every membership change. The cluster
	// waits for the reader (as serf does): read it promptly. Voter changes
	// do not wait for it.
	Events chan<- Event
	// Logger receives the cluster's log lines, and serf's, memberlist's
	// and raft's (warnings and errors at their level, the rest at debug).
	Logger *slog.Logger

	// Failure detection (memberlist). Zero values take the defaults below,
	// tuned for a LAN: a dead node is declared failed about a second after
	// it stopped answering. See FailureDetection in doc.go.
	ProbeInterval time.Duration // default 200ms
	ProbeTimeout  time.Duration // default 100ms
	SuspicionMult int           // default 2
	// ReconnectTimeout is how long a failed member is kept (and keeps its
	// vote) before serf reaps it and the leader removes its voter. Default
	// 72h: long enough for an operator to repair a node.
	ReconnectTimeout time.Duration
	// ElectionTimeout is raft's heartbeat and election timeout: a follower
	// starts an election after between one and two of it without a leader.
	// Default 500ms.
	ElectionTimeout time.Duration
	// ReconcileInterval is how often the leader compares the voters with
	// the membership even without an event (a pass reads local state and
	// writes only when something differs). Default 2s.
	ReconcileInterval time.Duration
	// LeaveTimeout bounds how long a graceful Leave waits for the leader
	// to remove this node's voter. Default 5s.
	LeaveTimeout time.Duration

	// network, in tests, wraps the transports so that a test can cut the
	// traffic between groups of nodes.
	network networkHooks
}

// networkHooks lets tests interpose on the gossip and raft transports.
type networkHooks interface {
	gossip(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	raft(raft.StreamLayer) raft.StreamLayer
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	setDefault(&out.ProbeInterval, 200*time.Millisecond)
	setDefault(&out.ProbeTimeout, 100*time.Millisecond)
	setDefault(&out.SuspicionMult, 2)
	setDefault(&out.ReconnectTimeout, 72*time.Hour)
	setDefault(&out.ElectionTimeout, 500*time.Millisecond)
	setDefault(&out.ReconcileInterval, 2*time.Second)
	setDefault(&out.LeaveTimeout, 5*time.Second)
	return out
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// validate reports every problem at once.
func (c *Config) validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is empty"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data dir is empty"))
	}
	for _, a := range []struct{ name, addr string }{
		{"bind", c.Bind}, {"raft bind", c.RaftBind},
	} {
		if _, _, err := splitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.name, err))
		}
	}
	for _, a := range []struct{ name, addr string }{
		{"advertise", c.Advertise}, {"raft advertise", c.RaftAdvertise},
	} {
		if a.addr == "" {
			continue
		}
		if host, port, err := splitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.name, err))
		} else if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() || port == 0 {
			errs = append(errs, fmt.Errorf("%s %q: want a reachable IP address and a port", a.name, a.addr))
		}
	}
	if c.RaftAdvertise == "" {
		if host, _, err := splitHostPort(c.RaftBind); err == nil {
			if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
				errs = append(errs, fmt.Errorf("raft bind %q is not an address other proxies can dial: set raft advertise", c.RaftBind))
			}
		}
	}
	if t := c.RaftTLS; t != nil && (t.Server == nil || t.Client == nil || t.Server.ClientAuth != tls.RequireAndVerifyClientCert) {
		errs = append(errs, errors.New("raft TLS needs a server side that requires and verifies a client certificate, and a client side"))
	}
	if c.BootstrapExpect < 0 {
		errs = append(errs, fmt.Errorf("bootstrap expect %d is negative", c.BootstrapExpect))
	}
	if c.ProbeTimeout > 0 && c.ProbeInterval > 0 && c.ProbeTimeout >= c.ProbeInterval {
		errs = append(errs, fmt.Errorf("probe timeout %v is not shorter than the probe interval %v", c.ProbeTimeout, c.ProbeInterval))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster config: %w", err)
	}
	return nil
}

func splitHostPort(addr string) (string, int, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q of %q is not a number in 0-65535", portText, addr)
	}
	return host, port, nil
}
