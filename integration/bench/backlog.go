package main

// The backlog scenario: how amqp-mirror's cost grows with the messages a mirrored queue
// holds. amqp-mirror serve fronts three plain nodes; one durable queue, mirrored on all
// three (ha-mode all, automatic sync), is declared through it and filled with
// -backlog-messages persistent messages of -backlog-size bytes, no consumer: -publishers
// publishers, each with at most -confirm-window unconfirmed messages. The proxy's
// resident set before and with the whole backlog held gives its memory per queued message
// (mostly the trimmers' state: each slave's trimmer holds every message of its copy as an
// unacknowledged delivery, keyed by the message's identity), and its CPU time over the
// fill its cost per published message.
//
// Then a slave's node loses its copy: the node is killed and its data directory wiped
// (localbroker's Node.Wipe), and it starts again empty. The proxy sees the backend come
// back, declares the copy again and lets it rejoin as the youngest slave, purged, and
// ha-sync-mode automatic copies the backlog to it at once. The sync time runs from the
// node accepting connections again until amqp-mirror ctl lists it synchronised: the
// proxy's detection of the return, the rejoin and the copy. The proxy's resident set is
// sampled throughout.
//
// Last the master's node is killed with SIGKILL. The promotion time runs from the kill
// until amqp-mirror ctl names another master (ctl is a process started every ctlPoll,
// so this is known to about 0.1 s, and the first delivery can come before it); a
// consumer started right after the kill, through the proxy with manual acks (prefetch
// -prefetch, one ack per message), times the first delivery, then consumes the whole
// backlog. Each body starts with the message's
// number, so the scenario counts every confirmed message that never arrives (lost) and
// every one that arrives twice. The killed node starts again at the end.
//
// Every wait is bounded. The fill fails when a publisher gets no confirm for
// backlogStall; the sync, which shows no progress in ctl, fails past backlogBound; the
// drain ends, counting what did not come as lost, after backlogStall without a delivery
// or past backlogBound.

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	harness "github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// backlogQueue is the scenario's queue; serverConfig's policy mirrors "^bench-".
const backlogQueue = "bench-backlog"

const (
	// backlogSetupTimeout bounds the wait for the queue's three copies after its declare,
	// and for the promotion and the first delivery after the kill.
	backlogSetupTimeout = 2 * time.Minute
	// backlogStall ends a wait for the fill's confirms or the drain's deliveries that
	// made no progress for this long.
	backlogStall = time.Minute
	// backlogSettle is the pause between the last confirm and the reading of the proxy's
	// memory: the slaves' trimmers take their deliveries, the runtime collects.
	backlogSettle = 5 * time.Second
)

// backlogResult is the backlog scenario's outcome.
type backlogResult struct {
	Messages  int `json:"messages"`
	BodyBytes int `json:"body_bytes"`
	// The fill: every message published and confirmed, with no consumer.
	PublishSeconds float64 `json:"publish_seconds"`
	PublishRate    float64 `json:"published_per_second"`
	Confirmed      int64   `json:"confirmed"`
	Nacked         int64   `json:"nacked"`
	// ProxyCPUPerPublish is the proxy's user and system CPU time over the fill divided by
	// the messages confirmed, in microseconds; FillCPU the cores each side used meanwhile, Other
	// what the rest of the machine took from them.
	ProxyCPUPerPublish float64 `json:"proxy_cpu_us_per_published_message"`
	FillCPU            cpuUse  `json:"fill_cpu"`
	// The proxy's resident set before the fill and with the backlog held (backlogSettle
	// after the last confirm), its high-water mark then, and the growth per message.
	ProxyRSSBefore       int64   `json:"proxy_rss_before_bytes"`
	ProxyRSSBacklog      int64   `json:"proxy_rss_backlog_bytes"`
	ProxyRSSPeakFill     int64   `json:"proxy_rss_peak_fill_bytes"`
	ProxyBytesPerMessage float64 `json:"proxy_bytes_per_message"`
	// The sync of a slave whose node came back empty: from its return to ctl listing it
	// synchronised; the messages its copy holds then, by its own broker's count.
	SyncedNode       string  `json:"synced_node"`
	SyncSeconds      float64 `json:"sync_seconds"`
	SyncRate         float64 `json:"synced_per_second"`
	SyncedCopyHolds  int     `json:"synced_copy_messages"`
	ProxyRSSSyncPeak int64   `json:"proxy_rss_sync_peak_bytes"`
	ProxyRSSSynced   int64   `json:"proxy_rss_after_sync_bytes"`
	// The kill -9 of the master's node: from the kill to ctl naming another master, and to
	// the first delivery to a consumer started after it.
	KilledNode           string  `json:"killed_node"`
	NewMaster            string  `json:"new_master"`
	PromotedSeconds      float64 `json:"promoted_seconds"`
	FirstDeliverySeconds float64 `json:"first_delivery_seconds"`
	// ConsumeAttempts counts the consumer's connects until one consumed: more than one
	// means the proxy refused it during the failover.
	ConsumeAttempts int `json:"consume_attempts"`
	// The drain, from the first delivery to the last confirmed message delivered (or the
	// end of the wait).
	ConsumeSeconds float64 `json:"consume_seconds"`
	ConsumeRate    float64 `json:"consumed_per_second"`
	Delivered      int64   `json:"delivered_distinct"`
	Duplicates     int64   `json:"duplicates"`
	Lost           int64   `json:"lost"`
}

// backlogRun is what the scenario's steps share.
type backlogRun struct {
	cfg    config
	m      *mirroredBench
	pid    int // amqp-mirror serve's own process
	url    string
	target *mirrorTarget
	// confirmed[id] is whether message id was confirmed; set by the fill.
	confirmed []bool
	result    *backlogResult
}

// runBacklog runs the backlog scenario, stopping what it started however it returns.
func runBacklog(ctx context.Context, cfg config, logger *slog.Logger) (result backlogResult, err error) {
	setup, err := startPlainMirror(ctx, cfg, logger, "backlog")
	if err != nil {
		return result, err
	}
	defer setup.close()
	m := setup.m
	r := &backlogRun{cfg: cfg, m: m, result: &result, pid: setup.pid, url: setup.url,
		target: &mirrorTarget{m: m, config: m.serverConfigPath, queue: backlogQueue},
	}
	result.Messages, result.BodyBytes = cfg.backlogMessages, cfg.backlogSize
	for _, step := range []func(context.Context) error{r.declare, r.fill, r.syncEmptySlave, r.failOver} {
		if err := step(ctx); err != nil {
			return result, err
		}
	}
	return result, nil
}

// declare declares the queue through the proxy and waits for its master and two
// synchronised slaves.
func (r *backlogRun) declare(ctx context.Context) error {
	if err := declareQueues(r.url, []string{backlogQueue}, true, nil); err != nil {
		return err
	}
	if err := awaitConditionEvery(ctx, backlogSetupTimeout, ctlPoll, "the queue's three copies synchronised", func() (bool, error) {
		return r.target.synchronised(ctx)
	}); err != nil {
		return fmt.Errorf("%w (%s)", err, r.target)
	}
	// A kill -9 soon after a declare could lose the queue on the killed node (see
	// localbroker.Node.FlushMetadata): RabbitMQ's behaviour, not what this measures.
	return flushAll(ctx, r.m.plain.Nodes())
}

// fill publishes the backlog and reads the proxy's memory and CPU around it.
func (r *backlogRun) fill(ctx context.Context) error {
	res := r.result
	var err error
	if res.ProxyRSSBefore, err = rssOf(r.pid); err != nil {
		return err
	}
	procs := watched{brokers: pids(r.m.plain), proxy: r.pid}
	cpuBefore := procs.snapshot()
	progress("backlog: publishing %d messages of %d B through amqp-mirror, %d publishers", res.Messages, res.BodyBytes, r.cfg.publishers)
	began := time.Now()
	// A fill that failed still says how far it got, at what rate and cost.
	fill, err := publishBacklog(ctx, r.url, backlogQueue, r.cfg)
	res.PublishSeconds = time.Since(began).Seconds()
	cpuAfter := procs.snapshot()
	res.FillCPU = procs.between(cpuBefore, cpuAfter)
	r.confirmed = fill.confirmed
	res.Confirmed, res.Nacked = fill.confirmedCount(), fill.nacked.Load()
	res.PublishRate = float64(res.Confirmed) / res.PublishSeconds
	res.ProxyCPUPerPublish = float64((cpuAfter.proxy - cpuBefore.proxy).Microseconds()) / float64(max(res.Confirmed, 1))
	if err != nil {
		res.ProxyRSSBacklog, _ = rssOf(r.pid)
		return fmt.Errorf("fill, %d of %d confirmed after %.0f s: %w", res.Confirmed, res.Messages, res.PublishSeconds, err)
	}
	if !sleepUntil(ctx, time.Now().Add(backlogSettle)) {
		return ctx.Err()
	}
	mem, err := readMemory(r.pid)
	if err != nil {
		return err
	}
	res.ProxyRSSBacklog, res.ProxyRSSPeakFill = mem.RSS, mem.Peak
	res.ProxyBytesPerMessage = float64(res.ProxyRSSBacklog-res.ProxyRSSBefore) / float64(res.Messages)
	progress("backlog: %d confirmed in %.1f s (%.0f msg/s); proxy RSS %s, %s before",
		res.Confirmed, res.PublishSeconds, res.PublishRate, bytesString(res.ProxyRSSBacklog), bytesString(res.ProxyRSSBefore))
	return nil
}

// syncEmptySlave wipes the node of the last synchronised slave ctl lists, starts it
// again empty and times its sync.
func (r *backlogRun) syncEmptySlave(ctx context.Context) error {
	row, err := r.target.row(ctx)
	if err != nil {
		return err
	}
	if len(row.Synchronised) == 0 {
		return fmt.Errorf("no synchronised slave to wipe (%s)", r.target)
	}
	slave := r.m.plain.Node(row.Synchronised[len(row.Synchronised)-1])
	if slave == nil {
		return fmt.Errorf("amqp-mirror names slave %q, not a bench node", row.Synchronised[len(row.Synchronised)-1])
	}
	r.result.SyncedNode = slave.Name
	progress("backlog: wiping %s (a slave) and starting it again empty", slave.Name)
	if err := slave.Wipe(); err != nil {
		return err
	}
	if err := slave.Restart(ctx); err != nil {
		return fmt.Errorf("restart %s: %w", slave.Name, err)
	}
	back := time.Now()
	sampler := sampleRSS(r.pid)
	err = r.awaitSynchronised(ctx, slave)
	r.result.ProxyRSSSyncPeak = peakRSS(sampler.stop())
	if err != nil {
		return err
	}
	r.result.SyncSeconds = time.Since(back).Seconds()
	r.result.SyncRate = float64(r.result.Confirmed) / r.result.SyncSeconds
	if r.result.ProxyRSSSynced, err = rssOf(r.pid); err != nil {
		return err
	}
	held, err := slave.Queues(ctx, "/")
	if err != nil {
		return err
	}
	r.result.SyncedCopyHolds = held[backlogQueue].Messages
	progress("backlog: %s synchronised %.1f s after its return (%.0f msg/s); its copy holds %d messages",
		slave.Name, r.result.SyncSeconds, r.result.SyncRate, r.result.SyncedCopyHolds)
	return nil
}

// backlogBound bounds a wait whose length grows with the backlog, the sync and the
// drain: a minute, and a millisecond per message (slower than 1 000 msg/s is a failure).
func backlogBound(messages int) time.Duration {
	return time.Minute + time.Duration(messages)*time.Millisecond
}

// awaitSynchronised waits, at most backlogBound, until ctl lists slave synchronised.
func (r *backlogRun) awaitSynchronised(ctx context.Context, slave *harness.Node) error {
	err := awaitConditionEvery(ctx, backlogBound(r.result.Messages), ctlPoll, slave.Name+" a synchronised slave again", func() (bool, error) {
		row, err := r.target.row(ctx)
		if err != nil {
			return false, nil // the proxy answers again after the backend's return
		}
		return slices.Contains(row.Synchronised, slave.Name), nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, r.target)
	}
	return nil
}

func peakRSS(samples []rssSample) int64 {
	var peak int64
	for _, s := range samples {
		peak = max(peak, s.rss)
	}
	return peak
}

// failOver kills the master's node, times the promotion and the first delivery to a
// consumer started after the kill, consumes the backlog and starts the node again.
func (r *backlogRun) failOver(ctx context.Context) error {
	master, err := r.target.master(ctx)
	if err != nil {
		return err
	}
	if err := flushAll(ctx, r.m.plain.Nodes()); err != nil {
		return err
	}
	r.result.KilledNode = master.Name
	progress("backlog: kill -9 %s (the master's node)", master.Name)
	killedAt := time.Now()
	if err := master.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", master.Name, err)
	}
	c := startBacklogConsumer(ctx, r.url, backlogQueue, r.cfg.prefetch, r.confirmed)
	defer c.close()
	if err := r.awaitPromoted(ctx, master, killedAt); err != nil {
		return err
	}
	if err := awaitCondition(ctx, backlogSetupTimeout, "a first delivery after the kill", func() (bool, error) {
		return !c.firstAt().IsZero(), c.failure()
	}); err != nil {
		return err
	}
	first := c.firstAt()
	r.result.FirstDeliverySeconds = first.Sub(killedAt).Seconds()
	progress("backlog: %s promoted %.2f s after the kill, first delivery after %.2f s; consuming the backlog",
		r.result.NewMaster, r.result.PromotedSeconds, r.result.FirstDeliverySeconds)
	if err := r.drain(ctx, c); err != nil {
		return err
	}
	c.close()
	r.tally(c, first)
	progress("backlog: %d of %d confirmed messages delivered in %.1f s (%.0f msg/s), %d lost, %d duplicates",
		c.wanted.Load(), r.result.Confirmed, r.result.ConsumeSeconds, r.result.ConsumeRate, r.result.Lost, r.result.Duplicates)
	if err := master.Restart(ctx); err != nil {
		return fmt.Errorf("restart %s: %w", master.Name, err)
	}
	return nil
}

// awaitPromoted waits until ctl names a master other than the killed node.
func (r *backlogRun) awaitPromoted(ctx context.Context, killed *harness.Node, killedAt time.Time) error {
	err := awaitConditionEvery(ctx, backlogSetupTimeout, ctlPoll, "a master other than "+killed.Name, func() (bool, error) {
		row, err := r.target.row(ctx)
		if err != nil {
			return false, nil // between the kill and the promotion: not yet
		}
		r.result.NewMaster = row.Master
		return row.Master != "" && row.Master != killed.Name, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, r.target)
	}
	r.result.PromotedSeconds = time.Since(killedAt).Seconds()
	return nil
}

// drain waits until every confirmed message was delivered. A drain that stalls for
// backlogStall, or outlasts backlogBound, ends the wait without failing the scenario:
// what never came counts as lost.
func (r *backlogRun) drain(ctx context.Context, c *backlogConsumer) error {
	want := r.result.Confirmed
	var last int64
	lastChange, lastReport := time.Now(), time.Now()
	err := awaitConditionEvery(ctx, backlogBound(r.result.Messages), 100*time.Millisecond, "every confirmed message delivered", func() (bool, error) {
		got := c.wanted.Load()
		if got != last {
			last, lastChange = got, time.Now()
		}
		if time.Since(lastReport) >= backlogProgress {
			progress("backlog: %d of %d delivered", got, want)
			lastReport = time.Now()
		}
		if time.Since(lastChange) > backlogStall {
			return false, fmt.Errorf("no new message for %v, %d of %d delivered", backlogStall, got, want)
		}
		return got >= want, c.failure()
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		progress("backlog: WARNING: the drain ended early: %v", err)
	}
	return nil
}

// tally fills in the drain's figures once the consumer is closed.
func (r *backlogRun) tally(c *backlogConsumer, first time.Time) {
	res := r.result
	res.ConsumeAttempts = int(c.attempts.Load())
	res.Delivered, res.Duplicates = c.distinct.Load(), c.duplicates.Load()
	res.Lost = res.Confirmed - c.wanted.Load()
	res.ConsumeSeconds = c.lastAt().Sub(first).Seconds()
	if res.ConsumeSeconds > 0 {
		res.ConsumeRate = float64(res.Delivered) / res.ConsumeSeconds
	}
}
