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
// # Goroutines and locks
//
// Start runs three goroutines until Close: one rebuilds the Lookup
// snapshot on every Store change, one takes the Watcher's events (it must
// never stop reading them) and wakes the third, which owns the background
// work: backend losses and returns (promotion, rejoining copies),
// reconciling every queue with its policy, checking masters that may have
// deleted themselves, and backlogs of manual slaves. Syncs run in
// goroutines of their own, one per queue at most. Client goroutines call
// Place, Declared, Deleted, Purged, Bound and Settle concurrently with all
// of that; the Store's conditional writes settle races over metadata.
//
// Lock order: Engine.mu before a Trimmer's own lock (Settle is called under
// a read lock of mu) and the Store's; rebuildMu (the Lookup snapshot),
// negMu (Resolve's negative cache), evMu (backend events) and replies.mu
// (each backend's node for direct reply-to) are taken alone. Nothing does
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
	roles    roles // which work falls to this proxy (cluster.go)

	// view is what Lookup reads (snapshot.go).
	view *snapshots
	life lifetime
	// records changes records in the metadata log (records.go).
	records *recorder
	// trimmers are the trimmers of the slave copies (trimmers.go).
	trimmers *trimmers
	// reconciler does the loop's work on every queue (reconcile.go).
	reconciler *reconciler
	// syncs are the running syncs (sync.go).
	syncs *syncs
	// liveness is which backends count up and take copies (liveness.go).
	liveness *liveness
	// operator carries out the engine's own operations on backends
	// (backend.go).
	operator *operator

	// drainer carries out ctl drain (drain.go).
	drainer *drainer
	// listing answers list_queues (status.go).
	listing *listing

	negative *negativeCache // Resolve's (resolve.go)

	replies *replyNodes // each backend's Erlang node, for direct reply-to

	// failover carries out backend events (failover.go).
	failover *failover

	ctx    context.Context // ends at Close; background work runs under it
	cancel context.CancelFunc
	wake   chan struct{} // capacity one: liveness changed
	wg     sync.WaitGroup

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
	life := lifetime{ctx: ctx, timeout: opts.OperationTimeout}
	view := newSnapshots(opts.Store)
	e := &Engine{
		ctx:      ctx,
		cancel:   cancel,
		life:     life,
		records:  &recorder{store: opts.Store, writer: opts.Writer, peers: opts.Peers, view: view, log: log, life: life},
		opts:     opts,
		log:      log,
		roles:    newRoles(opts),
		negative: newNegativeCache(opts.NegativeCache),
		wake:     make(chan struct{}, 1),
		view:     view,
		operator: &operator{watcher: opts.Watcher, backends: opts.Backends, store: opts.Store, log: log, timeout: opts.OperationTimeout},
		replies:  &replyNodes{watcher: opts.Watcher, timeout: opts.OperationTimeout},
	}
	for _, b := range opts.Backends {
		e.backends = append(e.backends, b.Name)
	}
	e.liveness = &liveness{watcher: opts.Watcher, backends: e.backends, resumeSettle: opts.ResumeSettle}
	e.trimmers = &trimmers{
		operator: e.operator, store: opts.Store, roles: e.roles, options: opts.Trimmer, logger: opts.Logger, log: log,
		byQueue: make(map[mirror.QueueID]*queueTrimmers),
	}
	e.syncs = &syncs{
		store: opts.Store, records: e.records, trimmers: e.trimmers, liveness: e.liveness, operator: e.operator,
		policies: opts.Policies, peers: opts.Peers, roles: e.roles, log: log, life: life,
		byQueue: make(map[mirror.QueueID]*queueSyncs),
	}
	e.reconciler = &reconciler{
		store: opts.Store, records: e.records, trimmers: e.trimmers, syncs: e.syncs, liveness: e.liveness,
		operator: e.operator, policies: opts.Policies, peers: opts.Peers, roles: e.roles, backends: e.backends,
		log: log, life: life,
	}
	e.trimmers.gone = e.reconciler.copyGone
	e.drainer = &drainer{
		store: opts.Store, records: e.records, liveness: e.liveness, trimmers: e.trimmers, syncs: e.syncs,
		operator: e.operator, policies: opts.Policies, log: log,
	}
	e.listing = &listing{
		store: opts.Store, policies: opts.Policies, watcher: opts.Watcher, operator: e.operator, syncs: e.syncs,
		peers: opts.Peers, backends: e.backends, log: log,
	}
	e.failover = &failover{
		store: opts.Store, records: e.records, trimmers: e.trimmers, syncs: e.syncs, liveness: e.liveness,
		operator: e.operator, policies: opts.Policies, roles: e.roles, log: log, life: life, poke: e.poke,
		lost: make(map[string]map[mirror.QueueID]bool),
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

// run is the background loop.
func (e *Engine) run(policies <-chan *config.Snapshot) {
	tick := time.NewTicker(e.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-policies:
			e.reconciler.all()
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
