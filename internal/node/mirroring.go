package node

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// The replication engine is the proxy's Mirror.
var _ proxy.Mirror = (*engine.Engine)(nil)

// mirroring is what Run runs for several backends: the metadata store
// and the engine. With one backend both are nil and the proxy passes
// frames through.
type mirroring struct {
	store  *store.Store
	engine *engine.Engine
	others []proxy.Backend // the backends other than the home one
	// cluster is the sidecar cluster (sidecar.go), nil for a proxy
	// alone; it owns store then.
	cluster *cluster.Cluster
	// policyLog keeps the runtime policies in the metadata log.
	policyLog *cluster.PolicyLog
	// stopMembers ends handing serf's verdicts to the engine.
	stopMembers func()
}

// startMirroring opens the metadata store in state_dir/raft (a single
// voter: the sidecar cluster adds voters to the same log) and starts the
// engine, when more than one backend is configured.
func startMirroring(ctx context.Context, cfg *config.Config, backends *backends, policies *config.PolicyStore, w *controllink.Watcher, logger *slog.Logger) (*mirroring, error) {
	m := &mirroring{}
	if len(cfg.Backends) < 2 {
		return m, nil
	}
	var err error
	if m.others, err = backends.proxyOthers(); err != nil {
		return nil, err
	}
	nodeID := cfg.Node
	if nodeID == "" {
		nodeID = "proxy"
	}
	if sidecar(cfg) {
		// A voter of the cluster's log in state_dir/raft (sidecar.go).
		if m.cluster, err = startCluster(ctx, cfg, logger, 30*time.Second); err != nil {
			return nil, err
		}
		m.store = m.cluster.Store()
	} else {
		m.store, err = store.Open(store.Config{Dir: filepath.Join(cfg.StateDir, "raft"), NodeID: nodeID, Logger: logger})
		if err != nil {
			return nil, err
		}
		waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := m.store.WaitLeader(waitCtx); err != nil {
			m.store.Close()
			return nil, err
		}
	}
	opts := engine.Options{
		Backends: backends.watched(),
		Node:     cfg.Node,
		Locator:  cfg.QueueMasterLocator,
		Store:    m.store,
		Policies: policies,
		Watcher:  w,
		Logger:   logger,
	}
	if m.cluster != nil {
		clusterEngineOptions(&opts, m.cluster)
	}
	// Runtime policies live in the metadata log (cluster.PolicyLog), taken
	// before the engine acts on any.
	var writer cluster.PolicyWriter = m.store
	if m.cluster != nil {
		writer = m.cluster
	}
	m.policyLog = cluster.StartPolicyLog(writer, m.store, policies, logger)
	m.engine = engine.New(opts)
	// The first placements should see which backends are up: wait a moment
	// for the watcher's first verdicts (a backend down is not an error).
	startCtx, cancelStart := context.WithTimeout(ctx, 10*time.Second)
	defer cancelStart()
	if err := m.engine.Start(startCtx); err != nil {
		m.close()
		return nil, err
	}
	if m.cluster != nil {
		member := m.engine.Member()
		m.cluster.Peers().HandleSettles(member.SettleLocal)
		m.cluster.Peers().HandlePurges(member.PurgeLocal)
		m.cluster.Peers().HandleSyncs(member.SyncLocal)
		m.cluster.Peers().HandleCopies(member.CopyLocal, member.CopyStateLocal)
		m.cluster.Peers().HandleWaitApplied(member.WaitApplied)
		m.cluster.Peers().HandleDown(m.engine.BackendDown)
		m.stopMembers = cluster.WatchMembers(m.cluster, member, cfg.Node)
	}
	return m, nil
}

// countUnacked lets list_queues and the backlog checks, here and asked by
// other proxies, count the messages this proxy's clients hold
// unacknowledged.
func (m *mirroring) countUnacked(f func(vhost string) map[mirror.QueueID]int) {
	if m.engine == nil {
		return
	}
	m.engine.CountUnackedWith(f)
	if m.cluster != nil {
		m.cluster.Peers().HandleHeld(m.engine.HeldHere)
	}
}

// listUnrecorded lets list_queues, here and asked by other proxies, show
// the exclusive and server-named queues this proxy's clients declared.
func (m *mirroring) listUnrecorded(f func(vhost string) []mirror.UnrecordedQueue) {
	if m.engine != nil {
		m.engine.ListUnrecordedWith(f)
	}
	if m.cluster != nil {
		m.cluster.Peers().HandleUnrecorded(f)
	}
}

// answerDelivered lets the other proxies of a sidecar cluster ask which
// messages of a queue this proxy delivered before a promotion, to flag
// them when the new master delivers them through another proxy.
func (m *mirroring) answerDelivered(f func(id mirror.QueueID, epoch uint64) []mirror.MessageID) {
	if m.cluster != nil {
		m.cluster.Peers().HandleDelivered(f)
	}
}

// mirror returns the engine as the proxy's Mirror, nil (not a nil
// *engine.Engine) with one backend.
func (m *mirroring) mirror() proxy.Mirror {
	if m.engine == nil {
		return nil
	}
	return m.engine
}

func (m *mirroring) close() {
	if m.stopMembers != nil {
		m.stopMembers()
	}
	if m.policyLog != nil {
		m.policyLog.Close()
	}
	if m.engine != nil {
		m.engine.Close()
	}
	if m.cluster != nil {
		// Shutdown, not Leave: a stopped proxy keeps its vote and rejoins.
		m.cluster.Shutdown()
	} else if m.store != nil {
		m.store.Close()
	}
}
