package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// idleDialers is how many connections the idle scenario opens at once.
const idleDialers = 16

// idleSettle is how long the idle scenario waits after opening connections before it
// reads memory: the proxy and the broker finish their handshakes' work and collect.
const idleSettle = 3 * time.Second

// idleLevel is the memory with count idle connections open through the proxy.
type idleLevel struct {
	Connections int   `json:"connections"`
	ProxyRSS    int64 `json:"proxy_rss_bytes"`
	BrokerRSS   int64 `json:"broker_rss_bytes,omitempty"`
	// Per connection: the growth over the baseline divided by the connections.
	ProxyPerConnection  int64   `json:"proxy_bytes_per_connection"`
	BrokerPerConnection int64   `json:"broker_bytes_per_connection,omitempty"`
	OpenSeconds         float64 `json:"open_seconds"`
}

// idleSample is the proxy's resident set some time after the connections closed.
type idleSample struct {
	After    float64 `json:"seconds_after_close"`
	ProxyRSS int64   `json:"proxy_rss_bytes"`
}

// idleResult is the idle scenario's outcome for one proxy.
type idleResult struct {
	Target            string       `json:"target"`
	ProxyBaselineRSS  int64        `json:"proxy_baseline_rss_bytes"`
	BrokerBaselineRSS int64        `json:"broker_baseline_rss_bytes,omitempty"`
	Levels            []idleLevel  `json:"levels"`
	AfterClose        []idleSample `json:"after_close"`
}

// runIdle opens rising numbers of idle amqp091-go connections through a fresh proxy
// process, reads the resident sets of the proxy and the broker at each level, closes
// them all and watches how fast the proxy gives its memory back.
func runIdle(ctx context.Context, cfg config, b broker, target string) (idleResult, error) {
	result := idleResult{Target: target}
	raiseFileLimit()
	var p *proxyProcess
	var err error
	if target == "baseline" {
		p, err = startProxyCommand(ctx, cfg, cfg.baselineCmd, b.addr)
	} else {
		p, err = startProxy(ctx, cfg, b.addr, "")
	}
	if err != nil {
		return result, err
	}
	defer func() {
		if err := p.stop(); err != nil {
			progress("  %v", err)
		}
	}()
	url := proxyURL(b.url, p.addr)
	if !sleepUntil(ctx, time.Now().Add(time.Second)) {
		return result, ctx.Err()
	}
	base, err := readMemory(p.pid())
	if err != nil {
		return result, fmt.Errorf("proxy memory: %w", err)
	}
	result.ProxyBaselineRSS = base.RSS
	if b.pid != 0 {
		m, err := readMemory(b.pid)
		if err != nil {
			return result, fmt.Errorf("broker memory: %w", err)
		}
		result.BrokerBaselineRSS = m.RSS
	}

	var conns []*amqp.Connection
	closeAll := func() {
		closeConnections(conns)
		conns = nil
	}
	defer func() { closeAll() }()

	for _, count := range cfg.idleCounts {
		progress("idle: opening %d connections through %s", count, target)
		began := time.Now()
		opened, err := openIdle(ctx, url, count-len(conns))
		conns = append(conns, opened...)
		if err != nil {
			return result, fmt.Errorf("with %d open: %w", len(conns), err)
		}
		level := idleLevel{Connections: count, OpenSeconds: time.Since(began).Seconds()}
		if !sleepUntil(ctx, time.Now().Add(idleSettle)) {
			return result, ctx.Err()
		}
		m, err := readMemory(p.pid())
		if err != nil {
			return result, fmt.Errorf("proxy memory: %w", err)
		}
		level.ProxyRSS = m.RSS
		level.ProxyPerConnection = (m.RSS - base.RSS) / int64(count)
		if b.pid != 0 {
			if m, err := readMemory(b.pid); err == nil {
				level.BrokerRSS = m.RSS
				level.BrokerPerConnection = (m.RSS - result.BrokerBaselineRSS) / int64(count)
			}
		}
		result.Levels = append(result.Levels, level)
		progress("  proxy %s (%s per connection), broker %s (%s per connection)",
			bytesString(level.ProxyRSS), bytesString(level.ProxyPerConnection),
			bytesString(level.BrokerRSS), bytesString(level.BrokerPerConnection))
	}

	progress("idle: closing %d connections, then watching the proxy's memory for %v", len(conns), cfg.idleLinger)
	closeAll()
	closed := time.Now()
	for _, after := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, cfg.idleLinger} {
		if after > cfg.idleLinger {
			continue
		}
		if !sleepUntil(ctx, closed.Add(after)) {
			return result, ctx.Err()
		}
		m, err := readMemory(p.pid())
		if err != nil {
			return result, fmt.Errorf("proxy memory: %w", err)
		}
		if n := len(result.AfterClose); n > 0 && result.AfterClose[n-1].After == after.Seconds() {
			continue
		}
		result.AfterClose = append(result.AfterClose, idleSample{After: after.Seconds(), ProxyRSS: m.RSS})
	}
	return result, nil
}

// openIdle opens n amqp091-go connections to url, idleDialers at a time.
func openIdle(ctx context.Context, url string, n int) ([]*amqp.Connection, error) {
	var mu sync.Mutex
	var conns []*amqp.Connection
	var errs []error
	work := make(chan int)
	var wg sync.WaitGroup
	for range idleDialers {
		wg.Go(func() {
			for i := range work {
				c, err := dial(url, fmt.Sprintf("bench idle %d", i), nil)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					conns = append(conns, c)
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		mu.Lock()
		failed := len(errs) > 0
		mu.Unlock()
		if failed || ctx.Err() != nil {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		return conns, fmt.Errorf("%d connections failed, the first: %w", len(errs), errs[0])
	}
	return conns, ctx.Err()
}

// raiseFileLimit lifts the soft limit on open files to the hard one: the bench holds
// one socket per idle connection. Go's runtime does this at start on Linux already;
// doing it here says why the scenario needs it.
func raiseFileLimit() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}

func (r *idleResult) print(out io.Writer) {
	fmt.Fprintf(out, "\nidle via %s: amqp091-go connections held open through it, no channels (RSS; per connection = growth over the baseline / connections)\n", r.Target)
	fmt.Fprintf(out, "  baseline: proxy %s, broker %s\n", bytesString(r.ProxyBaselineRSS), bytesString(r.BrokerBaselineRSS))
	for _, l := range r.Levels {
		fmt.Fprintf(out, "  %5d connections (opened in %.1fs): proxy %s = %s per connection; broker %s = %s per connection\n",
			l.Connections, l.OpenSeconds, bytesString(l.ProxyRSS), bytesString(l.ProxyPerConnection),
			bytesString(l.BrokerRSS), bytesString(l.BrokerPerConnection))
	}
	for _, s := range r.AfterClose {
		fmt.Fprintf(out, "  %4.0fs after they closed: proxy %s\n", s.After, bytesString(s.ProxyRSS))
	}
}
