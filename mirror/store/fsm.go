package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// command is one entry of the metadata log. Entries are JSON: the log is
// small (one entry per queue change) and readable with any bolt tool when
// something goes wrong.
type command struct {
	Op     string            `json:"op"`
	Meta   *mirror.QueueMeta `json:"meta,omitempty"`
	ID     mirror.QueueID    `json:"id,omitzero"`
	Expect uint64            `json:"expect"`
	// Policy is the change of a runtime policy (opPolicy).
	Policy *PolicyChange `json:"policy,omitempty"`
	// Exchange is the record of opPutExchange; ExchangeID names the
	// exchange of opDeleteExchange.
	Exchange   *mirror.ExchangeMeta `json:"exchange,omitempty"`
	ExchangeID mirror.ExchangeID    `json:"exchange_id,omitzero"`
}

const (
	opPut    = "put"
	opDelete = "delete"
	opPolicy = "policy"

	opPutExchange    = "put_exchange"
	opDeleteExchange = "delete_exchange"
)

func (c command) encode() ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encoding metadata command: %w", err)
	}
	return b, nil
}

// applyResult is what the state machine returns for one entry.
type applyResult struct {
	meta     *mirror.QueueMeta
	exchange *mirror.ExchangeMeta
	policy   PolicyResult
	err      error
}

// metaFSM is the replicated state: every queue's metadata, the tombstones
// of deleted queues, the exchanges declared through a proxy and the
// runtime policies. raft calls Apply, Snapshot
// and Restore from its own goroutine; readers take mu.
type metaFSM struct {
	mu         sync.RWMutex
	queues     map[mirror.QueueID]mirror.QueueMeta
	tombstones map[mirror.QueueID]Tombstone
	exchanges  map[mirror.ExchangeID]mirror.ExchangeMeta
	policies   RuntimePolicies
	// applied is the index of the last entry applied here (raft's own
	// AppliedIndex runs ahead of the FSM), for Store.WaitApplied.
	applied uint64

	subMu       sync.Mutex
	subscribers map[chan struct{}]struct{}
}

func newMetaFSM() *metaFSM {
	return &metaFSM{
		queues:      make(map[mirror.QueueID]mirror.QueueMeta),
		tombstones:  make(map[mirror.QueueID]Tombstone),
		exchanges:   make(map[mirror.ExchangeID]mirror.ExchangeMeta),
		subscribers: make(map[chan struct{}]struct{}),
	}
}

// Apply applies one committed entry. A conditional write whose version is
// stale changes nothing and answers ErrConflict: every proxy applies the
// same entries in the same order, so every proxy rejects the same writes.
func (f *metaFSM) Apply(entry *raft.Log) any {
	var cmd command
	if err := json.Unmarshal(entry.Data, &cmd); err != nil {
		f.mu.Lock()
		f.applied = max(f.applied, entry.Index)
		f.mu.Unlock()
		return applyResult{err: fmt.Errorf("undecodable metadata entry %d: %w", entry.Index, err)}
	}
	f.mu.Lock()
	res := f.applyLocked(cmd, entry)
	f.applied = max(f.applied, entry.Index)
	f.mu.Unlock()
	if res.err == nil {
		f.notify()
	}
	return res
}

func (f *metaFSM) applyLocked(cmd command, entry *raft.Log) applyResult {
	index := entry.Index
	switch cmd.Op {
	case opPut:
		if cmd.Meta == nil {
			return applyResult{err: fmt.Errorf("metadata entry %d: put without a record", index)}
		}
		current, exists := f.queues[cmd.Meta.ID]
		if exists && current.Version != cmd.Expect || !exists && cmd.Expect != 0 {
			return applyResult{err: ErrConflict}
		}
		meta := cmd.Meta.Clone()
		meta.Version = index
		f.queues[meta.ID] = meta
		// Declared again: its copies are wanted again.
		delete(f.tombstones, meta.ID)
		return applyResult{meta: &meta}
	case opDelete:
		current, exists := f.queues[cmd.ID]
		if !exists || current.Version != cmd.Expect {
			return applyResult{err: ErrConflict}
		}
		delete(f.queues, cmd.ID)
		f.bury(current, entry)
		return applyResult{}
	case opPolicy:
		if cmd.Policy == nil {
			return applyResult{err: fmt.Errorf("metadata entry %d: policy operation without a change", index)}
		}
		res, err := f.policies.apply(*cmd.Policy, index)
		if err != nil {
			return applyResult{err: fmt.Errorf("metadata entry %d: %w", index, err)}
		}
		return applyResult{policy: res}
	case opPutExchange:
		if cmd.Exchange == nil {
			return applyResult{err: fmt.Errorf("metadata entry %d: exchange put without a record", index)}
		}
		current, exists := f.exchanges[cmd.Exchange.ID]
		if exists && current.Version != cmd.Expect || !exists && cmd.Expect != 0 {
			return applyResult{err: ErrConflict}
		}
		x := cmd.Exchange.Clone()
		x.Version = index
		f.exchanges[x.ID] = x
		return applyResult{exchange: &x}
	case opDeleteExchange:
		current, exists := f.exchanges[cmd.ExchangeID]
		if !exists || current.Version != cmd.Expect {
			return applyResult{err: ErrConflict}
		}
		delete(f.exchanges, cmd.ExchangeID)
		return applyResult{}
	}
	return applyResult{err: fmt.Errorf("metadata entry %d: unknown operation %q", index, cmd.Op)}
}

func (f *metaFSM) appliedIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.applied
}

func (f *metaFSM) get(id mirror.QueueID) (mirror.QueueMeta, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m, ok := f.queues[id]
	if !ok {
		return mirror.QueueMeta{}, false
	}
	return m.Clone(), true
}

func (f *metaFSM) getExchange(id mirror.ExchangeID) (mirror.ExchangeMeta, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	x, ok := f.exchanges[id]
	if !ok {
		return mirror.ExchangeMeta{}, false
	}
	return x.Clone(), true
}

func (f *metaFSM) listExchanges() []mirror.ExchangeMeta {
	f.mu.RLock()
	out := make([]mirror.ExchangeMeta, 0, len(f.exchanges))
	for _, x := range f.exchanges {
		out = append(out, x.Clone())
	}
	f.mu.RUnlock()
	slices.SortFunc(out, func(a, b mirror.ExchangeMeta) int { return compareNames(a.ID.VHost, a.ID.Name, b.ID.VHost, b.ID.Name) })
	return out
}

func (f *metaFSM) list() []mirror.QueueMeta {
	f.mu.RLock()
	out := make([]mirror.QueueMeta, 0, len(f.queues))
	for _, m := range f.queues {
		out = append(out, m.Clone())
	}
	f.mu.RUnlock()
	sortMetas(out)
	return out
}

// snapshotState is a snapshot as persisted. Snapshots written before
// tombstones and policies were in the log are a bare array of queues;
// Restore reads both.
type snapshotState struct {
	Queues     []mirror.QueueMeta    `json:"queues"`
	Tombstones []Tombstone           `json:"tombstones,omitempty"`
	Exchanges  []mirror.ExchangeMeta `json:"exchanges,omitempty"`
	Policies   RuntimePolicies       `json:"policies"`
	// Applied is the index of the last entry the state includes.
	Applied uint64 `json:"applied"`
}

// Snapshot captures the state for raft to persist; the records are copied
// here, so raft may write them while Apply goes on.
func (f *metaFSM) Snapshot() (raft.FSMSnapshot, error) {
	// raft never calls Snapshot concurrently with Apply, so the parts
	// read one after another are of one index.
	return metaSnapshot{state: snapshotState{
		Queues:     f.list(),
		Tombstones: f.listTombstones(),
		Exchanges:  f.listExchanges(),
		Policies:   f.runtimePolicies(),
		Applied:    f.appliedIndex(),
	}}, nil
}

// Restore replaces the state with a snapshot's.
func (f *metaFSM) Restore(r io.ReadCloser) error {
	defer r.Close()
	raw, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("restoring metadata snapshot: %w", err)
	}
	var snap snapshotState
	if trimmed := bytes.TrimSpace(raw); len(trimmed) > 0 && trimmed[0] == '[' {
		err = json.Unmarshal(trimmed, &snap.Queues)
	} else {
		err = json.Unmarshal(raw, &snap)
	}
	if err != nil {
		return fmt.Errorf("restoring metadata snapshot: %w", err)
	}
	queues := make(map[mirror.QueueID]mirror.QueueMeta, len(snap.Queues))
	for _, m := range snap.Queues {
		queues[m.ID] = m
	}
	tombstones := make(map[mirror.QueueID]Tombstone, len(snap.Tombstones))
	for _, t := range snap.Tombstones {
		tombstones[t.ID] = t
	}
	exchanges := make(map[mirror.ExchangeID]mirror.ExchangeMeta, len(snap.Exchanges))
	for _, x := range snap.Exchanges {
		exchanges[x.ID] = x
	}
	f.mu.Lock()
	f.queues, f.tombstones, f.exchanges, f.policies = queues, tombstones, exchanges, snap.Policies
	f.applied = max(f.applied, snap.Applied)
	f.mu.Unlock()
	f.notify()
	return nil
}

type metaSnapshot struct{ state snapshotState }

func (s metaSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.state); err != nil {
		sink.Cancel()
		return fmt.Errorf("writing metadata snapshot: %w", err)
	}
	return sink.Close()
}

func (metaSnapshot) Release() {}

// subscribe registers a change notification channel (capacity one: a
// notification never blocks Apply, and a slow reader sees one value for
// many changes).
func (f *metaFSM) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	f.subMu.Lock()
	f.subscribers[ch] = struct{}{}
	f.subMu.Unlock()
	return ch, func() {
		f.subMu.Lock()
		defer f.subMu.Unlock()
		if _, ok := f.subscribers[ch]; ok {
			delete(f.subscribers, ch)
			close(ch)
		}
	}
}

func (f *metaFSM) notify() {
	f.subMu.Lock()
	defer f.subMu.Unlock()
	for ch := range f.subscribers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (f *metaFSM) closeSubscribers() {
	f.subMu.Lock()
	defer f.subMu.Unlock()
	for ch := range f.subscribers {
		delete(f.subscribers, ch)
		close(ch)
	}
}
