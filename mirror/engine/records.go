package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// maxConflicts bounds the retries of a read-modify-write of one queue's
// metadata that keeps losing to other writers.
const maxConflicts = 10

// recorder changes records in the metadata log: it reads a record,
// changes it and writes it conditionally (Options.Writer), deciding again
// on a conflict with another writer; each write is shown to Lookup at
// once (snapshots), and a binding's is waited for on every proxy of a
// cluster. It keeps no state of its own.
type recorder struct {
	store  *store.Store
	writer MetaWriter
	peers  Peers // nil for one proxy alone
	view   *snapshots
	log    *slog.Logger
	life   lifetime
}

// update applies change to the queue's current record and writes it
// conditionally, deciding again on conflicts. It returns the record
// written (or the current one when change changed nothing).
func (r *recorder) update(id mirror.QueueID, change func(mirror.QueueMeta) (mirror.QueueMeta, bool)) (mirror.QueueMeta, error) {
	for range maxConflicts {
		m, ok := r.store.Get(id)
		if !ok {
			return mirror.QueueMeta{}, errors.New("queue no longer recorded")
		}
		next, changed := change(m)
		if !changed {
			return m, nil
		}
		ctx, cancel := r.life.operation()
		written, err := r.writer.Put(ctx, next, m.Version)
		cancel()
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err == nil {
			r.view.noteWrite(written)
		}
		return written, err
	}
	return mirror.QueueMeta{}, store.ErrConflict
}

// put writes m conditionally (expect: the version it replaces, 0 for a
// new record) and shows the write to Lookup.
func (r *recorder) put(ctx context.Context, m mirror.QueueMeta, expect uint64) (mirror.QueueMeta, error) {
	written, err := r.writer.Put(ctx, m, expect)
	if err == nil {
		r.view.noteWrite(written)
	}
	return written, err
}

// remove deletes the queue's record conditionally and shows the deletion
// to Lookup.
func (r *recorder) remove(ctx context.Context, id mirror.QueueID, expect uint64) error {
	err := r.writer.Delete(ctx, id, expect)
	if err == nil {
		r.view.noteDelete(id)
	}
	return err
}

// markSlave records the slave on backend as synchronised or not.
func (r *recorder) markSlave(id mirror.QueueID, backend string, synchronised bool) error {
	for range maxConflicts {
		m, ok := r.store.Get(id)
		if !ok {
			return errors.New("queue no longer recorded")
		}
		i := m.SlaveIndex(backend)
		if i < 0 {
			return errors.New("no longer a slave")
		}
		if m.Slaves[i].Synchronised == synchronised {
			return nil
		}
		m = m.Clone()
		m.Slaves[i].Synchronised = synchronised
		ctx, cancel := r.life.operation()
		written, err := r.writer.Put(ctx, m, m.Version)
		cancel()
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err == nil {
			r.log.Info("slave synchronisation recorded", "queue", id.Name, "vhost", id.VHost, "backend", backend, "synchronised", synchronised)
			r.view.noteWrite(written)
		}
		return err
	}
	return store.ErrConflict
}

// changeBindings writes the queue's bindings as change returns them (from
// a copy it may modify) when it says so, read again on a conflict with
// another writer. A queue no longer recorded is no error: its bindings
// went with it. The write is visible to this proxy's routing when it
// returns, and in a cluster to every other proxy's: the client's next
// publish, through any of them, must be routed by it.
func (r *recorder) changeBindings(ctx context.Context, id mirror.QueueID, change func([]mirror.Binding) ([]mirror.Binding, bool)) error {
	for range maxConflicts {
		m, ok := r.store.Get(id)
		if !ok {
			return nil
		}
		m = m.Clone()
		var write bool
		if m.Bindings, write = change(m.Bindings); !write {
			return nil
		}
		written, err := r.writer.Put(ctx, m, m.Version)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		r.view.noteWrite(written)
		r.appliedEverywhere(ctx, written.Version)
		return nil
	}
	return fmt.Errorf("%w (%d times)", store.ErrConflict, maxConflicts)
}

// updateExchange applies change to the exchange's record (a copy; exists
// false when there is none) and writes the result when change says so,
// read again on a conflict with another writer. The Lookup snapshot is
// rebuilt at once: the client's next publish must be routed by it.
func (r *recorder) updateExchange(ctx context.Context, id mirror.ExchangeID, change func(cur mirror.ExchangeMeta, exists bool) (mirror.ExchangeMeta, bool)) error {
	defer r.view.rebuild()
	for range maxConflicts {
		cur, exists := r.store.GetExchange(id)
		next, write := change(cur, exists)
		if !write {
			return nil
		}
		var expect uint64
		if exists {
			expect = cur.Version
		}
		written, err := r.writer.PutExchange(ctx, next, expect)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			r.log.Warn("cannot record an exchange", "exchange", id.Name, "vhost", id.VHost, "err", err)
			return err
		}
		// A write forwarded to the leader may not be applied here yet; the
		// rebuild must show it.
		if err := r.store.WaitApplied(ctx, written.Version); err != nil {
			r.log.Warn("an exchange's record is written but not applied here yet", "exchange", id.Name, "vhost", id.VHost, "err", err)
		}
		r.appliedEverywhere(ctx, written.Version)
		return nil
	}
	return fmt.Errorf("recording %s: %w (%d times)", id, store.ErrConflict, maxConflicts)
}

// appliedEverywhere waits until the other proxies of a cluster have
// applied a binding's write at index: publishes through any of them are
// routed by the bindings their own copy of the log shows, and the client
// that bound may publish through another proxy (or tell someone who does)
// as soon as it has its bind-ok.
func (r *recorder) appliedEverywhere(ctx context.Context, index uint64) {
	if r.peers == nil {
		return
	}
	if err := r.peers.WaitApplied(ctx, index); err != nil {
		r.log.Warn("a binding is recorded, but not every proxy confirmed it applied it", "index", index, "err", err)
	}
}
