package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
)

// latency is one latency distribution, in milliseconds.
type latency struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
}

// summarize merges the samples (nanoseconds) and takes exact percentiles.
func summarize(parts ...[]int64) latency {
	var all []int64
	for _, p := range parts {
		all = append(all, p...)
	}
	if len(all) == 0 {
		return latency{}
	}
	slices.Sort(all)
	return latency{
		Samples: len(all),
		P50:     ms(percentile(all, 0.50)),
		P99:     ms(percentile(all, 0.99)),
		Max:     ms(all[len(all)-1]),
	}
}

// percentile is the nearest-rank percentile of sorted samples.
func percentile(sorted []int64, q float64) int64 {
	rank := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

// runResult is one measured run.
type runResult struct {
	Scenario string `json:"scenario"`
	Target   string `json:"target"`
	Run      int    `json:"run"`
	// Copies is how many brokers held each of the run's queues (mirrored scenario).
	Copies      int     `json:"copies,omitempty"`
	Seconds     float64 `json:"seconds"`
	Published   int64   `json:"published"`
	Consumed    int64   `json:"consumed"`
	Nacked      int64   `json:"nacked"`
	PublishRate float64 `json:"published_per_second"`
	ConsumeRate float64 `json:"consumed_per_second"`
	Confirm     latency `json:"publish_to_confirm"`
	Deliver     latency `json:"publish_to_delivery"`
	CPU         cpuUse  `json:"cpu"`
	// The proxy's read and write system calls per consumed message (each message is
	// published, delivered, acked and confirmed through it).
	ProxyReadsPerMessage  float64 `json:"proxy_reads_per_message,omitempty"`
	ProxyWritesPerMessage float64 `json:"proxy_writes_per_message,omitempty"`
	// Whole is the run from the clients' start to the end of the work they left.
	Whole wholeRun `json:"whole_run"`
}

// wholeRun measures a run from its first publish to the end of the work it left
// behind: warm-up, measured time, the drain of outstanding confirms and deliveries, and
// the settle (the slaves' trimming). The measured window shows the rate a steady load
// holds; the whole run shows what each message cost in the end, work deferred past the
// window included.
type wholeRun struct {
	Seconds       float64 `json:"seconds"`
	SettleSeconds float64 `json:"settle_seconds"`
	Consumed      int64   `json:"consumed"`
	// CPU time per consumed message, in microseconds: the proxy's process (its
	// trimmers included) and the brokers'.
	ProxyCPUPerMessage  float64 `json:"proxy_cpu_us_per_message"`
	BrokerCPUPerMessage float64 `json:"broker_cpu_us_per_message"`
	// BusiestBrokerCPUPerMessage is the CPU per message of the broker that used the
	// most: with each broker on a machine of its own, it is the one that sets the rate.
	// EachBrokerCPUPerMessage is every broker's, in the order of the row's nodes.
	BusiestBrokerCPUPerMessage float64   `json:"busiest_broker_cpu_us_per_message"`
	EachBrokerCPUPerMessage    []float64 `json:"each_broker_cpu_us_per_message,omitempty"`
}

// measure fills in the whole run between two snapshots.
func (w *wholeRun) measure(procs watched, from, to cpuSnapshot) {
	w.Seconds = to.at.Sub(from.at).Seconds()
	if w.Consumed == 0 {
		return
	}
	use := procs.between(from, to)
	w.ProxyCPUPerMessage = use.Proxy * w.Seconds / float64(w.Consumed) * 1e6
	w.BrokerCPUPerMessage = use.Broker * w.Seconds / float64(w.Consumed) * 1e6
	w.EachBrokerCPUPerMessage = nil
	w.BusiestBrokerCPUPerMessage = 0
	for _, used := range eachBroker(from, to) {
		perMessage := used.Seconds() / float64(w.Consumed) * 1e6
		w.EachBrokerCPUPerMessage = append(w.EachBrokerCPUPerMessage, perMessage)
		w.BusiestBrokerCPUPerMessage = max(w.BusiestBrokerCPUPerMessage, perMessage)
	}
}

func (r runResult) oneLine() string {
	return fmt.Sprintf("%.0f msg/s consumed, %.0f published; confirm p50 %.2f p99 %.2f ms; delivery p50 %.2f p99 %.2f ms",
		r.ConsumeRate, r.PublishRate, r.Confirm.P50, r.Confirm.P99, r.Deliver.P50, r.Deliver.P99)
}

// median combines runs of one scenario and target metric by metric.
func median(runs []runResult) runResult {
	pick := func(f func(runResult) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if n := len(v); n%2 == 0 {
			return (v[n/2-1] + v[n/2]) / 2
		}
		return v[len(v)/2]
	}
	return runResult{
		Scenario:              runs[0].Scenario,
		Target:                runs[0].Target,
		ConsumeRate:           pick(func(r runResult) float64 { return r.ConsumeRate }),
		PublishRate:           pick(func(r runResult) float64 { return r.PublishRate }),
		ProxyReadsPerMessage:  pick(func(r runResult) float64 { return r.ProxyReadsPerMessage }),
		ProxyWritesPerMessage: pick(func(r runResult) float64 { return r.ProxyWritesPerMessage }),
		Confirm: latency{
			P50: pick(func(r runResult) float64 { return r.Confirm.P50 }),
			P99: pick(func(r runResult) float64 { return r.Confirm.P99 }),
			Max: pick(func(r runResult) float64 { return r.Confirm.Max }),
		},
		Deliver: latency{
			P50: pick(func(r runResult) float64 { return r.Deliver.P50 }),
			P99: pick(func(r runResult) float64 { return r.Deliver.P99 }),
			Max: pick(func(r runResult) float64 { return r.Deliver.Max }),
		},
		CPU: cpuUse{
			Broker: pick(func(r runResult) float64 { return r.CPU.Broker }),
			Proxy:  pick(func(r runResult) float64 { return r.CPU.Proxy }),
			Load:   pick(func(r runResult) float64 { return r.CPU.Load }),
			Other:  pick(func(r runResult) float64 { return r.CPU.Other }),
		},
		Whole: wholeRun{
			Seconds:             pick(func(r runResult) float64 { return r.Whole.Seconds }),
			SettleSeconds:       pick(func(r runResult) float64 { return r.Whole.SettleSeconds }),
			ProxyCPUPerMessage:  pick(func(r runResult) float64 { return r.Whole.ProxyCPUPerMessage }),
			BrokerCPUPerMessage: pick(func(r runResult) float64 { return r.Whole.BrokerCPUPerMessage }),
			BusiestBrokerCPUPerMessage: pick(func(r runResult) float64 {
				return r.Whole.BusiestBrokerCPUPerMessage
			}),
		},
	}
}

// comparison is a scenario's median through one forwarder against its direct median.
type comparison struct {
	Scenario string    `json:"scenario"`
	Target   string    `json:"target"`
	Direct   runResult `json:"direct_median"`
	Proxy    runResult `json:"target_median"`
	// ThroughputRatio is target/direct of messages consumed per second.
	ThroughputRatio float64 `json:"throughput_ratio"`
	// The deltas are target minus direct, in milliseconds.
	ConfirmP50Delta float64 `json:"confirm_p50_delta_ms"`
	ConfirmP99Delta float64 `json:"confirm_p99_delta_ms"`
	DeliverP50Delta float64 `json:"delivery_p50_delta_ms"`
	DeliverP99Delta float64 `json:"delivery_p99_delta_ms"`
	// ProxyCPUPerMessage is the forwarder's CPU time per consumed message, in
	// microseconds: each message crosses it twice (publish in, delivery out) plus an ack
	// and a confirm.
	ProxyCPUPerMessage float64 `json:"forwarder_cpu_us_per_message"`
}

func compare(runs []runResult) []comparison {
	var out []comparison
	type key struct{ scenario, target string }
	var keys []key
	for _, r := range runs {
		if k := (key{r.Scenario, r.Target}); r.Target != "direct" && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		var direct, through []runResult
		for _, r := range runs {
			switch {
			case r.Scenario != k.scenario:
			case r.Target == "direct":
				direct = append(direct, r)
			case r.Target == k.target:
				through = append(through, r)
			}
		}
		if len(direct) == 0 || len(through) == 0 {
			continue
		}
		d, p := median(direct), median(through)
		c := comparison{
			Scenario: k.scenario, Target: k.target, Direct: d, Proxy: p,
			ConfirmP50Delta: p.Confirm.P50 - d.Confirm.P50,
			ConfirmP99Delta: p.Confirm.P99 - d.Confirm.P99,
			DeliverP50Delta: p.Deliver.P50 - d.Deliver.P50,
			DeliverP99Delta: p.Deliver.P99 - d.Deliver.P99,
		}
		if d.ConsumeRate > 0 {
			c.ThroughputRatio = p.ConsumeRate / d.ConsumeRate
		}
		if p.ConsumeRate > 0 {
			c.ProxyCPUPerMessage = p.CPU.Proxy / p.ConsumeRate * 1e6
		}
		out = append(out, c)
	}
	return out
}

// backpressureResult is the rss scenario's outcome.
type backpressureResult struct {
	Messages     int     `json:"messages"`
	MessageBytes int     `json:"message_bytes"`
	FillSeconds  float64 `json:"fill_seconds"`
	// Resident set sizes of the proxy process, bytes.
	BaselineRSS   int64 `json:"baseline_rss_bytes"`
	StallPeakRSS  int64 `json:"stall_peak_rss_bytes"`
	StallEndRSS   int64 `json:"stall_end_rss_bytes"`
	DrainPeakRSS  int64 `json:"drain_peak_rss_bytes"`
	KernelPeakRSS int64 `json:"kernel_peak_rss_bytes"` // VmHWM over the proxy's life
	Samples       int   `json:"samples"`
	// InFlight is where the stalled messages' bytes sat at the end of the stall: socket
	// queues of the consumer's connection (client receive, proxy send) and of the
	// proxy's backend connection (proxy receive, broker send), from /proc/net/tcp.
	InFlight     socketQueues `json:"in_flight_at_stall_end"`
	StallSeconds float64      `json:"stall_seconds"`
	DrainSeconds float64      `json:"drain_seconds"`
	Delivered    int          `json:"delivered"`
}

// report is everything one bench run found.
type report struct {
	Config       map[string]string   `json:"config"`
	Runs         []runResult         `json:"runs"`
	Comparisons  []comparison        `json:"comparisons"`
	Backpressure *backpressureResult `json:"backpressure,omitempty"`
	Idle         []idleResult        `json:"idle,omitempty"`
	// Mirrored are the mirrored scenario's runs, Declares its queue.declare rates.
	Mirrored []runResult     `json:"mirrored,omitempty"`
	Declares []declareResult `json:"declares,omitempty"`
	// Failover is the failover scenario's rows.
	Failover []failoverResult `json:"failover,omitempty"`
	// Timelines are the report scenario's master kills.
	Timelines []timelineResult `json:"timelines,omitempty"`
	// Scale is the scale scenario's outcome.
	Scale *scaleResult `json:"scale,omitempty"`
	// Connections is the connections scenario's outcome.
	Connections *connsResult `json:"connections,omitempty"`
	// Backlog is the backlog scenario's outcome.
	Backlog *backlogResult `json:"backlog,omitempty"`
	// Sync is the sync scenario's rows.
	Sync    []syncResult `json:"sync,omitempty"`
	Elapsed string       `json:"elapsed"`
}

func describeConfig(cfg config) map[string]string {
	return map[string]string{
		"scenarios":        strings.Join(cfg.scenarios, ","),
		"rounds":           fmt.Sprint(cfg.rounds),
		"publishers":       fmt.Sprint(cfg.publishers),
		"consumers":        fmt.Sprint(cfg.consumers),
		"confirm_window":   fmt.Sprint(cfg.confirmWindow),
		"prefetch":         fmt.Sprint(cfg.prefetch),
		"multi_ack":        fmt.Sprint(cfg.multiAck),
		"size":             fmt.Sprint(cfg.size),
		"targets":          strings.Join(cfg.targets, ","),
		"baseline_cmd":     cfg.baselineCmd,
		"warmup":           cfg.warmup.String(),
		"duration":         cfg.duration.String(),
		"light_rate":       fmt.Sprint(cfg.lightRate),
		"light_duration":   cfg.lightDuration.String(),
		"proxy_cmd":        cfg.proxyCmd,
		"proxy_gomaxprocs": fmt.Sprint(cfg.proxyGOMAXPROCS),
		"broker":           orDefault(cfg.amqpURL, "harness"),
	}
}

func orDefault(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (r *report) print(out io.Writer, cfg config) error {
	r.Comparisons = compare(r.Runs)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	if len(r.Runs) > 0 {
		fmt.Fprintln(out)
		if cfg.has("full") || cfg.has("full-raw") || cfg.has("report") {
			fmt.Fprintf(out, "full: amqp091-go, %d publishers (confirm window %d), %d consumers (prefetch %d, %s), %d B persistent, %v after %v warm-up\n",
				cfg.publishers, cfg.confirmWindow, cfg.consumers, cfg.prefetch, ackMode(cfg.multiAck), cfg.size, cfg.duration, cfg.warmup)
		}
		if cfg.has("full-raw") {
			fmt.Fprintf(out, "full-raw: as full, with the bench's raw AMQP client (writes flushed when its reader runs dry) instead of amqp091-go\n")
		}
		if cfg.has("light") {
			fmt.Fprintf(out, "light: 1 publisher waiting for each confirm, at most %.0f msg/s, 1 consumer, %d B persistent, %v after %v warm-up\n",
				cfg.lightRate, cfg.size, cfg.lightDuration, cfg.lightWarmup)
		}
		fmt.Fprintf(out, "latencies in ms; cpu in cores busy during the measured time (other: the rest of the machine)\n\n")
		fmt.Fprintln(w, "scenario\ttarget\trun\tconsumed/s\tpublished/s\tconfirm p50\tp99\tdelivery p50\tp99\tcpu broker\tproxy\tbench\tother\t")
		for _, run := range r.Runs {
			fmt.Fprintf(w, "%s\t%s\t%d\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%.2f\t%.2f\t\n",
				run.Scenario, run.Target, run.Run, run.ConsumeRate, run.PublishRate,
				run.Confirm.P50, run.Confirm.P99, run.Deliver.P50, run.Deliver.P99,
				brokerCPU(run, cfg), proxyCPU(run), run.CPU.Load, run.CPU.Other)
		}
		fmt.Fprintln(w, "\t\t\t\t\t\t\t\t\t\t\t\t\t")
		fmt.Fprintln(w, "scenario\tmedian of\t\tconsumed/s\tpublished/s\tconfirm p50\tp99\tdelivery p50\tp99\tcpu broker\tproxy\tbench\tother\t")
		for i, c := range r.Comparisons {
			ms := []runResult{c.Proxy}
			if i == 0 || r.Comparisons[i-1].Scenario != c.Scenario {
				ms = []runResult{c.Direct, c.Proxy}
			}
			for _, m := range ms {
				fmt.Fprintf(w, "%s\t%s\t\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%.2f\t%.2f\t\n",
					m.Scenario, m.Target, m.ConsumeRate, m.PublishRate,
					m.Confirm.P50, m.Confirm.P99, m.Deliver.P50, m.Deliver.P99, brokerCPU(m, cfg), proxyCPU(m), m.CPU.Load, m.CPU.Other)
			}
			fmt.Fprintf(w, "%s\t%s vs direct\t\t%.2fx\t%.2fx\t%+.2f\t%+.2f\t%+.2f\t%+.2f\t\t\t\t\t\n",
				c.Scenario, c.Target, c.ThroughputRatio, ratio(c.Proxy.PublishRate, c.Direct.PublishRate),
				c.ConfirmP50Delta, c.ConfirmP99Delta, c.DeliverP50Delta, c.DeliverP99Delta)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(out)
		for _, c := range r.Comparisons {
			fmt.Fprintf(out, "%s via %s: %.2fx direct; forwarder CPU %.1f µs, %.2f reads and %.2f writes (system calls) per consumed message\n",
				c.Scenario, c.Target, c.ThroughputRatio, c.ProxyCPUPerMessage, c.Proxy.ProxyReadsPerMessage, c.Proxy.ProxyWritesPerMessage)
		}
	}
	if b := r.Backpressure; b != nil {
		fmt.Fprintf(out, "\nrss: %d x %s queued in %.1fs; consumer through the proxy stalled %.1fs, then drained %d messages in %.1fs\n",
			b.Messages, bytesString(int64(b.MessageBytes)), b.FillSeconds, b.StallSeconds, b.Delivered, b.DrainSeconds)
		fmt.Fprintf(out, "proxy RSS: baseline %s, peak while stalled %s (%s at the end of the stall), peak while draining %s, kernel high-water mark %s (%d samples at 100 ms)\n",
			bytesString(b.BaselineRSS), bytesString(b.StallPeakRSS), bytesString(b.StallEndRSS),
			bytesString(b.DrainPeakRSS), bytesString(b.KernelPeakRSS), b.Samples)
		q := b.InFlight
		fmt.Fprintf(out, "in flight at the end of the stall: client receive queue %s, proxy→client send queue %s, proxy backend receive queue %s, broker send queue %s; the rest waits in the broker\n",
			bytesString(q.ClientReceive), bytesString(q.ProxySend), bytesString(q.ProxyReceive), bytesString(q.BrokerSend))
	}
	for _, idle := range r.Idle {
		idle.print(out)
	}
	if err := printFailover(out, cfg, r.Failover); err != nil {
		return err
	}
	if err := printMirrored(out, cfg, r.Mirrored, r.Declares); err != nil {
		return err
	}
	if err := printTimelines(out, r.Timelines); err != nil {
		return err
	}
	if r.Scale != nil {
		r.Scale.print(out)
	}
	if r.Connections != nil {
		r.Connections.print(out)
	}
	if r.Backlog != nil {
		if err := r.Backlog.print(out, cfg); err != nil {
			return err
		}
	}
	if err := printSync(out, cfg, r.Sync); err != nil {
		return err
	}
	if r.Elapsed != "" {
		fmt.Fprintf(out, "\nbench took %s\n", r.Elapsed)
	}
	return nil
}

// brokerCPU is "-" for a broker the bench did not start: its process is not known, and
// its CPU counts as other.
func brokerCPU(r runResult, cfg config) string {
	if cfg.amqpURL != "" {
		return "-"
	}
	return fmt.Sprintf("%.2f", r.CPU.Broker)
}

func proxyCPU(r runResult) string {
	if r.Target == "direct" || r.Target == targetNativeHA || r.Target == targetQuorum {
		return "-"
	}
	return fmt.Sprintf("%.2f", r.CPU.Proxy)
}

// wholeProxyCPU is the proxy's CPU per message over the whole run, "-" for rows without a
// proxy.
func wholeProxyCPU(r runResult) string {
	if proxyCPU(r) == "-" {
		return "-"
	}
	return fmt.Sprintf("%.1f µs", r.Whole.ProxyCPUPerMessage)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func ackMode(multiAck int) string {
	if multiAck <= 1 {
		return "ack each"
	}
	return fmt.Sprintf("multiple ack every %d", multiAck)
}

func bytesString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}

func (r *report) writeJSON(path string) error {
	r.Comparisons = compare(r.Runs)
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("-json: %w", err)
	}
	return nil
}
