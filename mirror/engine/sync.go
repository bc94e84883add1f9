package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Synchronisation: copying the master's messages to unsynchronised slaves
// while the queue keeps serving.
//
// The source is a synchronised slave when there is one: its trimmer holds
// every message in queue order and no client consumes from it
// (controllink.Trimmer.CopyTo). A queue with no synchronised slave (the
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
	cancel  context.CancelFunc
	done    chan struct{}
	err     error // set before done closes
}

// SyncQueue starts synchronising the queue's unsynchronised live slaves
// (`ctl sync_queue`; ha-sync-mode automatic does it by itself) and returns:
// ctx bounds the request, not the sync, which goes on until it is done or
// CancelSyncQueue stops it. A sync already running goes on. Its outcome is
// logged, and list_queues shows its slaves synchronised when it is done.
func (e *Engine) SyncQueue(ctx context.Context, id mirror.QueueID) error {
	m, ok := e.opts.Store.Get(id)
	if !ok {
		return fmt.Errorf("%s: %w", id, mirror.ErrQueueNotFound)
	}
	live := e.live()
	var targets []string
	for _, s := range m.Slaves {
		if !s.Synchronised && live.Has(s.Backend) {
			targets = append(targets, s.Backend)
		}
	}
	def, _ := e.definition(id)
	e.startSync(id, targets, def, true)
	return nil
}

// CancelSyncQueue stops the sync of a queue, if one runs. The slaves it
// was copying to stay unsynchronised.
func (e *Engine) CancelSyncQueue(ctx context.Context, id mirror.QueueID) error {
	if _, ok := e.opts.Store.Get(id); !ok {
		return fmt.Errorf("%s: %w", id, mirror.ErrQueueNotFound)
	}
	e.mu.RLock()
	var run *syncRun
	if qs := e.queues[id]; qs != nil {
		run = qs.sync
	}
	e.mu.RUnlock()
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

// syncing returns the slaves a sync of the queue copies to now.
func (e *Engine) syncing(id mirror.QueueID) []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if qs := e.queues[id]; qs != nil && qs.sync != nil {
		return slices.Clone(qs.sync.targets)
	}
	return nil
}

// startSync starts a sync of targets unless one runs (then it returns the
// running one) or, for an automatic sync (requested false), one failed a
// moment ago. It returns nil when there is nothing to do.
func (e *Engine) startSync(id mirror.QueueID, targets []string, def config.Definition, requested bool) *syncRun {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx.Err() != nil {
		return nil
	}
	qs := e.stateLocked(id)
	if qs.sync != nil {
		return qs.sync
	}
	if len(targets) == 0 || !requested && time.Since(qs.syncFailed) < syncRetry {
		return nil
	}
	ctx, cancel := context.WithCancel(e.ctx)
	run := &syncRun{targets: slices.Clone(targets), cancel: cancel, done: make(chan struct{})}
	qs.sync = run
	e.syncWG.Add(1)
	go func() {
		defer e.syncWG.Done()
		defer cancel()
		run.err = e.runSync(ctx, id, run.targets, def)
		e.mu.Lock()
		if qs := e.queues[id]; qs != nil && qs.sync == run {
			qs.sync = nil
			if run.err != nil {
				qs.syncFailed = time.Now()
			}
		}
		e.mu.Unlock()
		close(run.done)
	}()
	return run
}

// runSync copies the queue to each target in turn and records each
// synchronised once its copy is complete.
func (e *Engine) runSync(ctx context.Context, id mirror.QueueID, targets []string, def config.Definition) error {
	batch := def.WithDefaults().SyncBatchSize
	if batch <= 0 {
		batch = config.DefaultSyncBatchSize
	}
	log := e.log.With("queue", id.Name, "vhost", id.VHost)
	for _, target := range targets {
		m, ok := e.opts.Store.Get(id)
		if !ok {
			return fmt.Errorf("%s: no longer recorded", id)
		}
		if i := m.SlaveIndex(target); i < 0 || m.Slaves[i].Synchronised {
			continue
		}
		started := time.Now()
		copied, source, err := e.copyTo(ctx, m, target, batch)
		if err != nil {
			log.Warn("sync failed", "slave", target, "source", source, "copied", copied, "err", err)
			return fmt.Errorf("synchronising the slave of %s on %s: %w", id, target, err)
		}
		if err := e.markSlave(id, target, true); err != nil {
			return fmt.Errorf("recording the slave of %s on %s synchronised: %w", id, target, err)
		}
		log.Info("slave synchronised", "slave", target, "source", source, "copied", copied, "took", time.Since(started))
	}
	return nil
}

// copyTo copies the queue's messages to the slave on target: from the
// oldest live synchronised slave's trimmer, or from the master when no
// slave is synchronised. It returns how many it copied and the source.
func (e *Engine) copyTo(ctx context.Context, m mirror.QueueMeta, target string, batch int) (int, string, error) {
	dst, _, err := e.conn(target)
	if err != nil {
		return 0, "", err
	}
	dstTrimmer := e.trimmer(m.ID, target)
	if dstTrimmer == nil {
		return 0, "", fmt.Errorf("the slave on %s has no trimmer yet", target)
	}
	// The copy may bring messages the master settles meanwhile, after the
	// slave trimmed their fan-out copies: the slave's trimmer remembers
	// what it trimmed until a while after the copy ends.
	dstTrimmer.t.ExpectCopies(true)
	defer func() {
		e.mu.Lock()
		dstTrimmer.copiesUntil = time.Now().Add(30 * time.Second)
		e.mu.Unlock()
	}()

	live := e.live()
	for _, s := range m.Slaves {
		if !s.Synchronised || !live.Has(s.Backend) {
			continue
		}
		if src := e.trimmer(m.ID, s.Backend); src != nil {
			n, err := src.t.CopyTo(ctx, dst, m.ID.Name, batch)
			return n, s.Backend, err
		}
	}
	src, _, err := e.conn(m.Master)
	if err != nil {
		return 0, m.Master, err
	}
	n, err := copyFromMaster(ctx, src, dst, m.ID.Name, batch)
	return n, m.Master, err
}

// copyFromMaster copies the ready messages of queue on src to queue on dst
// with a consumer that holds them until all are copied and confirmed, then
// gives them back (see the comment at the top of this file).
func copyFromMaster(ctx context.Context, src, dst *amqp.Connection, queue string, batch int) (int, error) {
	sch, err := src.Channel()
	if err != nil {
		return 0, fmt.Errorf("opening a channel on the master: %w", err)
	}
	// Closing the channel gives back everything the copy held.
	defer sch.Close()
	q, err := sch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("counting the master's messages: %w", err)
	}
	if q.Messages == 0 {
		return 0, nil
	}
	deliveries, err := sch.Consume(queue, "amqp-mirror-sync", false, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("consuming from the master: %w", err)
	}
	dch, err := dst.Channel()
	if err != nil {
		return 0, fmt.Errorf("opening a channel on the slave: %w", err)
	}
	defer dch.Close()
	if err := dch.Confirm(false); err != nil {
		return 0, fmt.Errorf("confirm mode on the slave: %w", err)
	}
	var pending []*amqp.DeferredConfirmation
	await := func() error {
		for _, c := range pending {
			ok, err := c.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("waiting for the slave's confirms: %w", err)
			}
			if !ok {
				return errors.New("the slave's broker nacked a copy")
			}
		}
		pending = pending[:0]
		return nil
	}
	// A message that expires or is taken meanwhile never comes: a pause in
	// the deliveries ends the copy too.
	idle := time.NewTimer(time.Second)
	defer idle.Stop()
	copied := 0
	for copied < q.Messages {
		select {
		case <-ctx.Done():
			return copied, ctx.Err()
		case <-idle.C:
			return copied, await()
		case d, ok := <-deliveries:
			if !ok {
				return copied, errors.New("the master closed the sync's channel")
			}
			idle.Reset(time.Second)
			c, err := dch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, publishing(d))
			if err != nil {
				return copied, fmt.Errorf("copying a message: %w", err)
			}
			pending = append(pending, c)
			copied++
			if len(pending) >= batch {
				if err := await(); err != nil {
					return copied, err
				}
			}
		}
	}
	return copied, await()
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
