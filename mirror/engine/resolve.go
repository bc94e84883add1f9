package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Adoption: queues that were on the backends before the proxy (or were
// declared past it) are found there the first time a client names one, and
// recorded like queues declared through the proxy.

// found is what probing the backends says about one queue.
type found struct {
	backend  string
	messages int
}

// Resolve is Lookup for a queue the log may not know yet. On a miss it asks
// every live backend (a passive declare on the proxy's own connection);
// found on one, the queue is adopted with that backend as master; found on
// several, the one with most messages (the first configured on a tie)
// becomes master and the others unsynchronised slaves. A queue deleted
// through the proxies (the log keeps its tombstone) is not found, and its
// copies that hold messages are deleted. The engine then
// mirrors it per its policy like any queue. An exclusive queue of some
// connection (405) is returned with its backend as master but not
// recorded: exclusive queues are never mirrored. No backend having the
// queue is ok=false, remembered for a moment, so that a stream of
// publishes to a missing queue does not probe for each message.
func (e *Engine) Resolve(ctx context.Context, id mirror.QueueID) (mirror.QueueMeta, bool, error) {
	if m, ok := e.Lookup(id); ok {
		return m, true, nil
	}
	// The snapshot may lag a write by a moment.
	if m, ok := e.opts.Store.Get(id); ok {
		return m, true, nil
	}
	if e.negative.has(id) {
		return mirror.QueueMeta{}, false, nil
	}
	live := e.liveness.live()
	var copies []found
	var errs []error
	for _, b := range e.backends {
		if !live.Has(b) || !e.liveness.accepts(b, id.VHost) {
			continue // a backend refusing the vhost cannot be asked, nor hold a copy the proxy can mirror
		}
		if err := ctx.Err(); err != nil {
			return mirror.QueueMeta{}, false, err
		}
		q, err := e.operator.inspect(b, id)
		switch replyCode(err) {
		case 0:
			if err != nil {
				errs = append(errs, fmt.Errorf("backend %s: %w", b, err))
				continue
			}
			copies = append(copies, found{backend: b, messages: q.Messages})
		case amqp.NotFound:
		case amqp.ResourceLocked:
			return mirror.QueueMeta{ID: id, Master: b}, true, nil
		default:
			errs = append(errs, fmt.Errorf("backend %s: %w", b, err))
		}
	}
	if len(copies) == 0 {
		if len(errs) > 0 {
			// Not known to be missing: a backend that could not answer may
			// have it.
			return mirror.QueueMeta{}, false, fmt.Errorf("resolving %s: %w", id, errors.Join(errs...))
		}
		e.negative.add(id)
		return mirror.QueueMeta{}, false, nil
	}
	// A deleted queue's copies that hold messages are stale: deleted. An
	// empty one is left (not adopted either): it may be a copy a client is
	// declaring again through a proxy right now, whose record, which lifts
	// the tombstone, is not written yet.
	var stale []string
	for _, c := range copies {
		if c.messages > 0 {
			stale = append(stale, c.backend)
		}
	}
	if buried, err := e.operator.buryCopies(id, stale); buried {
		if err != nil {
			return mirror.QueueMeta{}, false, fmt.Errorf("resolving %s: %w", id, err)
		}
		e.negative.add(id)
		return mirror.QueueMeta{}, false, nil
	}
	m := adoptedMeta(id, copies)
	written, err := e.opts.Writer.Put(ctx, m, 0)
	for errors.Is(err, store.ErrConflict) {
		// The log holds the queue and this proxy's copy of it may not
		// show it yet (in a cluster it lags the leader by a moment): wait
		// for it rather than answer from what the backends hold.
		if stored, ok := e.opts.Store.Get(id); ok {
			return stored, true, nil
		}
		select {
		case <-ctx.Done():
			return mirror.QueueMeta{}, false, fmt.Errorf("adopting %s: %w (and this proxy's copy of the log does not show it yet)", id, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err != nil {
		return mirror.QueueMeta{}, false, fmt.Errorf("adopting %s: %w", id, err)
	}
	e.log.Info("queue adopted", "queue", id.Name, "vhost", id.VHost, "master", written.Master, "slaves", written.Backends()[1:])
	e.view.noteWrite(written)
	e.trimmers.startAll(written)
	e.poke() // reconcile it with its policy now
	return written, true, nil
}

// adoptedMeta is the metadata of a queue found on the backends in copies
// (in configuration order): the copy with most messages is master (the
// first on a tie), the others unsynchronised slaves in configuration
// order. What it was declared with cannot be read back over AMQP, so it is
// recorded as durable without arguments: slaves added later are declared
// so (a durable copy keeps persistent messages whatever the master is).
func adoptedMeta(id mirror.QueueID, copies []found) mirror.QueueMeta {
	master := 0
	for i, c := range copies {
		if c.messages > copies[master].messages {
			master = i
		}
	}
	m := mirror.QueueMeta{ID: id, Master: copies[master].backend, Durable: true, Adopted: true}
	for i, c := range copies {
		if i != master {
			m.Slaves = append(m.Slaves, mirror.Slave{Backend: c.backend})
		}
	}
	return m
}

// negativeCache remembers, for a moment, the queues no backend had when
// Resolve asked, so that a stream of publishes to a missing queue does not
// probe the backends for each message.
type negativeCache struct {
	ttl   time.Duration
	mu    sync.Mutex
	until map[mirror.QueueID]time.Time // queues no backend had, until when
}

func newNegativeCache(ttl time.Duration) *negativeCache {
	return &negativeCache{ttl: ttl, until: make(map[mirror.QueueID]time.Time)}
}

func (n *negativeCache) has(id mirror.QueueID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	until, ok := n.until[id]
	if ok && time.Now().Before(until) {
		return true
	}
	if ok {
		delete(n.until, id)
	}
	return false
}

func (n *negativeCache) add(id mirror.QueueID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	if len(n.until) > 10000 {
		// Bounded: a client naming many missing queues must not grow it
		// for ever; expired entries go first.
		for k, until := range n.until {
			if now.After(until) {
				delete(n.until, k)
			}
		}
	}
	n.until[id] = now.Add(n.ttl)
}

func (n *negativeCache) forget(id mirror.QueueID) {
	n.mu.Lock()
	delete(n.until, id)
	n.mu.Unlock()
}
