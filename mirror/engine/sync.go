package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Synchronisation: copying the master's messages to unsynchronised slaves
// while the queue keeps serving.
//
// The source is a synchronised slave when there is one: its trimmer holds
// every message in queue order and no client consumes from it
// (controllink.Trimmer.CopyTo); in a sidecar cluster the proxy beside it
// makes the copy (synccopy.go). A queue with no synchronised slave (the
// master alone, as an adopted queue is) is copied from the master by a
// short-lived consumer of the proxy's own: it takes the messages the
// master holds ready, copies each to the slave, and when it has seen them
// all gives them back (its channel closes, so they return to their places
// in the queue) — with the redelivered flag set, as any requeue sets it.
// Meanwhile clients are served the messages behind them. Messages clients
// hold unacknowledged at the master are not ready, so that copy does not
// see them: if a client requeues one later, the slave lacks it.

// syncRetry is how long an automatic sync that failed waits before it is
// tried again.
const syncRetry = 5 * time.Second

// syncRun is one sync of a queue.
type syncRun struct {
	targets []string // the slaves it copies to
	// copied is how many messages it copied so far, as its progress
	// reports are made (every progressEvery) and when a copy ends.
	copied atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done closes
}

// SyncQueue starts synchronising the queue's unsynchronised live slaves
// (`ctl sync_queue`; ha-sync-mode automatic does it by itself) and returns:
// ctx bounds the request, not the sync, which goes on until it is done or
// CancelSyncQueue stops it. A sync already running goes on. Its outcome is
// logged, and list_queues shows its slaves synchronised when it is done.
func (e *Engine) SyncQueue(ctx context.Context, id mirror.QueueID) error {
	return e.syncs.request(ctx, id)
}

// syncs owns the syncs of the engine: the one running per queue, when the
// last automatic one failed, and the slaves a copy from the master left
// half done, behind a lock of its own, taken alone. It copies into the
// trimmers' copies and records slaves synchronised through recorder; in a
// cluster it hands requests on through Peers.
type syncs struct {
	store    *store.Store
	records  *recorder
	trimmers *trimmers
	liveness *liveness
	operator *operator
	policies *config.PolicyStore
	peers    Peers // nil for one proxy alone
	roles    roles
	log      *slog.Logger
	life     lifetime
	metrics  *counters
	wg       sync.WaitGroup // the sync goroutines

	// forPeers are the copies of this node's slave copies this proxy runs
	// for other proxies' syncs (synccopy.go).
	forPeers copiesForPeers

	mu      sync.RWMutex
	byQueue map[mirror.QueueID]*queueSyncs
	// copyRuns counts the copies from each queue's master that this
	// proxy began and ended (mirror.Held). It outlives byQueue's entries
	// while a copy runs: a count that went back to zero mid-copy would
	// show the copy running for ever.
	copyRuns map[mirror.QueueID]mirror.CopyRuns
}

// queueSyncs is the sync state of one queue.
type queueSyncs struct {
	run *syncRun // the sync running now, nil when none
	// failed is when the last automatic sync failed, so that it is not
	// retried at every tick.
	failed time.Time
	// partial are the slaves a copy from the master left half done.
	partial map[string]bool
}

// entryLocked returns the queue's entry, created when missing; call with
// mu held for writing.
func (s *syncs) entryLocked(id mirror.QueueID) *queueSyncs {
	q := s.byQueue[id]
	if q == nil {
		q = &queueSyncs{}
		s.byQueue[id] = q
	}
	return q
}

// request is Engine.SyncQueue.
func (s *syncs) request(ctx context.Context, id mirror.QueueID) error {
	m, ok := s.store.Get(id)
	if !ok {
		return fmt.Errorf("%s: %w", id, mirror.ErrQueueNotFound)
	}
	live := s.liveness.live()
	var targets []string
	for _, slave := range m.Slaves {
		if !slave.Synchronised && live.Has(slave.Backend) {
			targets = append(targets, slave.Backend)
		}
	}
	def, _ := definition(s.policies, id)
	if s.roles.clustered {
		return s.inCluster(ctx, id, targets)
	}
	s.start(id, targets, def, true)
	return nil
}

// CancelSyncQueue stops the sync of a queue, if one runs. The slaves it
// was copying to stay unsynchronised.
func (e *Engine) CancelSyncQueue(ctx context.Context, id mirror.QueueID) error {
	if _, ok := e.opts.Store.Get(id); !ok {
		return fmt.Errorf("%s: %w", id, mirror.ErrQueueNotFound)
	}
	return e.syncs.cancel(ctx, id)
}

// cancel stops the queue's sync, if one runs, and waits for it until ctx
// ends.
func (s *syncs) cancel(ctx context.Context, id mirror.QueueID) error {
	run := s.running(id)
	if run == nil {
		return nil
	}
	run.cancel()
	select {
	case <-run.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cancelTo stops a sync of the queue that copies to backend (lost, or
// back and purged), and waits until it has stopped.
func (s *syncs) cancelTo(id mirror.QueueID, backend string) {
	if run := s.running(id); run != nil && slices.Contains(run.targets, backend) {
		run.cancel()
		<-run.done
	}
}

// stop stops the queue's sync, if one runs, and waits for it.
func (s *syncs) stop(id mirror.QueueID) {
	if run := s.running(id); run != nil {
		run.cancel()
		<-run.done
	}
}

// running returns the queue's sync running now, nil when none.
func (s *syncs) running(id mirror.QueueID) *syncRun {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if q := s.byQueue[id]; q != nil {
		return q.run
	}
	return nil
}

// targets returns the slaves a sync of the queue copies to now, and how
// many messages it copied so far.
func (s *syncs) targets(id mirror.QueueID) ([]string, int) {
	if run := s.running(id); run != nil {
		return slices.Clone(run.targets), int(run.copied.Load())
	}
	return nil, 0
}

// copiedSoFar records a running sync's progress: copied messages since
// the sync started, base from copies before this one.
func (s *syncs) copiedSoFar(id mirror.QueueID, base, copied int) {
	if run := s.running(id); run != nil {
		run.copied.Store(int64(base + copied))
	}
}

// forget forgets the queue and returns its running sync, nil when none,
// for the caller to stop.
func (s *syncs) forget(id mirror.QueueID) *syncRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.byQueue[id]
	delete(s.byQueue, id)
	if !s.copyRuns[id].Running() {
		delete(s.copyRuns, id)
	}
	if q == nil {
		return nil
	}
	return q.run
}

// heldByCopies returns, per queue of vhost ("" for every vhost), the copies
// from its master this proxy began and ended, as Held.
func (s *syncs) heldByCopies(vhost string) map[mirror.QueueID]mirror.Held {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[mirror.QueueID]mirror.Held)
	for id, runs := range s.copyRuns {
		if vhost == "" || id.VHost == vhost {
			out[id] = mirror.Held{Copies: runs}
		}
	}
	return out
}

// copyBegins counts a copy from the master of id beginning; the function
// it returns counts it ending, once the master has its messages back.
func (s *syncs) copyBegins(id mirror.QueueID) (ended func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	runs := s.copyRuns[id]
	runs.Began++
	s.copyRuns[id] = runs
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		runs := s.copyRuns[id]
		runs.Ended++
		s.copyRuns[id] = runs
	}
}

// idle returns the queues that have sync state but no sync running and
// are not in recorded.
func (s *syncs) idle(recorded map[mirror.QueueID]mirror.QueueMeta) []mirror.QueueID {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []mirror.QueueID
	for id, q := range s.byQueue {
		if _, ok := recorded[id]; !ok && q.run == nil {
			out = append(out, id)
		}
	}
	return out
}

// close waits for the syncs to end (the engine's lifetime ended) and
// forgets every queue.
func (s *syncs) close() {
	s.wg.Wait()
	s.mu.Lock()
	s.byQueue = make(map[mirror.QueueID]*queueSyncs)
	s.copyRuns = make(map[mirror.QueueID]mirror.CopyRuns)
	s.mu.Unlock()
}

// start starts a sync of targets unless one runs (then it returns the
// running one) or, for an automatic sync (requested false), one failed a
// moment ago. It returns nil when there is nothing to do.
func (s *syncs) start(id mirror.QueueID, targets []string, def config.Definition, requested bool) *syncRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.life.ctx.Err() != nil {
		return nil
	}
	q := s.entryLocked(id)
	if q.run != nil {
		return q.run
	}
	if len(targets) == 0 || !requested && time.Since(q.failed) < syncRetry {
		return nil
	}
	ctx, cancel := context.WithCancel(s.life.ctx)
	run := &syncRun{targets: slices.Clone(targets), cancel: cancel, done: make(chan struct{})}
	q.run = run
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cancel()
		run.err = s.run(ctx, id, run.targets, def)
		s.mu.Lock()
		if q := s.byQueue[id]; q != nil && q.run == run {
			q.run = nil
			if run.err != nil {
				q.failed = time.Now()
			}
		}
		s.mu.Unlock()
		close(run.done)
	}()
	return run
}

// inCluster carries out a requested sync (ctl sync_queue) of the
// targets in a cluster: the proxy beside the first live one syncs it
// (SyncLocal, here or there), and hands the request on to the next when
// it is done, so that the slaves are synchronised one after another.
func (s *syncs) inCluster(ctx context.Context, id mirror.QueueID, targets []string) error {
	live := s.liveness.live()
	for _, t := range targets {
		if !live.Has(t) {
			continue
		}
		if t == s.roles.node {
			return s.local(ctx, id)
		}
		if err := s.peers.SyncSlave(ctx, t, id); err != nil {
			return fmt.Errorf("synchronising the slave of %s on %s: %w", id, t, err)
		}
		return nil
	}
	return nil
}

// local is Member.SyncLocal.
func (s *syncs) local(ctx context.Context, id mirror.QueueID) error {
	// This proxy's copy of the log may not have the slave yet when the
	// asking proxy's has: it was just added. Wait a little for it.
	var m mirror.QueueMeta
	for wait := time.Now().Add(5 * time.Second); ; {
		var ok bool
		m, ok = s.store.Get(id)
		if ok && m.SlaveIndex(s.roles.node) >= 0 {
			break
		}
		if time.Now().After(wait) {
			if !ok {
				return fmt.Errorf("%s: %w", id, mirror.ErrQueueNotFound)
			}
			return fmt.Errorf("%s has no slave on %s", id, s.roles.node)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if m.Slaves[m.SlaveIndex(s.roles.node)].Synchronised {
		return nil
	}
	// The request may come before the loop started the slave's trimmer
	// (the slave was just added), and a sync copies into it.
	s.trimmers.ensure(m, s.roles.node)
	def, _ := definition(s.policies, id)
	run := s.start(id, []string{s.roles.node}, def, true)
	if run == nil {
		return nil
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-run.done:
		case <-s.life.ctx.Done():
			return
		}
		if run.err != nil {
			return
		}
		m, ok := s.store.Get(id)
		if !ok {
			return
		}
		var rest []string
		for _, slave := range m.Slaves {
			if !slave.Synchronised && slave.Backend != s.roles.node {
				rest = append(rest, slave.Backend)
			}
		}
		ctx, cancel := s.life.operation()
		defer cancel()
		if err := s.inCluster(ctx, id, rest); err != nil {
			s.log.Warn("cannot hand a requested sync on to the next slave", "queue", id.Name, "vhost", id.VHost, "err", err)
		}
	}()
	return nil
}

// run synchronises the targets and records each synchronised once
// its copy is complete. With a synchronised slave to copy from, targets are
// copied one after another from its trimmer; without one, all at once from
// the master, so that the master's messages are held (and given back,
// redelivered) only once.
func (s *syncs) run(ctx context.Context, id mirror.QueueID, targets []string, def config.Definition) error {
	batch := def.WithDefaults().SyncBatchSize
	if batch <= 0 {
		batch = config.DefaultSyncBatchSize
	}
	log := s.log.With("queue", id.Name, "vhost", id.VHost)
	copiedBefore := 0 // by the copies from a slave before this one
	for {
		m, ok := s.store.Get(id)
		if !ok {
			return fmt.Errorf("%s: no longer recorded", id)
		}
		var pending []string
		for _, t := range targets {
			if i := m.SlaveIndex(t); i >= 0 && !m.Slaves[i].Synchronised {
				pending = append(pending, t)
			}
		}
		if len(pending) == 0 {
			return nil
		}
		target := pending[0]
		started := time.Now()
		source := s.source(m)
		var copied int
		var err error
		if source != "" {
			copied, err = s.copyFromSlave(ctx, m, source, target, batch)
		} else {
			// From a synchronised slave beside another proxy (synccopy.go).
			copied, source, err = s.copyFromPeer(ctx, m, target, batch)
		}
		if errors.Is(err, errNoPeerSource) {
			return s.syncFromMaster(ctx, log, m, pending, batch)
		}
		s.metrics.synced(copied)
		copiedBefore += copied
		s.copiedSoFar(id, copiedBefore, 0)
		if err == nil {
			err = s.reachedByEveryProxy(ctx, target, copyQuestionTimeout)
		}
		if err != nil {
			s.markPartial(id, []string{target})
			log.Warn("sync failed", "slave", target, "source", source, "copied", copied, "err", err)
			return fmt.Errorf("synchronising the slave of %s on %s: %w", id, target, err)
		}
		if err := s.records.markSlave(id, target, true); err != nil {
			return fmt.Errorf("recording the slave of %s on %s synchronised: %w", id, target, err)
		}
		log.Info("slave synchronised", "slave", target, "source", source, "copied", copied, "took", time.Since(started))
	}
}

// syncFromMaster copies the master to every target at once, for a queue with
// no synchronised slave, and records them synchronised.
func (s *syncs) syncFromMaster(ctx context.Context, log *slog.Logger, m mirror.QueueMeta, targets []string, batch int) error {
	id := m.ID
	started := time.Now()
	if err := s.purgePartial(ctx, id, targets); err != nil {
		return fmt.Errorf("synchronising the slaves of %s on %v: %w", id, targets, err)
	}
	copied, err := s.copyFromMaster(ctx, m, targets, batch)
	for _, t := range targets {
		if err == nil {
			err = s.reachedByEveryProxy(ctx, t, copyQuestionTimeout)
		}
	}
	if err != nil {
		s.markPartial(id, targets)
		log.Warn("sync failed", "slaves", targets, "source", m.Master, "copied", copied.copied, "read", copied.read, "err", err)
		return fmt.Errorf("synchronising the slaves of %s on %v: %w", id, targets, err)
	}
	for _, t := range targets {
		if err := s.records.markSlave(id, t, true); err != nil {
			return fmt.Errorf("recording the slave of %s on %s synchronised: %w", id, t, err)
		}
	}
	log.Info("slaves synchronised", "slaves", targets, "source", m.Master, "copied", copied.copied, "read", copied.read, "took", time.Since(started))
	return nil
}

// markPartial remembers that a copy from the master into targets ended
// half way: what it copied is on them, and the next copy from the master
// could take one of those for a message that reached them by fan-out and
// stop early (and would copy messages without identity a second time).
func (s *syncs) markPartial(id mirror.QueueID, targets []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.entryLocked(id)
	if q.partial == nil {
		q.partial = make(map[string]bool)
	}
	for _, t := range targets {
		q.partial[t] = true
	}
}

// purgePartial empties the targets a copy from the master left half done,
// through their trimmers, before the next copy.
func (s *syncs) purgePartial(ctx context.Context, id mirror.QueueID, targets []string) error {
	for _, t := range targets {
		s.mu.RLock()
		partial := s.byQueue[id] != nil && s.byQueue[id].partial[t]
		s.mu.RUnlock()
		if !partial {
			continue
		}
		tr := s.trimmers.get(id, t)
		if tr == nil {
			return fmt.Errorf("the slave on %s has no trimmer yet", t)
		}
		if _, err := tr.t.Purge(ctx); err != nil {
			return err
		}
		s.mu.Lock()
		if q := s.byQueue[id]; q != nil {
			delete(q.partial, t)
		}
		s.mu.Unlock()
	}
	return nil
}

// source returns the oldest live synchronised slave that has a
// trimmer to copy from, "" when there is none.
func (s *syncs) source(m mirror.QueueMeta) string {
	live := s.liveness.live()
	for _, slave := range m.Slaves {
		if slave.Synchronised && live.Has(slave.Backend) && s.trimmers.get(m.ID, slave.Backend) != nil {
			return slave.Backend
		}
	}
	return ""
}

// copyFromSlave copies the queue from the synchronised slave on source to
// the slave on target (controllink.Trimmer.CopyTo).
func (s *syncs) copyFromSlave(ctx context.Context, m mirror.QueueMeta, source, target string, batch int) (int, error) {
	dst, err := s.operator.dial(target, m.ID.VHost)
	if err != nil {
		return 0, err
	}
	defer dst.Close()
	src := s.trimmers.get(m.ID, source)
	if src == nil {
		return 0, fmt.Errorf("the slave on %s has no trimmer", source)
	}
	done, err := s.trimmers.expectCopies(m.ID, []string{target})
	if err != nil {
		return 0, err
	}
	defer done()
	return src.t.CopyTo(ctx, dst, m.ID.Name, batch)
}

// copyFromMaster copies the master's ready messages to the slaves on
// targets with a consumer that holds them until all are copied and
// confirmed, then gives them back (see the comment at the top of this
// file). It holds the messages in memory meanwhile: the master's ready
// count at the start, at most.
func (s *syncs) copyFromMaster(ctx context.Context, m mirror.QueueMeta, targets []string, batch int) (copyCount, error) {
	// Counted from before the copy takes anything until the master has it
	// all back, for the backlog checks of every proxy (reconciler).
	defer s.copyBegins(m.ID)()
	src, err := s.operator.dial(m.Master, m.ID.VHost)
	if err != nil {
		return copyCount{}, err
	}
	defer src.Close()
	var dsts []*amqp.Connection
	for _, t := range targets {
		c, err := s.operator.dial(t, m.ID.VHost)
		if err != nil {
			return copyCount{}, err
		}
		defer c.Close()
		dsts = append(dsts, c)
	}
	done, err := s.trimmers.expectCopies(m.ID, targets)
	if err != nil {
		return copyCount{}, err
	}
	defer done()
	// A message a target's trimmer holds already need not be copied there:
	// it came by fan-out (or, after a partition, as a publish a proxy had
	// sent before the cut, which is why it cannot end the copy: see
	// copyFromMaster).
	trimmers := make([]*controllink.Trimmer, len(targets))
	for i, t := range targets {
		if tr := s.trimmers.get(m.ID, t); tr != nil {
			trimmers[i] = tr.t
		}
	}
	holds := func(d amqp.Delivery, target int) bool {
		value, _ := d.Headers[mirror.IdentityHeader].(string)
		id, ok := mirror.ParseMessageID(value)
		return ok && trimmers[target] != nil && trimmers[target].Holds(id)
	}
	// The metrics count the copy as it goes: a long sync shows its pace.
	counted := 0
	count := func(c copyCount) {
		s.metrics.synced(c.copied - counted)
		counted = c.copied
	}
	progress := func(c copyCount, started time.Time, waits copyWaits) {
		count(c)
		s.copiedSoFar(m.ID, 0, c.copied)
		s.log.Info("sync in progress", "queue", m.ID.Name, "vhost", m.ID.VHost, "slaves", targets,
			"copied", c.copied, "read", c.read, "elapsed", time.Since(started).Round(time.Millisecond),
			"waited_for_deliveries", waits.deliveries.Round(time.Millisecond), "waited_for_confirms", waits.confirms.Round(time.Millisecond))
	}
	// A consumer's cancel deletes an auto-delete queue that has no other
	// consumer, and an adopted queue may be one: those are read with
	// basic.get, which is no consumer (and slower: a round trip each).
	byGet := m.AutoDelete || m.Adopted
	c, err := copyFromMaster(ctx, src, dsts, m.ID.Name, batch, byGet, holds, progress)
	count(c)
	return c, err
}

// copyFromMaster is the copy itself, on the master's connection src to the
// same queue on each of dsts: every message it reads is copied to the
// targets that do not hold it already (holds). It ends when it has read as
// many messages as the master held ready at the start, or when the master
// has nothing ready left (clients consuming meanwhile took the rest).
//
// It reads the master up to that count even when the targets hold what it
// meets: a message a target holds is no proof that everything before it in
// the master's queue reached the copy. After a partition heals, TCP
// delivers to a rejoined copy, purged meanwhile, what a proxy's link had
// sent it before the cut; those messages sit anywhere in the master's
// backlog, and a copy that ended at the first of them, taking it for the
// first message that reached the new slave by fan-out, would record a
// slave synchronised that lacks the rest of the backlog. What
// reading on costs: the messages published between the join and the
// copy's start are held by the copy too, and given back redelivered.
func copyFromMaster(ctx context.Context, src *amqp.Connection, dsts []*amqp.Connection, queue string, batch int, byGet bool, holds func(d amqp.Delivery, target int) bool, progress func(c copyCount, started time.Time, waits copyWaits)) (copyCount, error) {
	started := time.Now()
	var waits copyWaits
	var count copyCount
	lastProgress := started
	sch, err := src.Channel()
	if err != nil {
		return count, fmt.Errorf("opening a channel on the master: %w", err)
	}
	// Closing the channel gives back everything the copy held.
	defer sch.Close()
	q, err := sch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		return count, fmt.Errorf("counting the master's messages: %w", err)
	}
	if q.Messages == 0 {
		return count, nil
	}
	deliveries, stop, err := readMaster(sch, queue, byGet)
	if err != nil {
		return count, err
	}
	var lastTag uint64 // the last delivery the copy read
	defer func() { giveBack(sch, deliveries, stop, queue, lastTag) }()
	outs, closeOuts, err := openConfirmWindows(dsts, batch)
	defer closeOuts()
	if err != nil {
		return count, err
	}
	// With no newer publishes, a backlog that clients took part of (or
	// that expired in part) never makes up the count. So when no delivery
	// has come for a second while the copy waited for one, the master is
	// asked whether it has anything ready left. Nothing ready means every
	// message was delivered to someone, and what was delivered to this
	// consumer came before that answer on the channel, so it is in the
	// client library's hands: the copy takes what still comes within a
	// short wait and ends. A pause alone proves nothing (a loaded broker
	// can stop delivering for seconds), and the wait is measured from when
	// the copy is ready for the next delivery, never across its own work.
	const pause, settle = time.Second, time.Second
	idle := time.NewTimer(pause)
	defer idle.Stop()
	draining := false // the master had nothing ready left
	finish := func() (copyCount, error) {
		for _, o := range outs {
			if err := o.drain(ctx, 0); err != nil {
				return count, err
			}
		}
		return count, nil
	}
	for count.read < q.Messages {
		waitStart := time.Now()
		select {
		case <-ctx.Done():
			return count, ctx.Err()
		case <-idle.C:
			if draining {
				return finish()
			}
			left, err := sch.QueueDeclarePassive(queue, false, false, false, false, nil)
			if err != nil {
				return count, fmt.Errorf("counting the master's messages: %w", err)
			}
			if left.Messages == 0 {
				draining = true
				idle.Reset(settle)
			} else {
				idle.Reset(pause)
			}
		case d, ok := <-deliveries:
			if !ok {
				return count, errors.New("the master closed the sync's channel")
			}
			lastTag = d.DeliveryTag
			waits.deliveries += time.Since(waitStart)
			count.read++
			publishStart := time.Now()
			copiedOne, err := copyOne(ctx, d, outs, queue, holds)
			if err != nil {
				return count, err
			}
			waits.confirms += time.Since(publishStart)
			if copiedOne {
				count.copied++
			}
			if time.Since(lastProgress) >= progressEvery {
				lastProgress = time.Now()
				progress(count, started, waits) // how fast a long sync goes, and what it waits for
			}
			if draining {
				idle.Reset(settle)
			} else {
				idle.Reset(pause)
			}
		}
	}
	return finish()
}

// readMaster starts reading queue on the master's channel ch for a copy:
// with a consumer, or with basic.get when byGet (see getLoop). stop ends
// the reading; deliveries is closed once it ended.
func readMaster(ch *amqp.Channel, queue string, byGet bool) (deliveries <-chan amqp.Delivery, stop func() error, err error) {
	if byGet {
		deliveries, stop = getLoop(ch, queue)
		return deliveries, stop, nil
	}
	deliveries, err = ch.Consume(queue, syncConsumerTag, false, false, false, false, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("consuming from the master: %w", err)
	}
	return deliveries, func() error { return ch.Cancel(syncConsumerTag, false) }, nil
}

// openConfirmWindows opens a channel in confirm mode on each of dsts. The
// returned function closes the channels opened, also after an error.
func openConfirmWindows(dsts []*amqp.Connection, batch int) ([]*confirmWindow, func(), error) {
	outs := make([]*confirmWindow, 0, len(dsts))
	closeAll := func() {
		for i := len(outs) - 1; i >= 0; i-- {
			outs[i].ch.Close()
		}
	}
	for _, dst := range dsts {
		ch, err := dst.Channel()
		if err != nil {
			return nil, closeAll, fmt.Errorf("opening a channel on a slave: %w", err)
		}
		outs = append(outs, &confirmWindow{ch: ch, batch: batch})
		if err := ch.Confirm(false); err != nil {
			return nil, closeAll, fmt.Errorf("confirm mode on a slave: %w", err)
		}
	}
	return outs, closeAll, nil
}

// copyOne copies d to the targets that do not hold it already (holds), and
// reports whether it copied it to any.
func copyOne(ctx context.Context, d amqp.Delivery, outs []*confirmWindow, queue string, holds func(d amqp.Delivery, target int) bool) (bool, error) {
	msg, copied := publishing(d), false
	for i, o := range outs {
		if holds(d, i) {
			continue
		}
		if err := o.publish(ctx, queue, msg); err != nil {
			return copied, err
		}
		copied = true
	}
	return copied, nil
}

// syncConsumerTag names a sync's consumer on the master.
const syncConsumerTag = "amqp-mirror-sync"

// giveBackChunk is how many messages a sync from the master gives back to
// the master's queue at once.
const giveBackChunk = 2000

// giveBack returns what a copy from the master holds to the master's queue
// (to their places, redelivered) in chunks of giveBackChunk, each followed
// by a passive declare that the queue answers once it has requeued the
// chunk, so that the clients' publishes and acks reaching the queue
// meanwhile are served between chunks. Closing the channel alone gives back
// everything at once: 46 000 messages kept the master's queue busy (and
// every client waiting) for about 10 s on the loaded test machine. Any
// failure leaves the rest to the channel's close.
func giveBack(ch *amqp.Channel, deliveries <-chan amqp.Delivery, stop func() error, queue string, lastTag uint64) {
	defer ch.Close()
	if stop() != nil {
		return
	}
	// What the broker had sent before the cancel is held too.
	for d := range deliveries {
		lastTag = d.DeliveryTag
	}
	for tag := min(giveBackChunk, lastTag); tag > 0; tag = min(tag+giveBackChunk, lastTag) {
		if ch.Nack(tag, true, true) != nil {
			return
		}
		if _, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil); err != nil {
			return
		}
		if tag == lastTag {
			return
		}
	}
}

// getLoop reads queue on ch with basic.get (no-ack off: what it reads is
// held on ch like a consumer's deliveries) and passes each message on, for
// a copy from a master that must have no consumer of the proxy's. An empty
// queue is asked again every getPoll. stop ends the loop; deliveries is
// closed once it ended (and at once when a get fails).
func getLoop(ch *amqp.Channel, queue string) (deliveries <-chan amqp.Delivery, stop func() error) {
	out := make(chan amqp.Delivery)
	done := make(chan struct{})
	go func() {
		defer close(out)
		for {
			d, ok, err := ch.Get(queue, false)
			if err != nil {
				return
			}
			if !ok {
				select {
				case <-done:
					return
				case <-time.After(getPoll):
				}
				continue
			}
			select {
			case out <- d:
			case <-done:
				// Held on ch all the same: the give-back returns it.
				out <- d
				return
			}
		}
	}()
	var once sync.Once
	return out, func() error {
		once.Do(func() { close(done) })
		return nil
	}
}

// getPoll is how often getLoop asks an empty queue again.
const getPoll = 20 * time.Millisecond

// progressEvery is how often a sync logs its progress.
const progressEvery = 5 * time.Second

// copyCount is what a copy from the master did: messages read from the
// master, and those of them copied to at least one target (the others
// were there already).
type copyCount struct{ read, copied int }

// copyWaits is how long a copy has waited, in all, for deliveries from its
// source and for its publishes and confirms to the destinations.
type copyWaits struct{ deliveries, confirms time.Duration }

// confirmWindow publishes copies to one slave with confirms, keeping up
// to two batches unconfirmed: it waits for the older batch while the next
// one is sent, so the copy does not stop at every batch for a round trip.
type confirmWindow struct {
	ch      *amqp.Channel
	batch   int
	pending []*amqp.DeferredConfirmation
}

func (w *confirmWindow) publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	c, err := w.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, msg)
	if err != nil {
		return fmt.Errorf("copying a message: %w", err)
	}
	w.pending = append(w.pending, c)
	if len(w.pending) >= 2*w.batch {
		return w.drain(ctx, w.batch)
	}
	return nil
}

// drain waits until at most keep copies are unconfirmed.
func (w *confirmWindow) drain(ctx context.Context, keep int) error {
	n := len(w.pending) - keep
	if n <= 0 {
		return nil
	}
	for _, c := range w.pending[:n] {
		ok, err := c.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("waiting for a slave's confirms: %w", err)
		}
		if !ok {
			return errors.New("a slave's broker nacked a copy")
		}
	}
	w.pending = append(w.pending[:0], w.pending[n:]...)
	return nil
}

// publishing is a delivery as it was published.
func publishing(d amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{
		Headers:         d.Headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          d.UserId,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
