package engine

import (
	"context"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// In a sidecar cluster every proxy runs an engine on the same metadata
// log, so the work on a queue is shared out by node (see "Sidecar
// cluster" in mirror/doc.go):
//
//   - metadata writes go through Options.Writer, which forwards them to
//     the raft leader;
//   - a slave copy is trimmed only by the proxy beside its backend
//     (Options.Node): one trimmer per copy, so that it holds every
//     message of the copy. Settles for slaves on other nodes are handed
//     to Options.Peers, which carries them to those nodes' proxies;
//   - policy changes (adding and dropping slaves) and masters that
//     deleted themselves are handled by the proxy beside the master;
//   - a slave is synchronised by the proxy beside it (it owns the
//     slave's trimmer), copying from the master, one slave of a queue at
//     a time: the first unsynchronised live slave in join order;
//   - copies on a backend that comes back rejoin through the proxy beside
//     it (its trimmer purges them);
//   - a promotion is proposed by every proxy that sees the master's
//     backend go down, once a majority of the proxies count it down
//     (failover.majorityDown) or serf declared the proxy beside it
//     failed; the writes are conditional, so the log takes the first and
//     the others find the queue promoted.

// MetaWriter writes queue metadata: the Store itself for one proxy, the
// cluster (writes forwarded to the raft leader) in a sidecar cluster.
type MetaWriter interface {
	Put(ctx context.Context, meta mirror.QueueMeta, expect uint64) (mirror.QueueMeta, error)
	Delete(ctx context.Context, id mirror.QueueID, expect uint64) error
	PutExchange(ctx context.Context, x mirror.ExchangeMeta, expect uint64) (mirror.ExchangeMeta, error)
	DeleteExchange(ctx context.Context, id mirror.ExchangeID, expect uint64) error
}

// Peers are the other proxies of a sidecar cluster as the engine sees
// them.
type Peers interface {
	// SendSettles hands what became of the master's copies of ids (acked,
	// rejected, delivered or requeued) to the proxy beside backend, for its
	// slave copy (SettleLocal there). It never blocks (it is on the
	// client's ack and delivery paths) and does not keep ids.
	SendSettles(backend string, id mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome)
	// PurgeSlave asks the proxy beside backend to empty its slave copy
	// of the queue through its trimmer (PurgeLocal there), and waits.
	PurgeSlave(ctx context.Context, backend string, id mirror.QueueID) error
	// SyncSlave asks the proxy beside backend to start synchronising its
	// slave copy of the queue (SyncQueue there), and returns once it did.
	SyncSlave(ctx context.Context, backend string, id mirror.QueueID) error
	// StartCopy asks the proxy beside source, a synchronised slave's
	// backend, to copy its slave copy of job.Queue into job.Target's
	// (Member.CopyLocal there), and returns once the copy started.
	StartCopy(ctx context.Context, source string, job mirror.CopyJob) error
	// CopyState asks the proxy beside source how a copy StartCopy started
	// stands (Member.CopyStateLocal there); with cancel set it stops it.
	CopyState(ctx context.Context, source, job string, cancel bool) (mirror.CopyState, error)
	// Held asks every other live proxy what it holds of each queue of
	// vhost (Engine.HeldHere there), and adds it up; an error when one did
	// not answer.
	Held(ctx context.Context, vhost string) (map[mirror.QueueID]mirror.Held, error)
	// Unrecorded asks every other live proxy for the queues of vhost its
	// clients declared that the log does not record; with an error when
	// one did not answer, the others' queues.
	Unrecorded(ctx context.Context, vhost string) ([]mirror.UnrecordedQueue, error)
	// CountDown asks every other live proxy whether it counts backend
	// down, and returns how many do and how many proxies the cluster has
	// (this one and failed ones included); one that does not answer in
	// time counts as not seeing it down, and err names it.
	CountDown(ctx context.Context, backend string) (down, members int, err error)
	// WaitApplied returns once every other live proxy has applied the
	// metadata log up to index (bounded: an error names those that did
	// not answer in time).
	WaitApplied(ctx context.Context, index uint64) error
	// Delivered asks every other live proxy which messages of the queue
	// its clients were delivered while the queue's epoch was below epoch;
	// with an error naming those that did not answer in time, the others'.
	Delivered(ctx context.Context, id mirror.QueueID, epoch uint64) ([]mirror.MessageID, error)
}

// Clustered reports whether other proxies share the metadata log: a
// sidecar cluster (Options.Peers set).
func (e *Engine) Clustered() bool { return e.roles.clustered }

// DeliveredByPeers asks the other proxies which messages of queue id they
// delivered while its epoch was below epoch (Peers.Delivered); nothing for
// a proxy alone.
func (e *Engine) DeliveredByPeers(ctx context.Context, id mirror.QueueID, epoch uint64) ([]mirror.MessageID, error) {
	if e.opts.Peers == nil {
		return nil, nil
	}
	return e.opts.Peers.Delivered(ctx, id, epoch)
}

// roles says which work on a queue falls to this proxy: all of it for one
// proxy alone, the work of its own node in a cluster. It is a plain value,
// fixed at New.
type roles struct {
	node string // Options.Node
	// clustered is set when the engine shares its work with other proxies
	// (Options.Peers set).
	clustered bool
}

func newRoles(opts Options) roles { return roles{node: opts.Node, clustered: opts.Peers != nil} }

// trimsHere reports whether this proxy trims the slave copy on backend:
// every copy for one proxy alone, the copies on its own node in a
// cluster.
func (r roles) trimsHere(backend string) bool {
	return !r.clustered || backend == r.node
}

// coordinates reports whether this proxy carries out policy changes and
// expiry for m: always for one proxy alone, when m's master is on its
// own node in a cluster.
func (r roles) coordinates(m mirror.QueueMeta) bool {
	return !r.clustered || m.Master == r.node
}

// syncTargets filters the slaves a sync should copy to down to those this
// proxy synchronises: all of them alone; in a cluster its own node's
// slave, and only when it is the first of targets (join order) on a live
// backend, so that two proxies never copy from one master at once.
func (r roles) syncTargets(targets []string, live mirror.LiveSet) []string {
	if !r.clustered {
		return targets
	}
	for _, t := range targets {
		if !live.Has(t) {
			continue
		}
		if t == r.node {
			return []string{t}
		}
		return nil
	}
	return nil
}

// Member is the engine as the rest of a sidecar cluster sees it: what the
// other proxies ask of this node's slave copies and of its metadata
// (SettleLocal, SyncLocal, PurgeLocal, WaitApplied), serf's verdicts on
// the proxies beside the backends (MemberFailed, MemberAlive) and
// pause_minority's (SetPaused). It keeps no state of its own: each call
// goes to the part of the engine that owns what it changes.
type Member struct{ e *Engine }

// Member returns the engine's side towards its cluster.
func (e *Engine) Member() Member { return Member{e: e} }

// SettleLocal is Settle for the slave copies this proxy trims: what the
// proxies of other nodes send for this node's slaves.
func (m Member) SettleLocal(id mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome) {
	m.e.trimmers.settle(id, ids, outcome)
}

// SyncLocal starts synchronising the slave beside this proxy (another
// proxy asks for it through Peers.SyncSlave) and, once it is done, hands
// the request on to the next unsynchronised slave. It never hands on a
// request it cannot start here, so a request cannot go round between
// proxies that see the cluster differently.
func (m Member) SyncLocal(ctx context.Context, id mirror.QueueID) error {
	return m.e.syncs.local(ctx, id)
}

// CopyLocal starts copying this node's synchronised slave copy of a queue
// into another node's slave copy, for the sync the proxy beside that one
// runs (Peers.StartCopy there).
func (m Member) CopyLocal(_ context.Context, job mirror.CopyJob) error {
	return m.e.syncs.copyLocal(job)
}

// CopyStateLocal tells how a copy CopyLocal started stands, waiting a moment
// for its end; with cancel set it stops the copy first.
func (m Member) CopyStateLocal(ctx context.Context, job string, cancel bool) (mirror.CopyState, error) {
	return m.e.syncs.copyState(ctx, job, cancel)
}

// PurgeLocal empties this node's slave copy of a queue, through its
// trimmer when it has one: what Purged does for the slave on this node
// when a client purged the queue through another proxy.
func (m Member) PurgeLocal(ctx context.Context, id mirror.QueueID) error {
	e := m.e
	if tr := e.trimmers.get(id, e.roles.node); tr != nil {
		_, err := tr.t.Purge(ctx)
		return err
	}
	return e.operator.purgeCopy(e.roles.node, id)
}

// handSettles hands the outcome of ids to the proxies of m's slaves on
// other nodes than node.
func handSettles(peers Peers, node string, m mirror.QueueMeta, ids []mirror.MessageID, outcome mirror.Outcome) {
	for _, s := range m.Slaves {
		if s.Backend != node {
			peers.SendSettles(s.Backend, m.ID, ids, outcome)
		}
	}
}
