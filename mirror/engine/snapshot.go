package engine

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
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

// snapshots owns the Lookup snapshot: the value Lookup reads, and the lock
// that serialises replacing it.
type snapshots struct {
	store *store.Store
	// current is replaced as a whole, never modified.
	current atomic.Pointer[snapshot]
	mu      sync.Mutex // serialises replacing current, so that an older List never overwrites a newer write
}

func newSnapshots(s *store.Store) *snapshots {
	v := &snapshots{store: s}
	v.current.Store(&snapshot{})
	return v
}

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
func (e *Engine) Lookup(id mirror.QueueID) (mirror.QueueMeta, bool) { return e.view.lookup(id) }

// lookup is Engine.Lookup.
func (v *snapshots) lookup(id mirror.QueueID) (mirror.QueueMeta, bool) {
	s := v.current.Load()
	if w, ok := s.recent[id]; ok {
		return w.meta, !w.deleted
	}
	m, ok := s.base[id]
	return m, ok
}

// rebuild replaces the snapshot with the Store's current state.
func (v *snapshots) rebuild() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.rebuildLocked()
}

func (v *snapshots) rebuildLocked() {
	list := v.store.List()
	base := make(map[mirror.QueueID]mirror.QueueMeta, len(list))
	for _, q := range list {
		base[q.ID] = q
	}
	v.current.Store(&snapshot{base: base, exchanges: v.store.ListExchanges()})
}

// noteWrite makes a record the engine wrote visible to Lookup at once.
// The Store had applied it when the write returned, so a rebuild that
// starts after this contains it too.
func (v *snapshots) noteWrite(m mirror.QueueMeta) { v.note(m.ID, recentWrite{meta: m}) }

// noteDelete makes a deletion visible to Lookup at once.
func (v *snapshots) noteDelete(id mirror.QueueID) { v.note(id, recentWrite{deleted: true}) }

func (v *snapshots) note(id mirror.QueueID, w recentWrite) {
	v.mu.Lock()
	defer v.mu.Unlock()
	old := v.current.Load()
	if len(old.recent) >= maxRecent {
		v.rebuildLocked()
		return
	}
	if cur, ok := old.recent[id]; ok && !cur.deleted && !w.deleted && cur.meta.Version > w.meta.Version {
		return // a newer write is shown already
	}
	recent := make(map[mirror.QueueID]recentWrite, len(old.recent)+1)
	maps.Copy(recent, old.recent)
	recent[id] = w
	v.current.Store(&snapshot{base: old.base, recent: recent, exchanges: old.exchanges})
}

// countMasters counts the queues each backend masters, from the snapshot
// (no copy of the Store's state).
func (v *snapshots) countMasters(backends []string) map[string]int {
	s := v.current.Load()
	counts := make(map[string]int, len(backends))
	for id, m := range s.base {
		if _, overridden := s.recent[id]; !overridden {
			counts[m.Master]++
		}
	}
	for _, w := range s.recent {
		if !w.deleted {
			counts[w.meta.Master]++
		}
	}
	return counts
}

// routing is Engine.Routing: the routing table of the current snapshot,
// built once per snapshot.
func (v *snapshots) routing(backends []string) *mirror.RoutingTable {
	s := v.current.Load()
	if t := s.routing.Load(); t != nil {
		return t
	}
	t := mirror.NewRoutingTable(backends, s.exchanges, s.queues())
	if !s.routing.CompareAndSwap(nil, t) {
		return s.routing.Load()
	}
	return t
}

// anyQueue reports whether f holds for a queue's record, read as lookup
// reads them: recent writes override the base.
func (v *snapshots) anyQueue(f func(mirror.QueueMeta) bool) bool {
	s := v.current.Load()
	for _, w := range s.recent {
		if !w.deleted && f(w.meta) {
			return true
		}
	}
	for id, m := range s.base {
		if _, overridden := s.recent[id]; !overridden && f(m) {
			return true
		}
	}
	return false
}
