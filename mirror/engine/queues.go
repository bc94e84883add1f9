package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// What the proxy tells the engine about queues its clients declare, use
// and delete (proxy.Mirror).

// Place decides where a new queue lives: its master by the locator (the
// x-queue-master-locator argument, the policy's, the configured one), its
// slaves by the effective policy, all synchronised since the queue is new
// and empty. Nothing is recorded.
func (e *Engine) Place(ctx context.Context, q mirror.QueueMeta, clientNode string) (mirror.QueueMeta, error) {
	def, _ := definition(e.opts.Policies, q.ID)
	argument, err := tableString(q.Arguments, "x-queue-master-locator")
	if err != nil {
		return mirror.QueueMeta{}, fmt.Errorf("placing %s: arguments: %w", q.ID, err)
	}
	locator, err := mirror.ResolveLocator(argument, def, e.opts.Locator)
	if err != nil {
		return mirror.QueueMeta{}, fmt.Errorf("placing %s: %w", q.ID, err)
	}
	live := e.liveness.placeableIn(q.ID.VHost) // never on a drained backend (drain.go)
	candidates := e.backends
	if def.HAMode == config.HANodes {
		// Master on a named backend where one is up: a master elsewhere
		// would be handed over as soon as its (empty) slaves count as
		// synchronised, for nothing.
		var named []string
		for _, b := range e.backends {
			if slices.Contains(def.HAParams.Nodes, b) && live.Has(b) {
				named = append(named, b)
			}
		}
		if len(named) > 0 {
			candidates = named
		}
	}
	placement := mirror.Placement{
		Backends:   candidates,
		Live:       live,
		Masters:    e.view.countMasters(e.backends),
		ClientNode: clientNode,
		Random:     random,
	}
	master, err := placement.Master(locator)
	if err != nil {
		return mirror.QueueMeta{}, fmt.Errorf("placing %s: %w", q.ID, err)
	}
	q = q.Clone()
	q.Master, q.Slaves, q.Epoch, q.Version = master, nil, 0, 0
	plan := mirror.Reconcile(q, def, e.backends, live)
	out := plan.Meta
	for i := range out.Slaves {
		out.Slaves[i].Synchronised = true
	}
	if mirror.DropsHead(q.Arguments) {
		// Its copies dead-letter into the proxy's exchange (deadletters.go),
		// which must exist before the first message is dropped.
		out.ForwardsDeadLetters = true
		for _, b := range out.Backends() {
			if err := e.operator.ensureDeadLetters(b, q.ID.VHost); err != nil {
				return mirror.QueueMeta{}, fmt.Errorf("placing %s: %w", q.ID, err)
			}
		}
	}
	return out, nil
}

// Declared records a queue the proxy declared on every backend of q and
// starts trimming its slaves. When the queue was recorded meanwhile (by
// another client or proxy), the stored record is returned.
func (e *Engine) Declared(ctx context.Context, q mirror.QueueMeta) (mirror.QueueMeta, error) {
	written, err := e.opts.Writer.Put(ctx, q, 0)
	if errors.Is(err, store.ErrConflict) {
		if stored, ok := e.opts.Store.Get(q.ID); ok {
			return stored, nil
		}
	}
	if err != nil {
		return mirror.QueueMeta{}, err
	}
	e.negative.forget(q.ID)
	e.view.noteWrite(written)
	e.trimmers.startAll(written)
	return written, nil
}

// Deleted forgets a queue the client deleted: its trimmers and any sync
// stop, and its record goes. The proxy deleted every copy; the slave
// copies are deleted again (a missing one is no error) in case the engine
// declared one again meanwhile, taking its disappearance for a broker's
// loss.
func (e *Engine) Deleted(ctx context.Context, id mirror.QueueID) {
	e.reconciler.stopQueue(id)
	for range maxConflicts {
		m, ok := e.opts.Store.Get(id)
		if !ok {
			break
		}
		for _, s := range m.Slaves {
			if err := e.operator.deleteCopy(s.Backend, id); err != nil && !errors.Is(err, errBackendDown) {
				e.log.Debug("cannot delete a slave copy again", "queue", id.Name, "backend", s.Backend, "err", err)
			}
		}
		err := e.opts.Writer.Delete(ctx, id, m.Version)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			e.log.Warn("queue deleted but its record stays", "queue", id.Name, "vhost", id.VHost, "err", err)
		}
		break
	}
	if _, ok := e.opts.Store.Get(id); !ok {
		e.view.noteDelete(id)
	}
}

// Purged empties every slave copy of a queue whose master the client
// purged, through each slave's trimmer (which holds most of the copy's
// messages unacknowledged). A slave without a trimmer is purged directly.
func (e *Engine) Purged(ctx context.Context, id mirror.QueueID) {
	m, ok := e.opts.Store.Get(id)
	if !ok {
		return
	}
	trimmers := e.trimmers.of(id)
	var wg sync.WaitGroup
	for _, s := range m.Slaves {
		wg.Add(1)
		go func(backend string) {
			defer wg.Done()
			var err error
			if tr := trimmers[backend]; tr != nil {
				_, err = tr.t.Purge(ctx)
			} else if !e.roles.trimsHere(backend) {
				err = e.reconciler.purgeRemote(ctx, backend, id)
			} else {
				err = e.operator.purgeCopy(backend, id)
			}
			if err != nil {
				e.log.Warn("cannot purge a slave copy", "queue", id.Name, "vhost", id.VHost, "backend", backend, "err", err)
			}
		}(s.Backend)
	}
	wg.Wait()
}

// Bound records a binding made (bound) or removed on every copy of a
// queue, so that a slave added later is bound the same way and publishes
// to the exchange are routed to the queue. An error says the binding
// exists on the brokers but not in the log: publishes through the proxies
// may miss the queue, and the client must not be told it is bound.
func (e *Engine) Bound(ctx context.Context, id mirror.QueueID, b mirror.Binding, bound bool) error {
	err := e.records.changeBindings(ctx, id, func(bindings []mirror.Binding) ([]mirror.Binding, bool) {
		i := slices.IndexFunc(bindings, func(x mirror.Binding) bool {
			return x.Exchange == b.Exchange && x.RoutingKey == b.RoutingKey && slices.Equal(x.Arguments, b.Arguments)
		})
		switch {
		case bound && i >= 0, !bound && i < 0:
			return bindings, false // recorded already
		case bound:
			return append(bindings, b), true
		default:
			return slices.Delete(bindings, i, i+1), true
		}
	})
	if err != nil {
		e.log.Warn("cannot record a binding", "queue", id.Name, "vhost", id.VHost, "exchange", b.Exchange, "err", err)
		return fmt.Errorf("recording the binding of %s to exchange '%s': %w", id, b.Exchange, err)
	}
	return nil
}

// Settle tells the trimmers of a queue's slaves what became of the
// master's copies of ids: acked (the slaves' copies are acked), rejected
// without requeue (rejected the same way, so that every copy is
// dead-lettered by its own broker: see "Dead-lettering" in mirror/doc.go),
// delivered to a client or requeued (which decide when an expiring copy is
// given back to its broker). It never waits on the network: each trimmer
// queues the work for its own goroutine, and the slaves on other nodes are
// told through Peers.
func (e *Engine) Settle(id mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome) {
	e.trimmers.settle(id, ids, outcome)
	if !e.roles.clustered {
		return
	}
	if m, ok := e.Lookup(id); ok {
		handSettles(e.opts.Peers, e.roles.node, m, ids, outcome) // cluster.go
	}
}
