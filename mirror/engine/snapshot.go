package engine

import (
	"maps"
	"sync/atomic"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// The Lookup snapshot. Lookup runs for every publish, so it reads an
// immutable value through one atomic load: no lock, no allocation. The
// value is the Store's state (base), rebuilt after every change the Store
// announces, plus the engine's own writes since (recent): those must be
// visible the moment the write returns (a client publishes right after
// its queue.declare-ok), and copying the whole state for each would make
// a declare cost as much as every queue together. recent stays small: it
// is folded into a rebuild once it holds maxRecent records, and emptied by
// every rebuild.

// maxRecent bounds the writes kept beside the base.
const maxRecent = 64

type snapshot struct {
	base   map[mirror.QueueID]mirror.QueueMeta
	recent map[mirror.QueueID]recentWrite
	// exchanges are the log's exchange records when base was built; an
	// exchange write rebuilds the snapshot.
	exchanges []mirror.ExchangeMeta
	// routing is the routing table of this snapshot, built at the first
	// publish to an exchange that needs it (Routing).
	routing atomic.Pointer[mirror.RoutingTable]
}

// queues returns every queue's record: base with recent writes applied.
func (s *snapshot) queues() []mirror.QueueMeta {
	out := make([]mirror.QueueMeta, 0, len(s.base)+len(s.recent))
	for id, m := range s.base {
		if _, overridden := s.recent[id]; !overridden {
			out = append(out, m)
		}
	}
	for _, w := range s.recent {
		if !w.deleted {
			out = append(out, w.meta)
		}
	}
	return out
}

// recentWrite is a record written (or deleted) after base was built.
type recentWrite struct {
	meta    mirror.QueueMeta
	deleted bool
}

// Lookup returns what the metadata log says about a queue.
func (e *Engine) Lookup(id mirror.QueueID) (mirror.QueueMeta, bool) {
	s := e.snapshot.Load()
	if w, ok := s.recent[id]; ok {
		return w.meta, !w.deleted
	}
	m, ok := s.base[id]
	return m, ok
}

// rebuild replaces the snapshot with the Store's current state.
func (e *Engine) rebuild() {
	e.rebuildMu.Lock()
	defer e.rebuildMu.Unlock()
	e.rebuildLocked()
}

func (e *Engine) rebuildLocked() {
	list := e.opts.Store.List()
	base := make(map[mirror.QueueID]mirror.QueueMeta, len(list))
	for _, q := range list {
		base[q.ID] = q
	}
	e.snapshot.Store(&snapshot{base: base, exchanges: e.opts.Store.ListExchanges()})
}

// noteWrite makes a record the engine wrote visible to Lookup at once.
// The Store had applied it when the write returned, so a rebuild that
// starts after this contains it too.
func (e *Engine) noteWrite(m mirror.QueueMeta) { e.note(m.ID, recentWrite{meta: m}) }

// noteDelete makes a deletion visible to Lookup at once.
func (e *Engine) noteDelete(id mirror.QueueID) { e.note(id, recentWrite{deleted: true}) }

func (e *Engine) note(id mirror.QueueID, w recentWrite) {
	e.rebuildMu.Lock()
	defer e.rebuildMu.Unlock()
	old := e.snapshot.Load()
	if len(old.recent) >= maxRecent {
		e.rebuildLocked()
		return
	}
	if cur, ok := old.recent[id]; ok && !cur.deleted && !w.deleted && cur.meta.Version > w.meta.Version {
		return // a newer write is shown already
	}
	recent := make(map[mirror.QueueID]recentWrite, len(old.recent)+1)
	maps.Copy(recent, old.recent)
	recent[id] = w
	e.snapshot.Store(&snapshot{base: old.base, recent: recent, exchanges: old.exchanges})
}
