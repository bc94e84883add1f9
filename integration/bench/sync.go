package main

// The sync scenario: what synchronising a slave costs the clients of the queue being
// synchronised, on amqp-mirror (serve in front of three plain nodes) and on RabbitMQ's
// own classic mirroring (a three-node cluster), in one run.
//
// Each target's queue is mirrored on all three nodes with ha-sync-mode manual (amqp-mirror:
// the bench config's bench-sync-manual policy, which outranks bench-ha-all; the cluster: a
// policy of the same name set with rabbitmqctl), so that its sync starts when the scenario
// says. The scenario declares the queue, waits for its three synchronised copies and
// stops a slave's node gracefully (Node.Stop). With the slave gone, it publishes
// -sync-messages persistent messages of -size bytes (confirmed, 256 in flight): the
// backlog. It restarts the node, on which the queue's slave comes back empty and
// unsynchronised, and waits until the master's side lists it so. Then the queue's own
// clients start: one publisher at -sync-rate messages per second that waits for each
// confirm, and one consumer with manual acks (prefetch 100) that takes messages at the
// same pace, so that the backlog stays as it is. After a 2 s warm-up, a 10 s window
// measures them before the sync. Then the sync, timed from the call until the slave is
// listed synchronised: `amqp-mirror ctl sync_queue --wait`, which returns once ctl lists
// every slave synchronised (it asks every 200 ms); on the cluster
// rabbit_amqqueue:sync_mirrors on the master's node (what `rabbitmqctl sync_queue` calls,
// through erl_call: rabbitmqctl boots a VM for seconds), which returns once the master
// has sent its messages, and then the wait, 10 ms at a time, until the new mirror has
// recorded itself synchronised: until then it holds back the queue's confirms. The
// window "during" is that time. The backlog synced is the master's ready messages just
// before the call. At the end the publisher stops, the consumer drains the queue at full
// speed, and every confirmed message, backlog included, should have been delivered:
// those that were not are lost.
//
// The clients connect to the proxy, and on the cluster to the master's node; the stopped
// node is a slave's on both.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	harness "github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

const (
	// syncQueuePrefix names the scenario's queues: serverConfig's bench-sync-manual
	// policy and the cluster's match it.
	syncQueuePrefix = "bench-sync-"
	// syncWarmup is the clients' load before the window before the sync.
	syncWarmup = 2 * time.Second
	// syncBeforeWindow is how long the clients are measured before the sync.
	syncBeforeWindow = 10 * time.Second
	// syncBacklogInFlight is the backlog publisher's unconfirmed messages at most.
	syncBacklogInFlight = 256
	// syncPrefetch is the consumer's prefetch: enough to ride over jitter at the pace,
	// few enough that a stall of the queue shows as a wait between two deliveries.
	syncPrefetch = 100
	// syncTimeout bounds the sync itself, and so a confirm the sync holds back.
	syncTimeout = 10 * time.Minute
	// syncSetupTimeout bounds each wait for the copies: three synchronised after the
	// declare, the stopped one gone, the restarted one back as an unsynchronised slave.
	syncSetupTimeout = 2 * time.Minute
	// syncRecordTimeout bounds the wait, after RabbitMQ's sync returned, for the new
	// mirror to record itself synchronised.
	syncRecordTimeout = 30 * time.Second
	// syncDrainTimeout bounds the drain at the end: the backlog at full speed.
	syncDrainTimeout = 5 * time.Minute
)

// syncPolicy is the sync scenario's queue policy: mirrored everywhere, synchronised on
// demand only.
var syncPolicy = map[string]string{"ha-mode": "all", "ha-sync-mode": "manual"}

// syncWindow is what the queue's own clients saw over one window.
type syncWindow struct {
	Seconds float64 `json:"seconds"`
	// Confirms are the publishes outstanding at some time in the window: begun in it,
	// or begun before and confirmed in it or later, so that a confirm the sync holds
	// back counts whenever its publish began.
	Confirms   int           `json:"confirms"`
	ConfirmP50 time.Duration `json:"confirm_p50_ns"`
	ConfirmP99 time.Duration `json:"confirm_p99_ns"`
	ConfirmMax time.Duration `json:"confirm_max_ns"`
	// DeliveryGap is the longest time the consumer waited for a delivery, the window's
	// edges included: a queue that delivers nothing through the window shows it whole.
	DeliveryGap time.Duration `json:"longest_delivery_gap_ns"`
	Delivered   float64       `json:"delivered_per_second"`
}

// syncResult is one target's row.
type syncResult struct {
	Target string `json:"target"`
	// Backlog is the master's ready messages when the sync began.
	Backlog     int        `json:"backlog_messages"`
	SyncSeconds float64    `json:"sync_seconds"`
	SyncRate    float64    `json:"synced_per_second"`
	Before      syncWindow `json:"before"`
	During      syncWindow `json:"during"`
	Confirmed   int64      `json:"confirmed"`
	Lost        int64      `json:"lost"`
	Duplicates  int64      `json:"duplicates"`
}

// syncTarget is one side of the comparison: where the clients connect and how its
// copies are stopped, brought back and synchronised.
type syncTarget interface {
	// url is where the clients connect.
	url() string
	// isolate declares the queue, waits for its synchronised copies and stops a slave's
	// node.
	isolate(ctx context.Context) error
	// rejoin restarts that node and waits until its slave is back, unsynchronised.
	rejoin(ctx context.Context) error
	// ready is the master's ready messages.
	ready(ctx context.Context) (int, error)
	// sync synchronises the queue and returns when every slave is synchronised.
	sync(ctx context.Context) error
}

// runSync runs the sync scenario on each of -sync-targets, stopping every node and
// process it started however it returns.
func runSync(ctx context.Context, cfg config, logger *slog.Logger) (results []syncResult, err error) {
	m := &mirroredBench{cfg: cfg, withAdmin: true, plainOnly: !slices.Contains(cfg.syncTargets, targetNativeHA)}
	defer m.shutdown()
	if err := m.open(ctx, logger, "sync"); err != nil {
		return nil, err
	}
	for _, name := range cfg.syncTargets {
		r, err := m.syncOn(ctx, name)
		r.Target = name
		results = append(results, r)
		if err != nil {
			return results, fmt.Errorf("%s: %w", name, err)
		}
		progress("sync: %s", r.oneLine())
	}
	return results, nil
}

// syncOn runs the scenario on one target, its amqp-mirror server stopped on return.
func (m *mirroredBench) syncOn(ctx context.Context, name string) (syncResult, error) {
	queue := syncQueuePrefix + name
	if name == targetNativeHA {
		t, err := m.nativeSyncTarget(ctx, queue)
		if err != nil {
			return syncResult{}, err
		}
		return runSyncTarget(ctx, m.cfg, t, queue)
	}
	server, err := m.startServer(ctx)
	if err != nil {
		return syncResult{}, err
	}
	defer func() {
		if err := server.stop(); err != nil {
			progress("  %v", err)
		}
	}()
	t := &mirrorSyncTarget{
		ctl:      &mirrorTarget{m: m, config: m.serverConfigPath, queue: queue},
		proxyURL: proxyURL(m.plain.Nodes()[0].URL(), server.addr),
	}
	return runSyncTarget(ctx, m.cfg, t, queue)
}

// runSyncTarget builds the backlog with a slave away, brings the slave back, starts the
// clients, measures them before and during the sync, and drains the queue.
func runSyncTarget(ctx context.Context, cfg config, t syncTarget, queue string) (syncResult, error) {
	var result syncResult
	if err := t.isolate(ctx); err != nil {
		return result, err
	}
	ledger := newSyncLedger()
	progress("  publishing a backlog of %d messages", cfg.syncMessages)
	if err := publishSyncBacklog(ctx, t.url(), queue, cfg.syncMessages, cfg.size, ledger); err != nil {
		return result, err
	}
	if err := t.rejoin(ctx); err != nil {
		return result, err
	}
	load, err := startSyncLoad(ctx, t.url(), queue, cfg.syncRate, cfg.size, uint64(cfg.syncMessages), ledger)
	if err != nil {
		return result, err
	}
	defer load.close()
	beforeFrom := time.Now().Add(syncWarmup)
	if !sleepUntil(ctx, beforeFrom.Add(syncBeforeWindow)) {
		return result, ctx.Err()
	}
	if result.Backlog, err = t.ready(ctx); err != nil {
		return result, err
	}
	progress("  synchronising %d messages", result.Backlog)
	syncFrom := time.Now()
	if err := t.sync(ctx); err != nil {
		return result, err
	}
	syncTo := time.Now()
	result.SyncSeconds = syncTo.Sub(syncFrom).Seconds()
	result.SyncRate = float64(result.Backlog) / result.SyncSeconds
	result.Before = load.window(beforeFrom, beforeFrom.Add(syncBeforeWindow))
	result.During = load.window(syncFrom, syncTo)
	if err := load.failure(); err != nil {
		return result, err
	}
	progress("  synchronised in %.1f s; draining the queue", result.SyncSeconds)
	drained := load.drain(ctx)
	result.Confirmed, result.Lost, result.Duplicates = ledger.tally()
	return result, firstError(drained, load.failure())
}

// mirrorSyncTarget is amqp-mirror serve in front of the plain nodes, asked with
// amqp-mirror ctl.
type mirrorSyncTarget struct {
	ctl      *mirrorTarget
	proxyURL string
	stopped  *harness.Node
	master   *harness.Node
}

func (t *mirrorSyncTarget) url() string { return t.proxyURL }

func (t *mirrorSyncTarget) isolate(ctx context.Context) error {
	if err := declareQueues(t.proxyURL, []string{t.ctl.queue}, true, nil); err != nil {
		return err
	}
	if err := awaitConditionEvery(ctx, syncSetupTimeout, ctlPoll, "the queue's three copies synchronised", func() (bool, error) {
		return t.ctl.synchronised(ctx)
	}); err != nil {
		return fmt.Errorf("%w (%s)", err, t.ctl)
	}
	row, err := t.ctl.row(ctx)
	if err != nil {
		return err
	}
	if len(row.Synchronised) == 0 {
		return fmt.Errorf("the queue has no synchronised slave to stop (%s)", t.ctl)
	}
	t.master = t.ctl.m.plain.Node(row.Master)
	t.stopped = t.ctl.m.plain.Node(row.Synchronised[len(row.Synchronised)-1])
	if t.master == nil || t.stopped == nil {
		return fmt.Errorf("the queue's copies are not on the bench's nodes (%s)", t.ctl)
	}
	progress("  stopping %s, a slave's node (the master is on %s)", t.stopped.Name, t.master.Name)
	if err := t.stopped.Stop(ctx); err != nil {
		return err
	}
	// The backlog is to be confirmed without the stopped slave: the proxy must know it
	// is gone first.
	return awaitConditionEvery(ctx, syncSetupTimeout, ctlPoll, t.stopped.Name+" no longer a synchronised slave", func() (bool, error) {
		row, err := t.ctl.row(ctx)
		return err == nil && !slices.Contains(row.Synchronised, t.stopped.Name), nil
	})
}

func (t *mirrorSyncTarget) rejoin(ctx context.Context) error {
	progress("  restarting %s", t.stopped.Name)
	if err := t.stopped.Restart(ctx); err != nil {
		return err
	}
	return awaitConditionEvery(ctx, syncSetupTimeout, ctlPoll, t.stopped.Name+" an unsynchronised slave", func() (bool, error) {
		row, err := t.ctl.row(ctx)
		return err == nil && slices.Contains(row.Slaves, t.stopped.Name) && !slices.Contains(row.Synchronised, t.stopped.Name), nil
	})
}

func (t *mirrorSyncTarget) ready(ctx context.Context) (int, error) {
	return readyOn(ctx, t.master, t.ctl.queue)
}

func (t *mirrorSyncTarget) sync(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, t.ctl.m.binary, "ctl", "sync_queue", "--config", t.ctl.config,
		"--wait", "--timeout", syncTimeout.String(), "-q", t.ctl.queue)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("amqp-mirror ctl sync_queue --wait: %w: %s", err, out)
	}
	if ok, err := t.ctl.synchronised(ctx); err != nil || !ok {
		return fmt.Errorf("amqp-mirror ctl sync_queue --wait returned with the queue not synchronised (%s): %v", t.ctl, err)
	}
	return nil
}

// nativeSyncTarget is RabbitMQ's classic mirroring on the cluster, asked on the master's
// node, which stays up.
type nativeSyncTarget struct {
	nodes   []*harness.Node
	queue   string
	master  *harness.Node
	stopped *harness.Node
}

// nativeSyncTarget sets the manual-sync policy on the cluster and returns the target.
// The queue is declared on the first node, so that its master is there (client-local).
func (m *mirroredBench) nativeSyncTarget(ctx context.Context, queue string) (*nativeSyncTarget, error) {
	nodes := m.native.Nodes()
	definition, err := json.Marshal(syncPolicy)
	if err != nil {
		return nil, err
	}
	if _, err := nodes[0].Ctl(ctx, "set_policy", "bench-sync-manual", "^"+syncQueuePrefix, string(definition), "--apply-to", "queues"); err != nil {
		return nil, err
	}
	return &nativeSyncTarget{nodes: nodes, queue: queue, master: nodes[0]}, nil
}

func (t *nativeSyncTarget) url() string { return t.master.URL() }

func (t *nativeSyncTarget) isolate(ctx context.Context) error {
	if err := declareQueues(t.master.URL(), []string{t.queue}, true, nil); err != nil {
		return err
	}
	var copies nativeCopiesOf
	if err := awaitConditionEvery(ctx, syncSetupTimeout, 100*time.Millisecond, "the queue's three copies synchronised", func() (bool, error) {
		var err error
		copies, err = t.copies(ctx)
		return err == nil && len(copies.Synchronised) == mirroredNodes-1, nil
	}); err != nil {
		return fmt.Errorf("%w (%+v)", err, copies)
	}
	if copies.Master != t.master.ErlangName {
		return fmt.Errorf("the queue's master is on %s, not on %s where it was declared", copies.Master, t.master.ErlangName)
	}
	t.stopped = t.nodes[len(t.nodes)-1]
	progress("  stopping %s, a mirror's node (the master is on %s)", t.stopped.Name, t.master.Name)
	return t.stopped.Stop(ctx)
}

func (t *nativeSyncTarget) rejoin(ctx context.Context) error {
	progress("  restarting %s", t.stopped.Name)
	if err := t.stopped.Restart(ctx); err != nil {
		return err
	}
	var copies nativeCopiesOf
	err := awaitConditionEvery(ctx, syncSetupTimeout, 100*time.Millisecond, t.stopped.Name+" an unsynchronised mirror", func() (bool, error) {
		var err error
		copies, err = t.copies(ctx)
		return err == nil && slices.Contains(copies.Mirrors, t.stopped.ErlangName) && !slices.Contains(copies.Synchronised, t.stopped.ErlangName), nil
	})
	if err != nil {
		return fmt.Errorf("%w (%+v)", err, copies)
	}
	return nil
}

// nativeCopiesOf is where a queue's copies are on the cluster, by Erlang node name.
type nativeCopiesOf struct {
	Master       string   `json:"master"`
	Mirrors      []string `json:"mirrors"`
	Synchronised []string `json:"synchronised"`
}

// copies asks the master's node with Eval: rabbitmqctl boots an Erlang VM per call,
// seconds of CPU beside the brokers measured.
func (t *nativeSyncTarget) copies(ctx context.Context) (nativeCopiesOf, error) {
	expression := fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<%q>>)), `+
		`Name = fun(P) -> atom_to_binary(node(P), utf8) end, `+
		`rabbit_json:encode(#{master => Name(amqqueue:get_pid(Q)), `+
		`mirrors => [Name(P) || P <- amqqueue:get_slave_pids(Q)], `+
		`synchronised => [Name(P) || P <- amqqueue:get_sync_slave_pids(Q)]})`, t.queue)
	var copies nativeCopiesOf
	out, err := t.master.Eval(ctx, expression)
	if err != nil {
		return copies, err
	}
	if err := json.Unmarshal(out, &copies); err != nil {
		return copies, fmt.Errorf("the copies of %s: %w: %s", t.queue, err, out)
	}
	return copies, nil
}

func (t *nativeSyncTarget) ready(ctx context.Context) (int, error) {
	return readyOn(ctx, t.master, t.queue)
}

// sync calls what rabbitmqctl sync_queue calls, through Eval rather than rabbitmqctl,
// whose own Erlang VM takes seconds to boot. The call returns when the copy is done; the
// new mirror records itself synchronised a moment later, and sync returns then, as
// amqp-mirror's does once ctl lists the slave synchronised.
func (t *nativeSyncTarget) sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	expression := fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<%q>>)), `+
		`io_lib:format("~p", [rabbit_amqqueue:sync_mirrors(Q)])`, t.queue)
	began := time.Now()
	out, err := t.master.Eval(ctx, expression)
	if err != nil {
		return fmt.Errorf("sync_mirrors: %w", err)
	}
	if string(out) != "ok" {
		return fmt.Errorf("sync_mirrors: %s", out)
	}
	progress("  sync_mirrors returned after %.2f s", time.Since(began).Seconds())
	// A sync that died (a mirror gone meanwhile) returns ok too, and the mirror then
	// never records itself synchronised.
	var copies nativeCopiesOf
	err = awaitConditionEvery(ctx, syncRecordTimeout, 10*time.Millisecond, "the synchronised mirror recorded", func() (bool, error) {
		copies, err = t.copies(ctx)
		return err == nil && len(copies.Synchronised) == mirroredNodes-1, nil
	})
	if err != nil {
		return fmt.Errorf("sync_mirrors returned ok: %w (%+v)", err, copies)
	}
	return nil
}

// readyOn is the ready messages of queue on node.
func readyOn(ctx context.Context, node *harness.Node, queue string) (int, error) {
	queues, err := node.Queues(ctx, "/")
	if err != nil {
		return 0, err
	}
	counts, ok := queues[queue]
	if !ok {
		return 0, fmt.Errorf("%s does not hold %s", node.Name, queue)
	}
	return counts.MessagesReady, nil
}

// publishSyncBacklog publishes n persistent messages, numbered from 0, with up to
// syncBacklogInFlight unconfirmed, and records each confirm in the ledger.
func publishSyncBacklog(ctx context.Context, url, queue string, n, size int, ledger *syncLedger) error {
	conn, err := dial(url, "bench sync backlog", nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, syncBacklogInFlight))
	await := func() error {
		select {
		case c, ok := <-confirms:
			if !ok {
				return fmt.Errorf("the backlog's channel closed with confirms outstanding")
			}
			if !c.Ack {
				return fmt.Errorf("backlog message %d nacked", c.DeliveryTag-1)
			}
			ledger.confirm(c.DeliveryTag - 1)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Minute):
			return fmt.Errorf("no confirm of the backlog for a minute")
		}
	}
	for seq := range n {
		if seq >= syncBacklogInFlight {
			if err := await(); err != nil {
				return err
			}
		}
		msg := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: syncBody(uint64(seq), size)}
		if err := ch.PublishWithContext(ctx, "", queue, false, false, msg); err != nil {
			return fmt.Errorf("publish backlog message %d: %w", seq, err)
		}
	}
	for range min(n, syncBacklogInFlight) {
		if err := await(); err != nil {
			return err
		}
	}
	return nil
}

// syncBody is a message of size bytes whose first eight carry its number.
func syncBody(seq uint64, size int) []byte {
	body := make([]byte, max(size, 8))
	binary.BigEndian.PutUint64(body, seq)
	return body
}

// syncLedger is which messages were confirmed and how often each was delivered.
type syncLedger struct {
	mu        sync.Mutex
	confirmed map[uint64]bool
	delivered map[uint64]int
}

func newSyncLedger() *syncLedger {
	return &syncLedger{confirmed: map[uint64]bool{}, delivered: map[uint64]int{}}
}

func (l *syncLedger) confirm(seq uint64) {
	l.mu.Lock()
	l.confirmed[seq] = true
	l.mu.Unlock()
}

func (l *syncLedger) deliver(seq uint64) {
	l.mu.Lock()
	l.delivered[seq]++
	l.mu.Unlock()
}

// undelivered counts the confirmed messages never delivered.
func (l *syncLedger) undelivered() int64 {
	_, lost, _ := l.tally()
	return lost
}

// tally is the messages confirmed, those of them never delivered, and the deliveries
// beyond the first of each message.
func (l *syncLedger) tally() (confirmed, lost, duplicates int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for seq := range l.confirmed {
		if l.delivered[seq] == 0 {
			lost++
		}
	}
	for _, n := range l.delivered {
		duplicates += int64(max(n-1, 0))
	}
	return int64(len(l.confirmed)), lost, duplicates
}

func (r syncResult) oneLine() string {
	return fmt.Sprintf("%d messages synced in %.1f s (%.0f msg/s); confirm p99 %s before, %s during; longest delivery gap %s before, %s during; %d lost",
		r.Backlog, r.SyncSeconds, r.SyncRate, latencyString(r.Before.ConfirmP99), latencyString(r.During.ConfirmP99),
		latencyString(r.Before.DeliveryGap), latencyString(r.During.DeliveryGap), r.Lost)
}

// printSync prints the sync scenario's table, one row per target.
func printSync(out io.Writer, cfg config, results []syncResult) error {
	if len(results) == 0 {
		return nil
	}
	fmt.Fprintf(out, "\nsync: a backlog of persistent %d B messages synchronised to a slave that rejoined, while the queue's clients publish %.0f msg/s "+
		"(each confirm awaited) and consume as many (manual acks, prefetch %d); before: %v of that load, during: the sync\n",
		cfg.size, cfg.syncRate, syncPrefetch, syncBeforeWindow)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "target\tbacklog synced\tsync s\tsync msg/s\tconfirm p50 before\tduring\tconfirm p99 before\tduring\tlongest confirm before\tduring\tlongest delivery gap before\tduring\tdelivered/s during\tlost\t")
	for _, r := range results {
		fmt.Fprintf(w, "%s\t%d\t%.1f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%d\t\n",
			r.Target, r.Backlog, r.SyncSeconds, r.SyncRate,
			latencyString(r.Before.ConfirmP50), latencyString(r.During.ConfirmP50),
			latencyString(r.Before.ConfirmP99), latencyString(r.During.ConfirmP99),
			latencyString(r.Before.ConfirmMax), latencyString(r.During.ConfirmMax),
			latencyString(r.Before.DeliveryGap), latencyString(r.During.DeliveryGap),
			r.During.Delivered, r.Lost)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	var notes []string
	for _, r := range results {
		if r.Duplicates > 0 {
			notes = append(notes, fmt.Sprintf("%s delivered %d messages twice", r.Target, r.Duplicates))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(out, "  %s\n", strings.Join(notes, "; "))
	}
	return nil
}

// syncLoad is the queue's own clients: a paced publisher that waits for each confirm and
// a consumer paced alike, each on its connection. It keeps every confirm latency and
// delivery time, for windows read afterwards.
type syncLoad struct {
	pub, sub *amqp.Connection
	ledger   *syncLedger
	cancel   context.CancelFunc
	// stop ends the publisher; unpaced lets the consumer take messages at full speed.
	stop, unpaced chan struct{}
	done          sync.WaitGroup
	firstFailure

	mu         sync.Mutex
	confirms   []confirmSample
	deliveries []time.Time
	// unconfirmed is when the publish awaiting its confirm began, zero when none does.
	unconfirmed time.Time
}

// confirmSample is one publish: when it began and how long its confirm took.
type confirmSample struct {
	at   time.Time
	took time.Duration
}

// startSyncLoad starts the clients; the publisher numbers its messages from first.
func startSyncLoad(ctx context.Context, url, queue string, rate float64, size int, first uint64, ledger *syncLedger) (*syncLoad, error) {
	ctx, cancel := context.WithCancel(ctx)
	l := &syncLoad{ledger: ledger, cancel: cancel, stop: make(chan struct{}), unpaced: make(chan struct{})}
	var err error
	if l.sub, err = dial(url, "bench sync consumer", nil); err != nil {
		cancel()
		return nil, err
	}
	if l.pub, err = dial(url, "bench sync publisher", nil); err != nil {
		l.close()
		return nil, err
	}
	deliveries, err := consumeSync(l.sub, queue)
	if err != nil {
		l.close()
		return nil, err
	}
	pub, err := l.pub.Channel()
	if err == nil {
		err = pub.Confirm(false)
	}
	if err != nil {
		l.close()
		return nil, fmt.Errorf("sync publisher: %w", err)
	}
	l.done.Go(func() { l.consume(deliveries, rate) })
	l.done.Go(func() { l.publish(ctx, pub, queue, rate, size, first) })
	return l, nil
}

// consumeSync consumes queue on a channel of conn with manual acks.
func consumeSync(conn *amqp.Connection, queue string) (<-chan amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(syncPrefetch, 0, false)
	}
	if err != nil {
		return nil, fmt.Errorf("sync consumer: %w", err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("sync consumer: %w", err)
	}
	return deliveries, nil
}

func (l *syncLoad) publish(ctx context.Context, ch *amqp.Channel, queue string, rate float64, size int, first uint64) {
	pace := newPacer(rate)
	defer pace.stop()
	for seq := first; pace.wait(l.stop); seq++ {
		began := time.Now()
		l.mu.Lock()
		l.unconfirmed = began
		l.mu.Unlock()
		msg := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: syncBody(seq, size)}
		confirm, err := ch.PublishWithDeferredConfirm("", queue, false, false, msg)
		if err != nil {
			l.fail(fmt.Errorf("publish: %w", err))
			return
		}
		waitCtx, cancel := context.WithTimeout(ctx, syncTimeout)
		acked, err := confirm.WaitContext(waitCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil || !acked {
			l.fail(fmt.Errorf("message %d not confirmed: acked %v, %v", seq, acked, err))
			return
		}
		l.ledger.confirm(seq)
		l.mu.Lock()
		l.confirms = append(l.confirms, confirmSample{at: began, took: time.Since(began)})
		l.unconfirmed = time.Time{}
		l.mu.Unlock()
	}
}

// consume takes a delivery at each tick of the pace, or at once after drain, and acks it.
func (l *syncLoad) consume(deliveries <-chan amqp.Delivery, rate float64) {
	pace := newPacer(rate)
	defer pace.stop()
	paced := true
	for {
		if paced && !pace.wait(l.unpaced) {
			paced = false
		}
		d, ok := <-deliveries
		if !ok {
			return
		}
		now := time.Now()
		if len(d.Body) >= 8 {
			l.ledger.deliver(binary.BigEndian.Uint64(d.Body))
		}
		l.mu.Lock()
		l.deliveries = append(l.deliveries, now)
		l.mu.Unlock()
		if err := d.Ack(false); err != nil {
			l.fail(fmt.Errorf("ack: %w", err))
			return
		}
	}
}

// window summarises what the clients saw from from to to. A publish still waiting for
// its confirm counts with the time it has waited so far.
func (l *syncLoad) window(from, to time.Time) syncWindow {
	l.mu.Lock()
	defer l.mu.Unlock()
	confirms := l.confirms
	if !l.unconfirmed.IsZero() {
		confirms = append(slices.Clip(confirms), confirmSample{at: l.unconfirmed, took: time.Since(l.unconfirmed)})
	}
	return summarizeSyncWindow(confirms, l.deliveries, from, to)
}

// summarizeSyncWindow is the window [from, to) of the samples, each in time order.
func summarizeSyncWindow(confirms []confirmSample, deliveries []time.Time, from, to time.Time) syncWindow {
	w := syncWindow{Seconds: to.Sub(from).Seconds()}
	var took []int64
	for _, c := range confirms {
		if c.at.Before(to) && c.at.Add(c.took).After(from) {
			took = append(took, int64(c.took))
		}
	}
	if len(took) > 0 {
		slices.Sort(took)
		w.Confirms = len(took)
		w.ConfirmP50 = time.Duration(percentile(took, 0.50))
		w.ConfirmP99 = time.Duration(percentile(took, 0.99))
		w.ConfirmMax = time.Duration(took[len(took)-1])
	}
	last, delivered := from, 0
	for _, at := range deliveries {
		if at.Before(from) || !at.Before(to) {
			continue
		}
		w.DeliveryGap = max(w.DeliveryGap, at.Sub(last))
		last = at
		delivered++
	}
	w.DeliveryGap = max(w.DeliveryGap, to.Sub(last))
	if w.Seconds > 0 {
		w.Delivered = float64(delivered) / w.Seconds
	}
	return w
}

// drain stops the publisher and lets the consumer take the rest of the queue at full
// speed, until every confirmed message arrived or syncDrainTimeout passed: what has not
// arrived then counts as lost. Its error is ctx's.
func (l *syncLoad) drain(ctx context.Context) error {
	l.stopPublishing()
	close(l.unpaced)
	_ = awaitConditionEvery(ctx, syncDrainTimeout, 100*time.Millisecond, "every confirmed message delivered", func() (bool, error) {
		return l.ledger.undelivered() == 0, nil
	})
	return ctx.Err()
}

func (l *syncLoad) stopPublishing() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
}

// close stops the clients and waits for them.
func (l *syncLoad) close() {
	l.stopPublishing()
	l.cancel()
	for _, c := range []*amqp.Connection{l.pub, l.sub} {
		if c != nil {
			c.Close()
		}
	}
	l.done.Wait()
}
