package engine

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// A trimmer per slave copy, on the watcher's connection to the slave's
// backend in the queue's vhost. A trimmer lives as long as that
// connection: when the watcher reconnects (the backend went down and came
// back), the trimmer is replaced by one on the new connection.

// trimmers owns the trimmers of the slave copies this proxy trims, by
// queue and backend, with the copies found missing. Its lock guards its
// maps and the runs' fields; a Trimmer has its own lock, taken under it
// (settle), never the other way round.
type trimmers struct {
	operator *operator // the watcher's connections
	store    *store.Store
	roles    roles
	// options are Options.Trimmer; logger is Options.Logger, for the
	// trimmers' own logs.
	options controllink.TrimmerOptions
	logger  *slog.Logger
	log     *slog.Logger
	// gone handles a slave copy whose trimmer cannot start because the
	// copy is missing (Engine.copyGone). It takes the trimmers' lock
	// itself, so it is called without it.
	gone func(m mirror.QueueMeta, backend string)

	// lookup is Engine.Lookup: which slaves a queue's record has.
	lookup func(mirror.QueueID) (mirror.QueueMeta, bool)

	mu      sync.RWMutex
	byQueue map[mirror.QueueID]*queueTrimmers
	// early are the settles waiting for a trimmer to start (early.go).
	early map[trimmerRef]*earlySettles
}

// queueTrimmers are one queue's trimmers and missing copies, by backend.
type queueTrimmers struct {
	runs map[string]*trimmerRun
	// missing are slaves whose copy was found gone, and since when.
	missing map[string]time.Time
}

type trimmerRun struct {
	t          *controllink.Trimmer
	generation uint64 // of the watcher's connection it runs on
	// copiesUntil keeps the trimmer remembering what it trimmed for a
	// while after a copy into it ended, since copies may still be on
	// their way to it.
	copiesUntil time.Time
	// backlog is the never-synced slave's backlog, set at the first look
	// (checkBacklog); it goes with the trimmer whose Missed count it
	// holds.
	backlog *backlog
}

// backlog is a never-synced slave's mirror.Backlog: Held at its join, and
// the trimmer's Missed count then, from which Settled is counted.
type backlog struct {
	held       int
	missedBase int
}

// entryLocked returns the queue's entry, created when missing; call with
// mu held for writing.
func (t *trimmers) entryLocked(id mirror.QueueID) *queueTrimmers {
	q := t.byQueue[id]
	if q == nil {
		q = &queueTrimmers{runs: map[string]*trimmerRun{}}
		t.byQueue[id] = q
	}
	return q
}

// startAll starts the missing trimmers of m's slaves on live backends.
func (t *trimmers) startAll(m mirror.QueueMeta) {
	for _, s := range m.Slaves {
		t.ensure(m, s.Backend)
	}
}

// ensure makes sure the slave on backend has a trimmer on the watcher's
// current connection to it.
func (t *trimmers) ensure(m mirror.QueueMeta, backend string) {
	if !t.roles.trimsHere(backend) {
		return // another node's proxy trims it (cluster.go)
	}
	conn, gen, err := t.operator.conn(backend, m.ID.VHost)
	if err != nil {
		t.stop(m.ID, backend) // its connection is gone with the backend, or refused
		return
	}
	current := t.get(m.ID, backend)
	if current != nil && current.generation == gen {
		return
	}
	if current != nil {
		t.stop(m.ID, backend)
	}
	opts := t.trimmerOptions(m)
	opts.Tap = t.operator.watcher.Tap(conn)
	trimmer, err := controllink.StartTrimmer(conn, m.ID.Name, opts)
	if replyCode(err) == amqp.NotFound {
		t.gone(m, backend)
		return
	}
	if err != nil {
		t.log.Warn("cannot trim a slave copy; retrying", "queue", m.ID.Name, "vhost", m.ID.VHost, "backend", backend, "err", err)
		return
	}
	t.mu.Lock()
	_, recorded := t.store.Get(m.ID)
	q := t.entryLocked(m.ID)
	if old := q.runs[backend]; old != nil || !recorded {
		// Someone else started one meanwhile, or the queue was deleted.
		t.mu.Unlock()
		trimmer.Close()
		if !recorded {
			t.mu.Lock()
			if q := t.byQueue[m.ID]; q != nil && len(q.runs) == 0 {
				delete(t.byQueue, m.ID)
			}
			t.mu.Unlock()
		}
		return
	}
	run := &trimmerRun{t: trimmer, generation: gen}
	q.runs[backend] = run
	early := t.takeEarlyLocked(m.ID, backend)
	t.mu.Unlock()
	handEarly(run, early)
}

func (t *trimmers) trimmerOptions(m mirror.QueueMeta) controllink.TrimmerOptions {
	o := t.options
	o.Logger = t.logger.With("vhost", m.ID.VHost)
	// The trimmer gives back held messages once the queue's TTL has passed,
	// for the slave's broker to expire them as the master's does.
	args, err := amqpTable(m.Arguments)
	if err != nil {
		o.Logger.Warn("cannot decode the queue's arguments; its slave copies are trimmed without a message TTL", "queue", m.ID.Name, "err", err)
	}
	o.MessageTTL = controllink.QueueTTL(args)
	return o
}

// stop stops the trimmer of the slave on backend, if any.
func (t *trimmers) stop(id mirror.QueueID, backend string) {
	t.mu.Lock()
	var tr *trimmerRun
	if q := t.byQueue[id]; q != nil {
		tr = q.runs[backend]
		delete(q.runs, backend)
	}
	t.mu.Unlock()
	if tr != nil {
		tr.t.Close()
	}
}

// get returns the trimmer of the slave on backend, nil when none.
func (t *trimmers) get(id mirror.QueueID, backend string) *trimmerRun {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if q := t.byQueue[id]; q != nil {
		return q.runs[backend]
	}
	return nil
}

// of returns the queue's trimmers by backend (a copy of the map).
func (t *trimmers) of(id mirror.QueueID) map[string]*trimmerRun {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := map[string]*trimmerRun{}
	if q := t.byQueue[id]; q != nil {
		for b, tr := range q.runs {
			out[b] = tr
		}
	}
	return out
}

// forget forgets the queue and returns its trimmers, for the caller to
// close.
func (t *trimmers) forget(id mirror.QueueID) []*trimmerRun {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.byQueue[id]
	delete(t.byQueue, id)
	if q == nil {
		return nil
	}
	out := make([]*trimmerRun, 0, len(q.runs))
	for _, tr := range q.runs {
		out = append(out, tr)
	}
	return out
}

// closeAll stops every trimmer and forgets every queue.
func (t *trimmers) closeAll() {
	t.mu.Lock()
	var runs []*trimmerRun
	for _, q := range t.byQueue {
		for _, tr := range q.runs {
			runs = append(runs, tr)
		}
	}
	t.byQueue = make(map[mirror.QueueID]*queueTrimmers)
	t.early = make(map[trimmerRef]*earlySettles)
	t.mu.Unlock()
	for _, tr := range runs {
		tr.t.Close()
	}
}

// settle hands the outcome of a queue's messages at its master to its
// trimmers; each queues the work for its own goroutine.
// Those for a slave this proxy trims whose trimmer is not running yet wait
// for it (early.go).
func (t *trimmers) settle(id mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome) {
	var scratch [2]string
	t.mu.RLock()
	q := t.byQueue[id]
	if q != nil {
		for _, tr := range q.runs {
			settleRun(tr, ids, outcome)
		}
	}
	awaited := t.awaitedLocked(id, q, scratch[:0])
	t.mu.RUnlock()
	if len(awaited) > 0 {
		t.keepEarly(id, awaited, ids, outcome)
	}
}

// trimmerRef names one trimmer.
type trimmerRef struct {
	id      mirror.QueueID
	backend string
}

// sweep looks at every trimmer against the records in byID (and drops
// the settles waiting for slaves they no longer have): it returns
// those of slaves the records no longer have (stale), those whose copy is
// missing, and the queues no longer recorded (unrecorded). It forgets the
// missing marks of copies that are there, and ends a copy's expectation
// (ExpectCopies) once its time is up.
func (t *trimmers) sweep(byID map[mirror.QueueID]mirror.QueueMeta, now time.Time) (stale, missing []trimmerRef, unrecorded []mirror.QueueID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, q := range t.byQueue {
		m, ok := byID[id]
		if !ok {
			unrecorded = append(unrecorded, id)
			continue
		}
		for b, tr := range q.runs {
			switch {
			case m.SlaveIndex(b) < 0:
				stale = append(stale, trimmerRef{id, b})
			case tr.t.QueueMissing():
				missing = append(missing, trimmerRef{id, b})
			default:
				delete(q.missing, b) // there again, or never gone
				if !tr.copiesUntil.IsZero() && now.After(tr.copiesUntil) {
					tr.copiesUntil = time.Time{}
					tr.t.ExpectCopies(false)
				}
			}
		}
	}
	t.sweepEarlyLocked(byID, now)
	return stale, missing, unrecorded
}

// backends returns the backends of the queue's trimmers.
func (t *trimmers) backends(id mirror.QueueID) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []string
	if q := t.byQueue[id]; q != nil {
		for b := range q.runs {
			out = append(out, b)
		}
	}
	return out
}

// markMissing notes that the slave copy on backend is missing, and returns
// since when it is (seen false: from now).
func (t *trimmers) markMissing(id mirror.QueueID, backend string) (since time.Time, seen bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.entryLocked(id)
	if q.missing == nil {
		q.missing = make(map[string]time.Time)
	}
	since, seen = q.missing[backend]
	if !seen {
		q.missing[backend] = time.Now()
	}
	return since, seen
}

// expectCopies makes the trimmers of the targets remember what they trim
// while copies may still reach them: a copy can bring a message the master
// settled after the slave trimmed its fan-out copy. The returned function
// ends that a while after the copy.
func (t *trimmers) expectCopies(id mirror.QueueID, targets []string) (func(), error) {
	var runs []*trimmerRun
	for _, b := range targets {
		tr := t.get(id, b)
		if tr == nil {
			return nil, fmt.Errorf("the slave on %s has no trimmer yet", b)
		}
		runs = append(runs, tr)
	}
	for _, tr := range runs {
		tr.t.ExpectCopies(true)
	}
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		for _, tr := range runs {
			tr.copiesUntil = time.Now().Add(30 * time.Second)
		}
	}, nil
}

// backlog returns the backlog of the never-synced slave on backend, set to
// held messages and the trimmer's missed count now at the first call for
// its trimmer. Without a trimmer it is what a first call would set.
func (t *trimmers) backlog(id mirror.QueueID, backend string, held, missed int) backlog {
	t.mu.Lock()
	defer t.mu.Unlock()
	fresh := backlog{held: held, missedBase: missed}
	q := t.byQueue[id]
	if q == nil || q.runs[backend] == nil {
		return fresh
	}
	tr := q.runs[backend]
	if tr.backlog == nil {
		tr.backlog = &fresh
	}
	return *tr.backlog
}
