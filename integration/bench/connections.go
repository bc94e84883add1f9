package main

// The connections scenario: what client connections cost a mirroring proxy. amqp-mirror
// serve fronts three plain nodes with -conns-queues durable queues mirrored on all three.
// The scenario opens -conns-idle amqp091-go connections that only hold their socket (each
// is one link to its home broker), reads the proxy's resident set, open files and CPU, and
// then opens -conns-active connections that work: half publish persistent messages with
// confirms to the queues in turn, -conns-rate in all, half consume them with manual acks.
// A working connection opens a link to every broker that holds a copy of its queue, so the
// figures per active connection include three links. It reads the same figures again over
// a -duration window, with the brokers' resident sets, and the confirm latency.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// connsQueuePrefix names the scenario's queues; serverConfig's policy mirrors "^bench-".
const connsQueuePrefix = "bench-conns-"

// connsBodySize is each message's body: light traffic, so that the cost is the
// connections' and not the bytes'.
const connsBodySize = 256

// connsLevel is what the proxy and the brokers hold at one step of the scenario.
type connsLevel struct {
	Idle   int `json:"idle_connections"`
	Active int `json:"active_connections"`
	// OpenSeconds is how long this step took to open its connections.
	OpenSeconds float64 `json:"open_seconds"`
	ProxyRSS    int64   `json:"proxy_rss_bytes"`
	ProxyFiles  int     `json:"proxy_open_files"`
	BrokersRSS  int64   `json:"brokers_rss_bytes"`
	// ProxyCPU and BrokersCPU are the share of one core used over the window.
	ProxyCPU   float64 `json:"proxy_cpu_cores"`
	BrokersCPU float64 `json:"brokers_cpu_cores"`
	// Consumed is the messages per second consumers received over the window.
	Consumed float64 `json:"consumed_per_second"`
	// ConfirmP50 and ConfirmP99 are publish-to-confirm latencies in the window.
	ConfirmP50 time.Duration `json:"confirm_p50_ns"`
	ConfirmP99 time.Duration `json:"confirm_p99_ns"`
}

// connsResult is the connections scenario's outcome: a level before any connection, one
// with the idle connections, and one with the active connections added.
type connsResult struct {
	Queues int          `json:"queues"`
	Rate   float64      `json:"published_per_second"`
	Window float64      `json:"window_seconds"`
	Levels []connsLevel `json:"levels"`
}

// connsWatch is what the scenario reads its figures from.
type connsWatch struct {
	proxy   int   // the amqp-mirror serve process
	brokers []int // the plain nodes' processes
	window  time.Duration
}

// runConnections runs the connections scenario, stopping what it started however it
// returns.
func runConnections(ctx context.Context, cfg config, logger *slog.Logger) (result connsResult, err error) {
	if err := raiseFileLimitTo(uint64(2*cfg.connsIdle + 5*cfg.connsActive + 1000)); err != nil {
		return result, err
	}
	setup, err := startPlainMirror(ctx, cfg, logger, "connections")
	if err != nil {
		return result, err
	}
	defer setup.close()
	m, url := setup.m, setup.url
	watch := connsWatch{proxy: setup.pid, brokers: pids(m.plain), window: cfg.duration}
	result = connsResult{Queues: cfg.connsQueues, Rate: cfg.connsRate, Window: cfg.duration.Seconds()}
	queues, err := declareMirrored(ctx, m, url, cfg.connsQueues)
	if err != nil {
		return result, err
	}
	return result, measureConnections(ctx, cfg, watch, url, queues, &result)
}

// measureConnections reads the three levels: none, idle, idle and active.
func measureConnections(ctx context.Context, cfg config, watch connsWatch, url string, queues []string, result *connsResult) error {
	level, err := watch.read(ctx, connsLevel{}, nil)
	if err != nil {
		return err
	}
	result.Levels = append(result.Levels, level)

	progress("connections: opening %d idle connections", cfg.connsIdle)
	began := time.Now()
	idle, err := openIdle(ctx, url, cfg.connsIdle)
	defer closeConnections(idle)
	if err != nil {
		return fmt.Errorf("idle connections: %w", err)
	}
	level, err = watch.read(ctx, connsLevel{Idle: len(idle), OpenSeconds: time.Since(began).Seconds()}, nil)
	if err != nil {
		return err
	}
	result.Levels = append(result.Levels, level)

	progress("connections: opening %d active connections", cfg.connsActive)
	began = time.Now()
	load, err := startConnsLoad(ctx, url, queues, cfg.connsActive, cfg.connsRate)
	defer load.close()
	if err != nil {
		return fmt.Errorf("active connections: %w", err)
	}
	level, err = watch.read(ctx, connsLevel{Idle: len(idle), Active: cfg.connsActive, OpenSeconds: time.Since(began).Seconds()}, load)
	if err != nil {
		return err
	}
	result.Levels = append(result.Levels, level)
	return load.failure()
}

// declareMirrored declares n durable queues through the proxy and waits until each has a
// synchronised copy on every node.
func declareMirrored(ctx context.Context, m *mirroredBench, url string, n int) ([]string, error) {
	queues := make([]string, n)
	for i := range queues {
		queues[i] = fmt.Sprintf("%s%04d", connsQueuePrefix, i)
	}
	if err := declareQueues(url, queues, true, nil); err != nil {
		return nil, err
	}
	target := &mirrorTarget{m: m, config: m.serverConfigPath}
	err := awaitConditionEvery(ctx, scaleTimeout, ctlPoll, "every queue's copies synchronised", func() (bool, error) {
		rows, err := target.rows(ctx)
		return err == nil && allSynchronised(rows, queues), nil
	})
	return queues, err
}

// read settles, then reads the processes over one window into level. With a load, it
// also counts what the load consumed and its confirm latencies in that window.
func (w connsWatch) read(ctx context.Context, level connsLevel, load *connsLoad) (connsLevel, error) {
	if !sleepUntil(ctx, time.Now().Add(idleSettle)) {
		return level, ctx.Err()
	}
	procs := append([]int{w.proxy}, w.brokers...)
	cpuBefore, err := cpuTimes(procs)
	if err != nil {
		return level, err
	}
	began := time.Now()
	load.beginWindow()
	if !sleepUntil(ctx, began.Add(w.window)) {
		return level, ctx.Err()
	}
	consumed, latencies := load.endWindow()
	elapsed := time.Since(began)
	cpuAfter, err := cpuTimes(procs)
	if err != nil {
		return level, err
	}
	level.ProxyCPU = (cpuAfter[0] - cpuBefore[0]).Seconds() / elapsed.Seconds()
	for i := 1; i < len(procs); i++ {
		level.BrokersCPU += (cpuAfter[i] - cpuBefore[i]).Seconds() / elapsed.Seconds()
	}
	level.Consumed = float64(consumed) / elapsed.Seconds()
	if len(latencies) > 0 {
		slices.Sort(latencies)
		level.ConfirmP50 = time.Duration(percentile(latencies, 0.50))
		level.ConfirmP99 = time.Duration(percentile(latencies, 0.99))
	}
	return level, w.readMemory(&level)
}

// readMemory fills in the resident sets and the proxy's open files.
func (w connsWatch) readMemory(level *connsLevel) error {
	var err error
	if level.ProxyRSS, err = rssOf(w.proxy); err != nil {
		return fmt.Errorf("proxy memory: %w", err)
	}
	if level.ProxyFiles, err = openFiles(w.proxy); err != nil {
		return fmt.Errorf("proxy open files: %w", err)
	}
	for _, pid := range w.brokers {
		rss, err := rssOf(pid)
		if err != nil {
			return fmt.Errorf("broker memory: %w", err)
		}
		level.BrokersRSS += rss
	}
	return nil
}

// cpuTimes is each process's user and system time.
func cpuTimes(procs []int) ([]time.Duration, error) {
	out := make([]time.Duration, len(procs))
	for i, pid := range procs {
		t, err := cpuTime(pid)
		if err != nil {
			return nil, fmt.Errorf("cpu time of %d: %w", pid, err)
		}
		out[i] = t
	}
	return out, nil
}

// openFiles counts a process's open file descriptors.
func openFiles(pid int) (int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(entries), err
}

// raiseFileLimitTo lifts the limit on open files to at least n for the bench and the
// processes it starts: the proxy holds a socket per client connection and one per link,
// and the home broker one per idle connection. Without the privilege to raise the hard
// limit, the soft one goes up to it, and a hard limit below n is an error that says so.
func raiseFileLimitTo(n uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("read the open files limit: %w", err)
	}
	if lim.Cur >= n {
		return nil
	}
	if lim.Max < n {
		raised := syscall.Rlimit{Cur: n, Max: n}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			return nil
		}
		return fmt.Errorf("the scenario needs about %d open files and the hard limit is %d, which this process may not raise: "+
			"lower -conns-idle (two files each) or -conns-active (about five each)", n, lim.Max)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raise the open files limit to %d: %w", n, err)
	}
	return nil
}

// closeConnections closes conns, idleDialers at a time.
func closeConnections(conns []*amqp.Connection) {
	work := make(chan *amqp.Connection)
	var wg sync.WaitGroup
	for range idleDialers {
		wg.Go(func() {
			for c := range work {
				c.Close()
			}
		})
	}
	for _, c := range conns {
		work <- c
	}
	close(work)
	wg.Wait()
}

// connsLoad is the active connections: publishers that each publish to one queue at an
// even share of the rate and wait for each confirm, and consumers that each consume one
// queue with manual acks.
type connsLoad struct {
	conns []*amqp.Connection
	stop  chan struct{}
	done  sync.WaitGroup

	consumed atomic.Int64
	firstFailure

	mu sync.Mutex // guards the window's fields
	// windowFrom is the consumed count when the window began; latencies are the
	// window's confirm latencies in nanoseconds, nil outside a window.
	windowFrom int64
	latencies  []int64
	inWindow   bool
}

// startConnsLoad opens n connections, half publishing and half consuming, and starts
// them. On an error it returns the load opened so far, for the caller to close.
func startConnsLoad(ctx context.Context, url string, queues []string, n int, rate float64) (*connsLoad, error) {
	l := &connsLoad{stop: make(chan struct{})}
	conns, err := openIdle(ctx, url, n)
	l.conns = conns
	if err != nil {
		return l, err
	}
	publishers := n / 2
	interval := time.Duration(float64(time.Second) * float64(publishers) / rate)
	for i, conn := range conns {
		queue := queues[i/2%len(queues)]
		ch, err := conn.Channel()
		if err != nil {
			return l, fmt.Errorf("channel %d: %w", i, err)
		}
		if i%2 == 0 {
			offset := interval * time.Duration(i/2) / time.Duration(max(publishers, 1))
			err = l.startPublisher(ch, queue, interval, offset)
		} else {
			err = l.startConsumer(ch, queue)
		}
		if err != nil {
			return l, fmt.Errorf("connection %d on %s: %w", i, queue, err)
		}
	}
	return l, nil
}

// startPublisher publishes on ch every interval, the first time after offset: the
// publishers' offsets spread them over one interval, so that the load is even.
func (l *connsLoad) startPublisher(ch *amqp.Channel, queue string, interval, offset time.Duration) error {
	if err := ch.Confirm(false); err != nil {
		return err
	}
	body := make([]byte, connsBodySize)
	l.done.Go(func() {
		select {
		case <-l.stop:
			return
		case <-time.After(offset):
		}
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-ticker.C:
			}
			if err := l.publishOne(ch, queue, body); err != nil {
				l.fail(err)
				return
			}
		}
	})
	return nil
}

// publishOne publishes one persistent message and waits for its confirm.
func (l *connsLoad) publishOne(ch *amqp.Channel, queue string, body []byte) error {
	began := time.Now()
	confirm, err := ch.PublishWithDeferredConfirm("", queue, false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
	if err != nil {
		return fmt.Errorf("publish to %s: %w", queue, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acked, err := confirm.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("confirm from %s: %w", queue, err)
	}
	if !acked {
		return fmt.Errorf("publish to %s nacked", queue)
	}
	l.mu.Lock()
	if l.inWindow {
		l.latencies = append(l.latencies, int64(time.Since(began)))
	}
	l.mu.Unlock()
	return nil
}

func (l *connsLoad) startConsumer(ch *amqp.Channel, queue string) error {
	if err := ch.Qos(16, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	l.done.Go(func() {
		for d := range deliveries {
			if err := d.Ack(false); err != nil {
				l.fail(fmt.Errorf("ack on %s: %w", queue, err))
				return
			}
			l.consumed.Add(1)
		}
	})
	return nil
}

// beginWindow starts counting; a nil load counts nothing.
func (l *connsLoad) beginWindow() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.windowFrom, l.latencies, l.inWindow = l.consumed.Load(), nil, true
}

// endWindow returns what was consumed since beginWindow, and the confirm latencies.
func (l *connsLoad) endWindow() (consumed int64, latencies []int64) {
	if l == nil {
		return 0, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inWindow = false
	return l.consumed.Load() - l.windowFrom, l.latencies
}

// close stops the publishers and closes every connection, which ends the consumers.
func (l *connsLoad) close() {
	close(l.stop)
	closeConnections(l.conns)
	l.done.Wait()
}

func (r connsResult) print(out io.Writer) {
	fmt.Fprintf(out, "\nconnections: amqp091-go connections through amqp-mirror serve, %d queues mirrored on %d plain nodes; "+
		"active ones publish %.0f msg/s in all (%d B, persistent, confirmed one by one) and consume with manual acks; "+
		"figures over a %.0f s window\n", r.Queues, mirroredNodes, r.Rate, connsBodySize, r.Window)
	fmt.Fprintln(out, "| idle | active | opened in | proxy RSS | per connection | proxy open files | proxy CPU | brokers' RSS | per connection | brokers' CPU | consumed/s | confirm p50 | p99 |")
	fmt.Fprintln(out, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for i, l := range r.Levels {
		perProxy, perBrokers := "–", "–"
		if i > 0 {
			prev := r.Levels[i-1]
			added := int64(l.Idle + l.Active - prev.Idle - prev.Active)
			perProxy = bytesString((l.ProxyRSS - prev.ProxyRSS) / max(added, 1))
			perBrokers = bytesString((l.BrokersRSS - prev.BrokersRSS) / max(added, 1))
		}
		fmt.Fprintf(out, "| %d | %d | %.1f s | %s | %s | %d | %.1f%% | %s | %s | %.1f%% | %.0f | %s | %s |\n",
			l.Idle, l.Active, l.OpenSeconds, bytesString(l.ProxyRSS), perProxy, l.ProxyFiles, 100*l.ProxyCPU,
			bytesString(l.BrokersRSS), perBrokers, 100*l.BrokersCPU, l.Consumed,
			latencyString(l.ConfirmP50), latencyString(l.ConfirmP99))
	}
	if n := len(r.Levels); n == 3 && r.Levels[2].Consumed > 0 {
		active := r.Levels[2]
		idle := r.Levels[1]
		fmt.Fprintf(out, "  the active connections' proxy CPU: %.1f µs per consumed message over what the idle ones use\n",
			1e6*(active.ProxyCPU-idle.ProxyCPU)/active.Consumed)
	}
}

// latencyString is d in milliseconds, or "–" for none.
func latencyString(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}
