package mirror

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// command is one entry of the metadata log. Entries are JSON: the log is
// small (one entry per queue change) and readable with any bolt tool when
// something goes wrong.
type command struct {
	Op     string     `json:"op"`
	Meta   *QueueMeta `json:"meta,omitempty"`
	ID     QueueID    `json:"id,omitzero"`
	Expect uint64     `json:"expect"`
}

const (
	opPut    = "put"
	opDelete = "delete"
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
	meta *QueueMeta
	err  error
}

// metaFSM is the replicated state: every queue's metadata. raft calls Apply,
// Snapshot and Restore from its own goroutine; readers take mu.
type metaFSM struct {
	mu     sync.RWMutex
	queues map[QueueID]QueueMeta

	subMu       sync.Mutex
	subscribers map[chan struct{}]struct{}
}

func newMetaFSM() *metaFSM {
	return &metaFSM{queues: make(map[QueueID]QueueMeta), subscribers: make(map[chan struct{}]struct{})}
}

// Apply applies one committed entry. A conditional write whose version is
// stale changes nothing and answers ErrConflict: every proxy applies the
// same entries in the same order, so every proxy rejects the same writes.
func (f *metaFSM) Apply(entry *raft.Log) any {
	var cmd command
	if err := json.Unmarshal(entry.Data, &cmd); err != nil {
		return applyResult{err: fmt.Errorf("undecodable metadata entry %d: %w", entry.Index, err)}
	}
	f.mu.Lock()
	res := f.applyLocked(cmd, entry.Index)
	f.mu.Unlock()
	if res.err == nil {
		f.notify()
	}
	return res
}

func (f *metaFSM) applyLocked(cmd command, index uint64) applyResult {
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
		return applyResult{meta: &meta}
	case opDelete:
		current, exists := f.queues[cmd.ID]
		if !exists || current.Version != cmd.Expect {
			return applyResult{err: ErrConflict}
		}
		delete(f.queues, cmd.ID)
		return applyResult{}
	}
	return applyResult{err: fmt.Errorf("metadata entry %d: unknown operation %q", index, cmd.Op)}
}

func (f *metaFSM) get(id QueueID) (QueueMeta, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m, ok := f.queues[id]
	if !ok {
		return QueueMeta{}, false
	}
	return m.Clone(), true
}

func (f *metaFSM) list() []QueueMeta {
	f.mu.RLock()
	out := make([]QueueMeta, 0, len(f.queues))
	for _, m := range f.queues {
		out = append(out, m.Clone())
	}
	f.mu.RUnlock()
	sortMetas(out)
	return out
}

// Snapshot captures the state for raft to persist; the records are copied
// here, so raft may write them while Apply goes on.
func (f *metaFSM) Snapshot() (raft.FSMSnapshot, error) {
	return metaSnapshot{queues: f.list()}, nil
}

// Restore replaces the state with a snapshot's.
func (f *metaFSM) Restore(r io.ReadCloser) error {
	defer r.Close()
	var queues []QueueMeta
	if err := json.NewDecoder(r).Decode(&queues); err != nil {
		return fmt.Errorf("restoring metadata snapshot: %w", err)
	}
	state := make(map[QueueID]QueueMeta, len(queues))
	for _, m := range queues {
		state[m.ID] = m
	}
	f.mu.Lock()
	f.queues = state
	f.mu.Unlock()
	f.notify()
	return nil
}

type metaSnapshot struct{ queues []QueueMeta }

func (s metaSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.queues); err != nil {
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
