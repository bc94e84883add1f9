// Package engine carries out mirror's decisions: it is the replication
// engine the proxy's data path asks (proxy.Mirror). It records where queues
// live in the metadata Store, keeps a lock-free snapshot of it for the
// publish path, adopts queues found on the backends, keeps slave copies in
// step (a controllink.Trimmer per slave), applies policy changes to
// existing queues (adding and dropping slaves), and synchronises new slaves.
//
// The proxy does the work that needs a client (declares, binds, publishes,
// consumes on the client's own backend links); the engine does the rest on
// the proxy's own connections, those of the controllink.Watcher, each in
// the vhost of the queue or exchange concerned (Watcher.VHostConn).
//
// # Parts
//
// Engine is the API: the methods the proxy, serve and ctl call; Member
// (Engine.Member) is the side the rest of a sidecar cluster calls: the
// other proxies' requests, serf's verdicts and pause_minority. Behind
// them, each concern is a type with its own state, lock
// and methods, which Engine holds by pointer and delegates to; a part that
// needs another's services holds a pointer to that part alone, never the
// Engine:
//
//	snapshots      the Lookup snapshot and the routing table built on it
//	recorder       conditional writes of records (read, change, write,
//	               again on a conflict), shown to Lookup at once
//	operator       the engine's own operations on one backend (declare,
//	               delete, purge, probe, a sync's connection); no state
//	liveness       which backends count up and may take copies: watcher,
//	               serf's failed members, drained backends, the pause
//	trimmers       a controllink.Trimmer per slave copy trimmed here, the
//	               copies found missing, never-synced slaves' backlogs
//	syncs          the sync running per queue, failed and half-done copies
//	reconciler     the loop's work on every queue: policy plans, trimmers
//	               against the records, expired masters, backlogs, copies
//	               reported short of a publish (the one state it owns)
//	deadLetters    the forwarders of what the copies of queues that drop
//	               their head dead-letter into the proxy's exchange
//	failover       backend events: promotions, lost slaves, rejoins
//	history        the last promotions failover wrote, for the status page
//	drainer        ctl drain's promotions and removals; no state
//	listing        ctl list_queues, with the functions that ask this
//	               proxy's clients
//	negativeCache  Resolve's memory of queues no backend had
//	replyNodes     each backend's Erlang node, for direct reply-to
//	roles          which work falls to this proxy in a cluster; a value
//	counters       what the parts count for the metrics; atomics only
//	stallGuard     in a cluster, whether this proxy stood still since its
//	               metadata was last known current (stall.go)
//
// # Goroutines and locks
//
// Start runs three goroutines until Close: one rebuilds the Lookup
// snapshot on every Store change, one takes the Watcher's events (it must
// never stop reading them) into failover's queue and wakes the third, the
// loop, which owns the background work: backend losses and returns
// (failover), reconciling every queue with its policy, checking masters
// that may have deleted themselves, and backlogs of manual slaves
// (reconciler). failover's lost backends and start check are the loop's
// alone. Syncs run in goroutines of their own (syncs), one per queue at
// most. Client goroutines call Place, Declared, Deleted, Purged, Bound and
// Settle concurrently with all of that; the Store's conditional writes
// settle races over metadata.
//
// Lock order: trimmers.mu before a Trimmer's own lock (settles are handed
// to the trimmers under a read lock of it) and before the Store's;
// snapshots.mu before the Store's. Every other lock is taken alone:
// syncs.mu, failover.mu (the events queue), history.mu, liveness's (failed members,
// drained backends), missedCopies.mu, negativeCache.mu and replyNodes.mu.
// No part calls another while holding its own lock, and nothing does
// network I/O while holding any of them.
package engine

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Options configure an Engine.
type Options struct {
	// Backends are the configured backends in configuration order (ties in
	// placement, ring order of slaves).
	Backends []controllink.Backend
	// Node is the backend beside this proxy (config `node`), "" in drop-in
	// mode.
	Node string
	// Locator is the configured queue_master_locator.
	Locator config.Locator
	Store   *store.Store
	// Writer writes the metadata; nil means Store. In a sidecar cluster it
	// forwards writes to the raft leader (cluster.go).
	Writer MetaWriter
	// Peers, set in a sidecar cluster, shares the work with the other
	// proxies (cluster.go); nil means this proxy does all of it.
	Peers    Peers
	Policies *config.PolicyStore
	// Watcher gives each backend's liveness and the proxy's own connection
	// to it; the engine reads its events.
	Watcher *controllink.Watcher
	Logger  *slog.Logger

	// Interval is how often the engine reconciles every queue, checks
	// masters that may have deleted themselves and the backlogs of manual
	// slaves. Default 1s.
	Interval time.Duration
	// NegativeCache is how long Resolve remembers that no backend has a
	// queue. Default 1s.
	NegativeCache time.Duration
	// OperationTimeout bounds one background operation on a backend
	// (declare, delete, passive declare). Default 10s.
	OperationTimeout time.Duration
	// Trimmer configures the trimmers of slave copies (Logger is set by
	// the engine).
	Trimmer controllink.TrimmerOptions
	// ResumeSettle is how long after a pause (SetPaused) the engine
	// leaves promotions to the other proxies. Default 5s.
	ResumeSettle time.Duration
}

// Engine is the replication engine. Create it with New, then Start it.
type Engine struct {
	opts     Options
	log      *slog.Logger
	backends []string
	roles    roles    // which work falls to this proxy (cluster.go)
	life     lifetime // ctx and the operation timeout, for the parts

	// The parts, each with its own state and lock (see "Parts").
	view        *snapshots     // snapshot.go
	records     *recorder      // records.go
	operator    *operator      // backend.go
	liveness    *liveness      // liveness.go
	trimmers    *trimmers      // trimmers.go
	syncs       *syncs         // sync.go
	reconciler  *reconciler    // reconcile.go
	deadLetters *deadLetters   // deadletters.go
	failover    *failover      // failover.go
	history     *history       // history.go
	drainer     *drainer       // drain.go
	listing     *listing       // status.go, unrecorded.go
	negative    *negativeCache // resolve.go
	replies     *replyNodes    // replyto.go
	metrics     *counters      // metrics.go
	stall       *stallGuard    // stall.go; nil for a proxy alone

	ctx    context.Context // ends at Close; background work runs under it
	cancel context.CancelFunc
	wake   chan struct{} // capacity one: liveness changed
	// logChanged (capacity one) says the metadata log changed: the
	// trimmers of this proxy's new slave copies start at once, since the
	// master's clients settle from the first message on, and a promotion
	// before the trimmer starts would drop the settles that wait for it
	// (early.go).
	logChanged chan struct{}
	wg         sync.WaitGroup

	startOnce sync.Once
	closeOnce sync.Once
}

// New returns an engine; nothing runs before Start.
func New(opts Options) *Engine {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Writer == nil {
		opts.Writer = opts.Store
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.NegativeCache <= 0 {
		opts.NegativeCache = time.Second
	}
	if opts.OperationTimeout <= 0 {
		opts.OperationTimeout = 10 * time.Second
	}
	if opts.ResumeSettle <= 0 {
		opts.ResumeSettle = 5 * time.Second
	}
	log := opts.Logger.With("component", "mirror-engine")
	opts.Trimmer.Logger = opts.Logger
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		opts:       opts,
		log:        log,
		roles:      newRoles(opts),
		life:       lifetime{ctx: ctx, timeout: opts.OperationTimeout},
		ctx:        ctx,
		cancel:     cancel,
		wake:       make(chan struct{}, 1),
		logChanged: make(chan struct{}, 1),
	}
	for _, b := range opts.Backends {
		e.backends = append(e.backends, b.Name)
	}
	e.metrics = &counters{}
	e.view = newSnapshots(opts.Store)
	e.negative = newNegativeCache(opts.NegativeCache)
	e.replies = &replyNodes{watcher: opts.Watcher, timeout: opts.OperationTimeout}
	e.records = &recorder{store: opts.Store, writer: opts.Writer, peers: opts.Peers, view: e.view, log: log, life: e.life}
	e.operator = &operator{watcher: opts.Watcher, backends: opts.Backends, store: opts.Store, log: log, timeout: opts.OperationTimeout}
	if e.roles.clustered {
		e.stall = newStallGuard(e.catchUp, opts.Store.InContact, log)
	}
	e.liveness = &liveness{watcher: opts.Watcher, backends: e.backends, resumeSettle: opts.ResumeSettle, stall: e.stall}
	e.trimmers = &trimmers{
		operator: e.operator, store: opts.Store, roles: e.roles, options: opts.Trimmer, logger: opts.Logger, log: log,
		lookup: e.view.lookup, byQueue: make(map[mirror.QueueID]*queueTrimmers), early: make(map[trimmerRef]*earlySettles),
	}
	e.syncs = &syncs{
		store: opts.Store, records: e.records, trimmers: e.trimmers, liveness: e.liveness, operator: e.operator,
		policies: opts.Policies, peers: opts.Peers, roles: e.roles, log: log, life: e.life, metrics: e.metrics,
		byQueue: make(map[mirror.QueueID]*queueSyncs), copyRuns: make(map[mirror.QueueID]mirror.CopyRuns),
	}
	e.reconciler = &reconciler{
		store: opts.Store, records: e.records, trimmers: e.trimmers, syncs: e.syncs, liveness: e.liveness,
		operator: e.operator, policies: opts.Policies, peers: opts.Peers, roles: e.roles, backends: e.backends,
		log: log, life: e.life,
	}
	// A trimmer that finds its copy missing hands it to the reconciler,
	// which holds the trimmers: set once both exist.
	e.trimmers.gone = e.reconciler.copyGone
	e.history = &history{node: opts.Node}
	e.failover = &failover{
		store: opts.Store, records: e.records, trimmers: e.trimmers, syncs: e.syncs, liveness: e.liveness,
		peers: opts.Peers, history: e.history, operator: e.operator, policies: opts.Policies, roles: e.roles, log: log,
		life: e.life, poke: e.poke, metrics: e.metrics, lost: make(map[string]map[mirror.QueueID]bool),
		outvoted: make(map[string]bool), rejoins: &rejoins{},
	}
	e.drainer = &drainer{
		store: opts.Store, records: e.records, liveness: e.liveness, trimmers: e.trimmers, syncs: e.syncs,
		operator: e.operator, policies: opts.Policies, log: log, metrics: e.metrics,
	}
	e.listing = &listing{
		store: opts.Store, policies: opts.Policies, watcher: opts.Watcher, operator: e.operator, syncs: e.syncs,
		peers: opts.Peers, backends: e.backends, log: log,
	}
	e.reconciler.held = e.listing.held
	e.deadLetters = &deadLetters{
		operator: e.operator, store: opts.Store, roles: e.roles, liveness: e.liveness, backends: e.backends,
		settle: e.Settle, rejoins: e.failover.rejoins, log: log, life: e.life,
		running: make(map[deadLetterSource]context.CancelFunc),
	}
	return e
}

// Start waits (until ctx ends) for the watcher's first verdict on every
// backend, so that the first placements see which are up, then starts
// keeping the slaves of every recorded queue in step and runs the
// background work until Close. Backends still unknown when ctx ends are
// treated as down until the watcher says otherwise.
func (e *Engine) Start(ctx context.Context) error {
	started := false
	e.startOnce.Do(func() { started = true })
	if !started {
		return errors.New("mirror engine: started twice")
	}
	e.liveness.awaitVerdicts(ctx)
	e.view.rebuild()
	changes, stopChanges := e.opts.Store.Changes()
	policies, stopPolicies := e.opts.Policies.Subscribe()
	if e.stall != nil {
		e.wg.Go(func() { e.stall.run(e.ctx) })
	}
	e.wg.Add(3)
	go func() {
		defer e.wg.Done()
		defer stopChanges()
		for {
			select {
			case <-e.ctx.Done():
				return
			case _, ok := <-changes:
				if !ok {
					return
				}
				e.view.rebuild()
				select {
				case e.logChanged <- struct{}{}:
				default:
				}
			}
		}
	}()
	go func() {
		defer e.wg.Done()
		for {
			select {
			case <-e.ctx.Done():
				return
			case ev := <-e.opts.Watcher.Events():
				e.failover.addEvent(ev)
			}
		}
	}()
	go func() {
		defer e.wg.Done()
		defer stopPolicies()
		e.run(policies)
	}()
	e.poke()
	return nil
}

// Close stops every goroutine, sync and trimmer of the engine. The slave
// copies keep every message not trimmed yet (a closed trimmer's channel
// requeues what it held). It is idempotent.
func (e *Engine) Close() {
	e.closeOnce.Do(func() {
		e.cancel()
		e.wg.Wait()
		e.syncs.close()
		e.deadLetters.close()
		e.trimmers.closeAll()
	})
}

// poke asks the background loop to look at every queue now.
func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// logChangeCoalesce is how long the loop waits after a change of the
// metadata log before it starts the trimmers of new slave copies, so that
// a storm of writes costs a look at every queue at most this often.
const logChangeCoalesce = 20 * time.Millisecond

// run is the background loop.
func (e *Engine) run(policies <-chan *config.Snapshot) {
	tick := time.NewTicker(e.opts.Interval)
	defer tick.Stop()
	var trimmersDue <-chan time.Time // set while a log change waits
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-policies:
			e.reconciler.all()
		case <-e.logChanged:
			if trimmersDue == nil {
				trimmersDue = time.After(logChangeCoalesce)
			}
		case <-trimmersDue:
			trimmersDue = nil
			e.reconciler.ensureTrimmers()
		case <-e.wake:
			for _, ev := range e.failover.takeEvents() {
				e.failover.handleEvent(ev)
			}
			e.reconciler.handleMissed()
			e.reconciler.ensureTrimmers()
			e.reconciler.all()
		case <-tick.C:
			e.failover.checkOwnCopies()
			e.failover.retryRejoins()
			e.reconciler.checkExpired()
			e.reconciler.ensureTrimmers()
			e.deadLetters.reconcile(e.opts.Store.List())
			e.reconciler.all()
			e.reconciler.checkBacklogs()
		}
	}
}

// definition returns the effective policy definition of a queue and the
// name of the user policy that applies ("" for none).
func definition(policies *config.PolicyStore, id mirror.QueueID) (config.Definition, string) {
	snap := policies.Snapshot()
	user := snap.Match(id.VHost, id.Name, config.KindQueue, false)
	def := config.Effective(user, snap.MatchOperator(id.VHost, id.Name, config.KindQueue, false))
	name := ""
	if user != nil {
		name = user.Name
	}
	return def, name
}

// lifetime is the engine's life as its parts see it: ctx ends at Close,
// and one background operation on a backend or the log is bounded by
// timeout (Options.OperationTimeout).
type lifetime struct {
	ctx     context.Context
	timeout time.Duration
}

// operation returns the context of one background operation.
func (l lifetime) operation() (context.Context, context.CancelFunc) {
	return context.WithTimeout(l.ctx, l.timeout)
}

// random is the random locator's source.
func random(n int) int { return rand.IntN(n) }
