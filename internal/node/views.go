package node

import (
	"context"
	"slices"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/admin"
	"github.com/amqp-mirror/amqp-mirror/internal/version"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// views answers the admin API's read-only views (admin.Views) by asking
// the parts that know: the proxy for its clients, the engine for its
// queues and failovers, the cluster for the other proxies and the log,
// the watcher for the backends. It keeps no state of its own.
type views struct {
	node string // this proxy's name: config node, "proxy" in drop-in mode
	home string // the backend clients are served by first
	// amqp and admin are this proxy's listeners, shown for a proxy alone
	// (the cluster's members publish theirs).
	amqp, admin string
	backends    []string
	srv         *proxy.Server
	m           *mirroring
	watcher     *controllink.Watcher
}

var _ admin.Views = views{}

// peerWait bounds how long a view waits for the other proxies' rows: a
// proxy frozen, and not yet judged failed, would otherwise hold every
// listing until ctl's own timeout.
const peerWait = 2 * time.Second

func newViews(cfg *config.Config, home string, srv *proxy.Server, m *mirroring, w *controllink.Watcher) views {
	name := cfg.Node
	if name == "" {
		name = "proxy" // the metadata log's name of a proxy without one (startMirroring)
	}
	return views{node: name, home: home, amqp: cfg.Listen.AMQP, admin: cfg.Listen.Admin, backends: cfg.BackendNames(), srv: srv, m: m, watcher: w}
}

// ClusterStatus implements admin.Views.
func (v views) ClusterStatus(ctx context.Context) (admin.ClusterStatus, error) {
	st := admin.ClusterStatus{
		Node: v.node, Version: version.Read().Version, Sidecar: v.m.cluster != nil, Mirroring: v.m.engine != nil,
		Paused: v.srv.Paused(), Voters: []string{},
	}
	if v.m.store != nil {
		st.Leader, _ = v.m.store.Leader()
		voters, err := v.m.store.Voters()
		if err != nil {
			return admin.ClusterStatus{}, err
		}
		for _, voter := range voters {
			st.Voters = append(st.Voters, voter.ID)
		}
	}
	if v.m.cluster != nil {
		for _, m := range v.m.cluster.Members() {
			st.Nodes = append(st.Nodes, admin.NodeStatus{
				Name: m.Name, State: m.Status.String(), Backend: m.Backend, AMQP: m.AMQP, Admin: m.Admin,
				Voter: slices.Contains(st.Voters, m.Name), Leader: m.Name == st.Leader, Self: m.Name == v.node,
			})
		}
	} else {
		st.Nodes = []admin.NodeStatus{{
			Name: v.node, State: "alive", Backend: v.home, AMQP: v.amqp, Admin: v.admin,
			Voter: slices.Contains(st.Voters, v.node), Leader: st.Leader != "" && st.Leader == v.node, Self: true,
		}}
	}
	var drained []string
	if v.m.engine != nil {
		drained = v.m.engine.Drained()
	}
	for _, b := range v.backends {
		state := v.watcher.State(b).String()
		if v.m.engine != nil && v.m.engine.BackendDown(b) {
			state = controllink.Down.String() // serf judged the proxy beside it failed
		}
		st.Backends = append(st.Backends, admin.BackendStatus{Name: b, State: state, Drained: slices.Contains(drained, b), Home: b == v.home})
	}
	return st, nil
}

// Connections implements admin.Views.
func (v views) Connections(ctx context.Context) ([]mirror.Connection, error) {
	own := v.srv.Connections()
	if v.m.cluster == nil {
		return own, nil
	}
	ctx, cancel := context.WithTimeout(ctx, peerWait)
	defer cancel()
	theirs, err := v.m.cluster.Peers().Connections(ctx)
	return append(own, theirs...), err
}

// Consumers implements admin.Views.
func (v views) Consumers(ctx context.Context, vhost string) ([]mirror.Consumer, error) {
	own := v.srv.Consumers(vhost)
	if v.m.cluster == nil {
		return own, nil
	}
	ctx, cancel := context.WithTimeout(ctx, peerWait)
	defer cancel()
	theirs, err := v.m.cluster.Peers().Consumers(ctx, vhost)
	return append(own, theirs...), err
}

// Failovers implements admin.Views.
func (v views) Failovers(ctx context.Context) ([]mirror.Failover, error) {
	if v.m.engine == nil {
		return nil, nil
	}
	own := v.m.engine.Failovers()
	for i := range own {
		if own[i].Node == "" {
			own[i].Node = v.node // drop-in mode: the engine has no node name
		}
	}
	if v.m.cluster == nil {
		return own, nil
	}
	ctx, cancel := context.WithTimeout(ctx, peerWait)
	defer cancel()
	theirs, err := v.m.cluster.Peers().Failovers(ctx)
	return append(own, theirs...), err
}

// Queues implements admin.Views.
func (v views) Queues() []mirror.QueueStatus {
	if v.m.engine == nil {
		return nil
	}
	return v.m.engine.Overview()
}

// serveViews lets the other proxies of a cluster ask this one for its
// rows of the views.
func (m *mirroring) serveViews(srv *proxy.Server) {
	if m.cluster == nil {
		return
	}
	m.cluster.Peers().HandleConnections(srv.Connections)
	m.cluster.Peers().HandleConsumers(srv.Consumers)
	m.cluster.Peers().HandleFailovers(m.engine.Failovers)
}
