// Package store is the queue metadata store: mirror's QueueMeta and
// ExchangeMeta records, the runtime policies, the tombstones of deleted
// queues and the voters, kept in a Raft log (hashicorp/raft, with
// raft-boltdb under the directory it is given). A lone proxy is its single
// voter; package cluster adds a voter per sidecar proxy. Writes are
// conditional on the version that was read, and refused with ErrNotLeader
// where the log has no reachable leader, so a proxy never acts on a
// decision it could not record. The decisions themselves are package
// mirror's; this package only records them. LogWriter and HCLogger carry
// the hashicorp libraries' log lines (raft here; serf, memberlist and the
// raft transport in package cluster) into slog.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Errors of the metadata store. They are wrapped with the queue they concern.
var (
	// ErrConflict: a conditional write named a version that is no longer
	// current (someone else changed the queue first). Read again and decide
	// again.
	ErrConflict = errors.New("queue metadata changed concurrently")
	// ErrNotLeader: this proxy cannot write because it is not the leader of
	// the metadata log (a minority side of a partition, or an election in
	// progress). It must not act on a decision it could not record.
	ErrNotLeader = errors.New("metadata log has no reachable leader here")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("metadata store closed")
)

// Config configures a metadata Store.
type Config struct {
	// Dir holds the log, the stable store and the snapshots; it is created
	// when missing. Typically state_dir/raft.
	Dir string
	// NodeID names this proxy in the log; the name of the backend it sits
	// beside (config `node`), or any stable name for a drop-in proxy.
	NodeID string
	// Transport carries the log to the other voters. Nil means a single
	// voter with an in-memory transport: one proxy alone (drop-in mode).
	Transport raft.Transport
	// Logger receives raft's own log lines (warnings and errors at their
	// level, the rest at debug).
	Logger *slog.Logger
	// ElectionTimeout bounds how long a lone voter waits before it elects
	// itself at start, and how quickly a cluster notices a dead leader.
	// Zero means 500ms.
	ElectionTimeout time.Duration
	// JoinCluster leaves a new store without a configuration instead of
	// bootstrapping it as a single voter: the sidecar cluster either
	// bootstraps it with every expected voter (Bootstrap) or a leader adds
	// it. Ignored for a store with existing state.
	JoinCluster bool
	// LeaderIndex, when set, asks the log's leader how far it has applied
	// the log (its AppliedIndex; the sidecar cluster asks over its own
	// connections). WaitLeader on a follower then also waits until this
	// node has applied that far.
	LeaderIndex func(ctx context.Context) (uint64, error)
}

// Store is the queue metadata, replicated through a Raft log
// (hashicorp/raft, with raft-boltdb on disk). Reads are served from this
// proxy's copy of the state; writes go through the log and are conditional
// on the version the writer read, so two proxies that decide at once cannot
// both win. With one proxy the log has a single voter; the sidecar cluster
// adds voters to the same log.
type Store struct {
	raft      *raft.Raft
	fsm       *metaFSM
	bolt      *raftboltdb.BoltStore
	transport raft.Transport
	log       *slog.Logger
	timeout   time.Duration
	// leaderIndex is Config.LeaderIndex.
	leaderIndex func(ctx context.Context) (uint64, error)
	// openedAt is the index this proxy's state had applied when the store
	// opened (policies.go).
	openedAt uint64

	closeOnce sync.Once
	closeErr  error
	// closed is closed by Close: LeaderChanges signals it (raft's own
	// observation of a shut-down leader stepping down is not reliable).
	closed chan struct{}
}

// Open opens (or creates) the metadata log in cfg.Dir and starts this
// proxy's Raft node. A new single-voter store bootstraps itself; an existing
// one replays its snapshot and log. It returns once the node runs; use
// WaitLeader before the first write.
func Open(cfg Config) (*Store, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("metadata store: node id is empty")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ElectionTimeout <= 0 {
		cfg.ElectionTimeout = 500 * time.Millisecond
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("metadata store: %w", err)
	}
	logger := cfg.Logger.With("component", "raft")
	hlog := HCLogger(logger, "raft")

	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(cfg.NodeID)
	conf.Logger = hlog
	conf.HeartbeatTimeout = cfg.ElectionTimeout
	conf.ElectionTimeout = cfg.ElectionTimeout
	conf.LeaderLeaseTimeout = cfg.ElectionTimeout / 2
	conf.CommitTimeout = 5 * time.Millisecond
	// No BatchApplyCh: with a buffered apply channel, raft 1.8 can accept
	// an Apply racing with Shutdown into the buffer and never answer it
	// (the future has no shutdown channel), so a Put after Close hung.
	conf.NoLegacyTelemetry = true

	bolt, err := raftboltdb.NewBoltStore(filepath.Join(cfg.Dir, "raft.db"))
	if err != nil {
		return nil, fmt.Errorf("metadata store: opening %s: %w", filepath.Join(cfg.Dir, "raft.db"), err)
	}
	snapshots, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, hlog)
	if err != nil {
		bolt.Close()
		return nil, fmt.Errorf("metadata store: %w", err)
	}
	transport := cfg.Transport
	if transport == nil {
		_, transport = raft.NewInmemTransport(raft.ServerAddress(cfg.NodeID))
	}

	existing, err := raft.HasExistingState(bolt, bolt, snapshots)
	if err != nil {
		bolt.Close()
		return nil, fmt.Errorf("metadata store: reading %s: %w", cfg.Dir, err)
	}
	if !existing && !cfg.JoinCluster {
		boot := raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter, ID: conf.LocalID, Address: transport.LocalAddr(),
		}}}
		if err := raft.BootstrapCluster(conf, bolt, bolt, snapshots, transport, boot); err != nil {
			bolt.Close()
			return nil, fmt.Errorf("metadata store: bootstrapping a single voter: %w", err)
		}
	}

	fsm := newMetaFSM()
	r, err := raft.NewRaft(conf, fsm, bolt, bolt, snapshots, transport)
	if err != nil {
		bolt.Close()
		return nil, fmt.Errorf("metadata store: starting raft: %w", err)
	}
	return &Store{
		raft:      r,
		fsm:       fsm,
		bolt:      bolt,
		transport: transport,
		log:       logger,
		timeout:   10 * time.Second,
		closed:    make(chan struct{}),

		leaderIndex: cfg.LeaderIndex,
		// NewRaft restored the latest snapshot before it returned; the
		// entries after it come from the leader.
		openedAt: fsm.appliedIndex(),
	}, nil
}

// WaitLeader blocks until the log has a leader this proxy can reach, or ctx
// ends. On the leader it also waits until every entry of the log is applied,
// so that reads after it see everything written before a restart. On a
// follower with Config.LeaderIndex it waits until this node has
// applied what the leader had applied when asked: a follower that
// restarts replays nothing by itself (raft applies its log only once the
// leader tells it what is committed), and a proxy serving from the
// metadata of before its crash would route to a master since replaced.
// Without LeaderIndex a follower's reads may still lag the leader.
func (s *Store) WaitLeader(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if addr, _ := s.raft.LeaderWithID(); addr != "" {
			if s.raft.State() != raft.Leader {
				if s.caughtUp(ctx) {
					return nil
				}
			} else if err := s.raft.Barrier(s.timeout).Error(); err == nil {
				// A leader that just started may not have applied the log
				// it replays yet; the barrier waits until its reads see all
				// of it.
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for a metadata leader: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// caughtUp reports whether this follower has applied the log as far as
// the leader had (Config.LeaderIndex); always true without it. False
// when the leader could not be asked (it may not be reachable yet) or ctx
// ended; the caller asks again.
func (s *Store) caughtUp(ctx context.Context) bool {
	if s.leaderIndex == nil {
		return true
	}
	ask, cancel := context.WithTimeout(ctx, 2*time.Second)
	index, err := s.leaderIndex(ask)
	cancel()
	if err != nil {
		s.log.Debug("cannot ask the leader how far it applied the log yet", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
		return false
	}
	return s.WaitApplied(ctx, index) == nil
}

// InContact reports whether this node hears from a leader of the log: it
// leads (a leader cut off from a quorum steps down within LeaderLeaseTimeout),
// or it follows a leader whose last message arrived within the last within.
// A follower cut off from the leader learns what the others decide
// meanwhile only once it hears from it again.
func (s *Store) InContact(within time.Duration) bool {
	if s.raft.State() == raft.Leader {
		return true
	}
	if addr, _ := s.raft.LeaderWithID(); addr == "" {
		return false
	}
	return time.Since(s.raft.LastContact()) <= within
}

// AppliedIndex is the index of the latest entry this node's state has
// applied: its reads show every write up to there.
func (s *Store) AppliedIndex() uint64 { return s.fsm.appliedIndex() }

// IsLeader reports whether this proxy leads the metadata log: only the
// leader's writes can commit without a round trip to another proxy.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// Get returns the metadata of one queue.
func (s *Store) Get(id mirror.QueueID) (mirror.QueueMeta, bool) { return s.fsm.get(id) }

// List returns every queue's metadata, sorted by vhost and name.
func (s *Store) List() []mirror.QueueMeta { return s.fsm.list() }

// Put writes meta if the queue's current version is expect (0: the queue
// must not exist yet) and returns the record as written, with its new
// Version. A stale expect returns ErrConflict.
func (s *Store) Put(ctx context.Context, meta mirror.QueueMeta, expect uint64) (mirror.QueueMeta, error) {
	res, err := s.apply(ctx, command{Op: opPut, Meta: &meta, Expect: expect})
	if err != nil {
		return mirror.QueueMeta{}, fmt.Errorf("recording %s: %w", meta.ID, err)
	}
	return *res.meta, nil
}

// Delete removes the queue's metadata if its version is still expect.
func (s *Store) Delete(ctx context.Context, id mirror.QueueID, expect uint64) error {
	if _, err := s.apply(ctx, command{Op: opDelete, ID: id, Expect: expect}); err != nil {
		return fmt.Errorf("removing %s: %w", id, err)
	}
	return nil
}

// GetExchange returns the record of an exchange declared through a proxy.
func (s *Store) GetExchange(id mirror.ExchangeID) (mirror.ExchangeMeta, bool) {
	return s.fsm.getExchange(id)
}

// ListExchanges returns every exchange record, sorted by vhost and name.
func (s *Store) ListExchanges() []mirror.ExchangeMeta { return s.fsm.listExchanges() }

// PutExchange writes an exchange's record if its current version is expect
// (0: no record yet) and returns it as written. A stale expect returns
// ErrConflict.
func (s *Store) PutExchange(ctx context.Context, x mirror.ExchangeMeta, expect uint64) (mirror.ExchangeMeta, error) {
	res, err := s.apply(ctx, command{Op: opPutExchange, Exchange: &x, Expect: expect})
	if err != nil {
		return mirror.ExchangeMeta{}, fmt.Errorf("recording %s: %w", x.ID, err)
	}
	return *res.exchange, nil
}

// DeleteExchange removes an exchange's record if its version is still
// expect.
func (s *Store) DeleteExchange(ctx context.Context, id mirror.ExchangeID, expect uint64) error {
	if _, err := s.apply(ctx, command{Op: opDeleteExchange, ExchangeID: id, Expect: expect}); err != nil {
		return fmt.Errorf("removing the record of %s: %w", id, err)
	}
	return nil
}

// Changes returns a channel that receives a value after the state changed
// (coalesced: one value may stand for many changes), and a function that
// stops the notifications.
func (s *Store) Changes() (<-chan struct{}, func()) { return s.fsm.subscribe() }

// Snapshot forces a snapshot of the state, compacting the log.
func (s *Store) Snapshot() error { return s.raft.Snapshot().Error() }

// Close stops this proxy's Raft node and closes the files. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		errs := []error{s.raft.Shutdown().Error()}
		if c, ok := s.transport.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
		errs = append(errs, s.bolt.Close())
		s.fsm.closeSubscribers()
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

func (s *Store) apply(ctx context.Context, cmd command) (applyResult, error) {
	data, err := cmd.encode()
	if err != nil {
		return applyResult{}, err
	}
	timeout := s.timeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	if timeout <= 0 {
		return applyResult{}, context.DeadlineExceeded
	}
	f := s.raft.Apply(data, timeout)
	if err := f.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
			errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrLeadershipTransferInProgress):
			return applyResult{}, fmt.Errorf("%w: %v", ErrNotLeader, err)
		case errors.Is(err, raft.ErrRaftShutdown):
			return applyResult{}, ErrClosed
		}
		return applyResult{}, err
	}
	res, _ := f.Response().(applyResult)
	return res, res.err
}

// sortMetas orders metadata by vhost, then name.
func sortMetas(metas []mirror.QueueMeta) {
	slices.SortFunc(metas, func(a, b mirror.QueueMeta) int { return compareNames(a.ID.VHost, a.ID.Name, b.ID.VHost, b.ID.Name) })
}

// compareNames orders records by vhost, then name.
func compareNames(aVHost, aName, bVHost, bName string) int {
	if c := strings.Compare(aVHost, bVHost); c != 0 {
		return c
	}
	return strings.Compare(aName, bName)
}
