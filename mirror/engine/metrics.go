package engine

import (
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Metrics is where the engine registers its metrics; admin.Registry
// implements it. Everything but the promotion histogram is read at scrape
// time from the metadata (the Store's in-memory copy of the log) and the
// parts' state, never from a broker.
type Metrics interface {
	Counter(name, help string, value func() float64)
	Histogram(name, help string, buckets []float64) (observe func(float64))
	GaugeFamily(name, help string, labels []string, collect func(emit func(value float64, labelValues ...string)))
	CounterFamily(name, help string, labels []string, collect func(emit func(value float64, labelValues ...string)))
}

// Queue states of amqp_mirror_queues. Each recorded queue is in exactly
// one, the first that holds:
//
//	unmirrored      no slave: the master alone
//	syncing         a sync this proxy runs copies to its slaves
//	unsynchronised  slaves, none synchronised: its master's loss loses
//	                the messages only the master holds
//	mirrored        at least one synchronised slave
const (
	stateUnmirrored = iota
	stateSyncing
	stateUnsynchronised
	stateMirrored
	queueStates
)

var queueStateNames = [queueStates]string{"unmirrored", "syncing", "unsynchronised", "mirrored"}

// Promotion causes of amqp_mirror_promotions_total: mirror.Cause's, and a
// drain's (ctl drain, which promotes as a clean shutdown would).
const (
	causeFailure  = int(mirror.CauseFailure)
	causeShutdown = int(mirror.CauseShutdown)
	causeDrain    = iota
	promotionCauses
)

var promotionCauseNames = [promotionCauses]string{"failure", "shutdown", "drain"}

// PromotionBuckets are the upper bounds, in seconds, of the promotion
// duration histogram: from a loss seen at once (a connection reset) to one
// retried while a cluster elects a leader.
var PromotionBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// counters are what the parts count for the metrics; the parts that count
// hold a pointer to it. Every field is atomic: no lock, no order.
type counters struct {
	promotions               [promotionCauses]atomic.Uint64
	promotionsUnsynchronised atomic.Uint64
	// promotionSeconds observes a promotion's duration, nil until the
	// metrics are registered.
	promotionSeconds atomic.Pointer[func(seconds float64)]
	syncedMessages   atomic.Uint64
}

// promoted counts a promotion this proxy wrote for cause, and with the
// moment its master's loss was detected (zero for none: a drain) observes
// how long detecting it took to become a promotion in the log.
func (c *counters) promoted(cause int, synchronised bool, detected time.Time) {
	c.promotions[cause].Add(1)
	if !synchronised {
		c.promotionsUnsynchronised.Add(1)
	}
	if observe := c.promotionSeconds.Load(); observe != nil && !detected.IsZero() {
		(*observe)(time.Since(detected).Seconds())
	}
}

// synced counts messages a sync copied to slaves.
func (c *counters) synced(messages int) {
	if messages > 0 {
		c.syncedMessages.Add(uint64(messages))
	}
}

// RegisterMetrics exposes the engine's metrics. With perQueue, it adds
// series per queue (labels vhost and queue): as many as there are
// queues, which is why they are opt-in.
func (e *Engine) RegisterMetrics(m Metrics, perQueue bool) {
	m.GaugeFamily("amqp_mirror_queues",
		"Queues the metadata log records, by state: unmirrored (master alone), syncing (a sync this proxy runs), unsynchronised (slaves, none synchronised), mirrored (a synchronised slave).",
		[]string{"state"}, func(emit func(float64, ...string)) {
			var counts [queueStates]int
			for _, q := range e.opts.Store.List() {
				counts[queueState(e.syncs, q)]++
			}
			for state, n := range counts {
				emit(float64(n), queueStateNames[state])
			}
		})
	m.CounterFamily("amqp_mirror_promotions_total",
		"Slaves this proxy promoted to master, by cause: failure (the master's backend failed), shutdown (it stopped cleanly), drain (ctl drain).",
		[]string{"cause"}, func(emit func(float64, ...string)) {
			for cause := range e.metrics.promotions {
				emit(float64(e.metrics.promotions[cause].Load()), promotionCauseNames[cause])
			}
		})
	m.Counter("amqp_mirror_promotions_unsynchronised_total",
		"Promotions of a slave that was not synchronised (ha-promote-on-*: always): the messages only the old master held are lost.",
		func() float64 { return float64(e.metrics.promotionsUnsynchronised.Load()) })
	observe := m.Histogram("amqp_mirror_promotion_duration_seconds",
		"Time from detecting the loss of a queue's master (connection reset, clean shutdown, or failover_grace without an answer) to its promotion written in the metadata log.",
		PromotionBuckets)
	e.metrics.promotionSeconds.Store(&observe)
	m.Counter("amqp_mirror_sync_messages_total",
		"Messages syncs run by this proxy copied to slaves (counted as a copy from the master goes, and when a copy from a synchronised slave ends).",
		func() float64 { return float64(e.metrics.syncedMessages.Load()) })
	if perQueue {
		registerQueueMetrics(m, e.opts.Store, e.syncs, e.trimmers)
	}
}

// queueState is the state of q for amqp_mirror_queues.
func queueState(syncs *syncs, q mirror.QueueMeta) int {
	switch {
	case len(q.Slaves) == 0:
		return stateUnmirrored
	case syncs.running(q.ID) != nil:
		return stateSyncing
	case len(q.SynchronisedSlaves()) == 0:
		return stateUnsynchronised
	}
	return stateMirrored
}

// registerQueueMetrics exposes a series per queue of the metadata and, for
// the slave messages, per backend whose slave copy this proxy trims.
func registerQueueMetrics(m Metrics, metadata *store.Store, syncs *syncs, trimmers *trimmers) {
	perQueue := func(value func(q mirror.QueueMeta) float64) func(emit func(float64, ...string)) {
		return func(emit func(float64, ...string)) {
			for _, q := range metadata.List() {
				emit(value(q), q.ID.VHost, q.ID.Name)
			}
		}
	}
	labels := []string{"vhost", "queue"}
	m.GaugeFamily("amqp_mirror_queue_slaves", "Slaves of the queue in the metadata log.", labels,
		perQueue(func(q mirror.QueueMeta) float64 { return float64(len(q.Slaves)) }))
	m.GaugeFamily("amqp_mirror_queue_slaves_synchronised", "Synchronised slaves of the queue in the metadata log.", labels,
		perQueue(func(q mirror.QueueMeta) float64 { return float64(len(q.SynchronisedSlaves())) }))
	m.GaugeFamily("amqp_mirror_queue_syncing", "1 while a sync this proxy runs copies to the queue's slaves.", labels,
		perQueue(func(q mirror.QueueMeta) float64 {
			if syncs.running(q.ID) != nil {
				return 1
			}
			return 0
		}))
	m.GaugeFamily("amqp_mirror_queue_epoch", "The queue's epoch: it rises at every promotion.", labels,
		perQueue(func(q mirror.QueueMeta) float64 { return float64(q.Epoch) }))
	m.GaugeFamily("amqp_mirror_queue_slave_messages",
		"Messages the slave copy on backend holds, as this proxy's trimmer of that copy counts them (in a sidecar cluster, the proxy beside the backend trims it).",
		[]string{"vhost", "queue", "backend"}, func(emit func(float64, ...string)) {
			for _, q := range metadata.List() {
				for backend, run := range trimmers.of(q.ID) {
					held, _ := run.t.Stats()
					emit(float64(held), q.ID.VHost, q.ID.Name, backend)
				}
			}
		})
}
