package main

// The scale scenario: how amqp-mirror's cost grows with the number of mirrored queues.
// amqp-mirror serve fronts three plain nodes; -scale-queues durable queues, each mirrored
// on all three (ha-mode all, automatic sync), are declared through it and each gets a
// consumer and a light, steady flow of publishes. The scenario reads the proxy's memory
// and the size of its state directory (the metadata log and its snapshots), then kills
// -9 the node that masters the most queues and times how long the proxy takes to promote
// a slave of each of them and how long each queue's consumer waits for a message published
// after the kill: the failover of many queues at once, which a one-queue kill does not
// show.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// scaleResult is the scale scenario's outcome.
type scaleResult struct {
	Queues int `json:"queues"`
	// DeclareSeconds is the time to declare every queue and see all its copies
	// synchronised.
	DeclareSeconds float64 `json:"declare_seconds"`
	// The proxy's resident set with no queue, and with every queue declared, consumed and
	// published to; PerQueue is the growth divided by the queues.
	ProxyRSSBefore  int64   `json:"proxy_rss_before_bytes"`
	ProxyRSSAfter   int64   `json:"proxy_rss_after_bytes"`
	ProxyPerQueue   int64   `json:"proxy_bytes_per_queue"`
	StateDirBytes   int64   `json:"state_dir_bytes"`
	PublishRate     float64 `json:"published_per_second"`
	KilledNode      string  `json:"killed_node"`
	MastersOnKilled int     `json:"masters_on_killed_node"`
	PromotedSeconds float64 `json:"promoted_seconds"`
	ResumedP50      float64 `json:"resumed_p50_seconds"`
	ResumedP99      float64 `json:"resumed_p99_seconds"`
	ResumedMax      float64 `json:"resumed_max_seconds"`
	Confirmed       int64   `json:"confirmed"`
	Lost            int64   `json:"lost"`
}

// scaleQueuePrefix names the scenario's queues; serverConfig's policy mirrors "^bench-".
const scaleQueuePrefix = "bench-scale-"

// ctlPoll is how often the scenario asks amqp-mirror ctl: each call is a process.
const ctlPoll = 100 * time.Millisecond

// scaleTimeout bounds each wait of the scenario: declares and syncs, promotion, resumption.
const scaleTimeout = 5 * time.Minute

// runScale runs the scale scenario, stopping what it started however it returns.
func runScale(ctx context.Context, cfg config, logger *slog.Logger) (result scaleResult, err error) {
	setup, err := startPlainMirror(ctx, cfg, logger, "scale")
	if err != nil {
		return result, err
	}
	defer setup.close()
	m, serverPID, url := setup.m, setup.pid, setup.url
	target := &mirrorTarget{m: m, config: m.serverConfigPath}

	result.Queues = cfg.scaleQueues
	if result.ProxyRSSBefore, err = rssOf(serverPID); err != nil {
		return result, err
	}
	queues := make([]string, cfg.scaleQueues)
	for i := range queues {
		queues[i] = fmt.Sprintf("%s%05d", scaleQueuePrefix, i)
	}
	declared := time.Now()
	if err := declareQueues(url, queues, true, nil); err != nil {
		return result, err
	}
	var rows map[string]mirrorQueueRow
	if err := awaitConditionEvery(ctx, scaleTimeout, ctlPoll, "every queue's copies synchronised", func() (bool, error) {
		rows, err = target.rows(ctx)
		return err == nil && allSynchronised(rows, queues), nil
	}); err != nil {
		return result, err
	}
	result.DeclareSeconds = time.Since(declared).Seconds()
	progress("scale: %d queues declared and synchronised in %.1f s", len(queues), result.DeclareSeconds)
	if err := flushAll(ctx, m.plain.Nodes()); err != nil {
		return result, err
	}

	load, err := startScaleLoad(ctx, url, queues, cfg.scaleRate)
	if err != nil {
		return result, err
	}
	defer load.close()
	if !sleepUntil(ctx, time.Now().Add(10*time.Second)) {
		return result, ctx.Err()
	}
	if result.ProxyRSSAfter, err = rssOf(serverPID); err != nil {
		return result, err
	}
	result.ProxyPerQueue = (result.ProxyRSSAfter - result.ProxyRSSBefore) / int64(len(queues))
	result.StateDirBytes = dirSize(filepath.Join(filepath.Dir(m.serverConfigPath), "state"))
	result.PublishRate = cfg.scaleRate

	// The victim masters the most queues.
	if rows, err = target.rows(ctx); err != nil {
		return result, err
	}
	masters := map[string]int{}
	for _, q := range queues {
		masters[rows[q].Master]++
	}
	victim := m.plain.Nodes()[0]
	for _, n := range m.plain.Nodes() {
		if masters[n.Name] > masters[victim.Name] {
			victim = n
		}
	}
	result.KilledNode, result.MastersOnKilled = victim.Name, masters[victim.Name]
	progress("scale: kill -9 %s, master of %d queues", victim.Name, result.MastersOnKilled)
	killedAt := time.Now()
	if err := victim.Kill(); err != nil {
		return result, fmt.Errorf("kill %s: %w", victim.Name, err)
	}
	if err := awaitConditionEvery(ctx, scaleTimeout, ctlPoll, "no queue mastered on the killed node", func() (bool, error) {
		rows, err := target.rows(ctx)
		if err != nil {
			return false, nil // between the kill and the promotions: not yet
		}
		return !slices.ContainsFunc(queues, func(q string) bool { return rows[q].Master == victim.Name }), nil
	}); err != nil {
		return result, err
	}
	result.PromotedSeconds = time.Since(killedAt).Seconds()
	if err := awaitCondition(ctx, scaleTimeout, "every queue's consumer given a message published after the kill", func() (bool, error) {
		return load.resumedAll(killedAt), load.failure()
	}); err != nil {
		return result, err
	}
	resumed := load.resumeTimes(killedAt)
	seconds := func(ns int64) float64 { return time.Duration(ns).Seconds() }
	result.ResumedP50, result.ResumedP99 = seconds(percentile(resumed, 0.50)), seconds(percentile(resumed, 0.99))
	result.ResumedMax = seconds(resumed[len(resumed)-1])
	progress("scale: promoted in %.2f s; every consumer resumed within %.2f s", result.PromotedSeconds, result.ResumedMax)

	load.stopPublishing()
	_ = awaitCondition(ctx, time.Minute, "every confirmed message delivered", func() (bool, error) { return load.undelivered() == 0, nil })
	result.Confirmed, result.Lost = load.confirmedCount(), load.undelivered()
	if err := victim.Restart(ctx); err != nil {
		return result, fmt.Errorf("restart %s: %w", victim.Name, err)
	}
	return result, nil
}

// allSynchronised reports whether each queue has its master and a synchronised slave on
// every other node.
func allSynchronised(rows map[string]mirrorQueueRow, queues []string) bool {
	for _, q := range queues {
		r, ok := rows[q]
		if !ok || r.Master == "" || len(r.Synchronised)+1 < mirroredNodes {
			return false
		}
	}
	return true
}

// rows is every queue amqp-mirror lists, by name.
func (t *mirrorTarget) rows(ctx context.Context) (map[string]mirrorQueueRow, error) {
	cmd := exec.CommandContext(ctx, t.m.binary, "ctl", "list_queues", "--config", t.config, "--formatter", "json",
		"name", "master", "synchronised_slaves")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("amqp-mirror ctl list_queues: %w: %s", err, out)
	}
	var list []mirrorQueueRow
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("amqp-mirror ctl list_queues: %w", err)
	}
	rows := make(map[string]mirrorQueueRow, len(list))
	for _, r := range list {
		rows[r.Name] = r
	}
	return rows, nil
}

// serverProcess is the process running binary under the bench's wrapper shell.
func serverProcess(wrapper int, binary string) (int, error) {
	want, err := filepath.Abs(binary)
	if err != nil {
		return 0, err
	}
	for _, pid := range processTree(wrapper) {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && exe == want {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process of %s under the wrapper (pid %d)", want, wrapper)
}

func rssOf(pid int) (int64, error) {
	mem, err := readMemory(pid)
	return mem.RSS, err
}

// dirSize is the bytes of the regular files under dir.
func dirSize(dir string) int64 {
	var total int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				total += info.Size()
			}
		}
		return nil
	})
	return total
}

// scaleLoad is one publisher that sends to every queue in turn, with confirms, and one
// connection that consumes every queue on one channel, acking each message. Bodies carry
// a sequence number; the load remembers when each was confirmed and which queues got a
// message published after a given time.
type scaleLoad struct {
	pub, sub *amqp.Connection
	stop     chan struct{}
	done     sync.WaitGroup
	queues   int

	mu sync.Mutex
	// publishedAt[seq] is when message seq was published; queueOf[seq] its queue.
	publishedAt []time.Time
	queueOf     []int
	confirmed   map[uint64]bool
	delivered   map[uint64]bool
	// firstAfter[queue] is the first delivery on each queue of a message published at or
	// after since, with since set by resumedAll's first call.
	since      time.Time
	firstAfter map[int]time.Time
	firstFailure
}

func startScaleLoad(ctx context.Context, url string, queues []string, rate float64) (*scaleLoad, error) {
	l := &scaleLoad{queues: len(queues), stop: make(chan struct{}), confirmed: map[uint64]bool{}, delivered: map[uint64]bool{}, firstAfter: map[int]time.Time{}}
	var err error
	if l.sub, err = amqp.Dial(url); err != nil {
		return nil, err
	}
	if l.pub, err = amqp.Dial(url); err != nil {
		l.sub.Close()
		return nil, err
	}
	sub, err := l.sub.Channel()
	if err == nil {
		err = sub.Qos(len(queues)*2, 0, false)
	}
	index := map[string]int{}
	var deliveries []<-chan amqp.Delivery
	for i, q := range queues {
		if err != nil {
			break
		}
		index[q] = i
		var d <-chan amqp.Delivery
		d, err = sub.Consume(q, "", false, false, false, false, nil)
		deliveries = append(deliveries, d)
	}
	pub, pubErr := l.pub.Channel()
	if err == nil && pubErr == nil {
		err = pub.Confirm(false)
	}
	if err = firstError(err, pubErr); err != nil {
		l.close()
		return nil, fmt.Errorf("scale load: %w", err)
	}
	for _, d := range deliveries {
		l.done.Go(func() { l.consume(d) })
	}
	confirms := pub.NotifyPublish(make(chan amqp.Confirmation, 1024))
	l.done.Go(func() {
		for c := range confirms {
			if c.Ack {
				l.mu.Lock()
				l.confirmed[c.DeliveryTag-1] = true
				l.mu.Unlock()
			}
		}
	})
	l.done.Go(func() { l.publish(ctx, pub, queues, rate) })
	return l, nil
}

// firstFailure keeps the first error the goroutines of a load report; the load embeds
// it, so that any goroutine may call fail and the scenario asks failure.
type firstFailure struct{ failed atomic.Pointer[error] }

// fail records err unless an error is recorded already.
func (f *firstFailure) fail(err error) { f.failed.CompareAndSwap(nil, &err) }

// failure is the first error recorded, nil for none.
func (f *firstFailure) failure() error {
	if err := f.failed.Load(); err != nil {
		return *err
	}
	return nil
}

// firstError is the first of errs that is not nil.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (l *scaleLoad) publish(ctx context.Context, ch *amqp.Channel, queues []string, rate float64) {
	pace := newPacer(rate)
	defer pace.stop()
	for seq := uint64(0); ; seq++ {
		if !pace.wait(l.stop) || ctx.Err() != nil {
			return
		}
		queue := int(seq % uint64(len(queues)))
		l.mu.Lock()
		l.publishedAt = append(l.publishedAt, time.Now())
		l.queueOf = append(l.queueOf, queue)
		l.mu.Unlock()
		body := fmt.Appendf(nil, "%d", seq)
		if err := ch.Publish("", queues[queue], false, false, amqp.Publishing{Body: body, DeliveryMode: amqp.Persistent}); err != nil {
			l.fail(fmt.Errorf("publish: %w", err))
			return
		}
	}
}

func (l *scaleLoad) consume(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		var seq uint64
		if _, err := fmt.Sscan(string(d.Body), &seq); err != nil {
			continue
		}
		now := time.Now()
		l.mu.Lock()
		l.delivered[seq] = true
		if int(seq) < len(l.publishedAt) && !l.since.IsZero() && !l.publishedAt[seq].Before(l.since) {
			q := l.queueOf[seq]
			if _, seen := l.firstAfter[q]; !seen {
				l.firstAfter[q] = now
			}
		}
		l.mu.Unlock()
		d.Ack(false)
	}
}

// resumedAll reports whether every queue's consumer got a message published after since.
func (l *scaleLoad) resumedAll(since time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.since.IsZero() {
		l.since = since
	}
	return len(l.firstAfter) == l.queues
}

// resumeTimes is, sorted, each queue's wait in nanoseconds from since to its first
// delivery of a message published after since.
func (l *scaleLoad) resumeTimes(since time.Time) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]int64, 0, len(l.firstAfter))
	for _, at := range l.firstAfter {
		out = append(out, int64(at.Sub(since)))
	}
	slices.Sort(out)
	return out
}

func (l *scaleLoad) stopPublishing() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
}

func (l *scaleLoad) confirmedCount() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(len(l.confirmed))
}

// undelivered counts the confirmed messages no consumer has received.
func (l *scaleLoad) undelivered() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for seq := range l.confirmed {
		if !l.delivered[seq] {
			n++
		}
	}
	return n
}

func (l *scaleLoad) close() {
	l.stopPublishing()
	if l.pub != nil {
		l.pub.Close()
	}
	if l.sub != nil {
		l.sub.Close()
	}
	l.done.Wait()
}

func (r scaleResult) print(out io.Writer) {
	fmt.Fprintf(out, "\nscale: %d durable queues through amqp-mirror serve, each mirrored on three plain nodes (ha-mode all, automatic sync), one consumer each, %.0f persistent msg/s spread over them\n", r.Queues, r.PublishRate)
	fmt.Fprintf(out, "  declared and synchronised in %.1f s; proxy RSS %s with no queue, %s with them (%s per queue); state dir %s\n",
		r.DeclareSeconds, bytesString(r.ProxyRSSBefore), bytesString(r.ProxyRSSAfter), bytesString(r.ProxyPerQueue), bytesString(r.StateDirBytes))
	fmt.Fprintf(out, "  kill -9 of %s, master of %d queues: every master moved after %.2f s; each queue's consumer resumed after p50 %.2f s, p99 %.2f s, max %.2f s\n",
		r.KilledNode, r.MastersOnKilled, r.PromotedSeconds, r.ResumedP50, r.ResumedP99, r.ResumedMax)
	fmt.Fprintf(out, "  %d messages confirmed, %d of them never delivered\n", r.Confirmed, r.Lost)
}
