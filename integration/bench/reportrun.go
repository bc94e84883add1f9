package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	harness "github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// runReport runs the report scenario on the mirrored scenario's nodes: the full load on
// the first plain node directly and through the bench's proxy, the mirrored loads, and a
// timeline through a master kill on amqp-mirror, classic mirroring and a quorum queue. It
// stops every node and process it started before it returns, however it returns.
func runReport(ctx context.Context, cfg config, logger *slog.Logger) (r benchReport, err error) {
	began := time.Now()
	r.Date = began
	r.Command = commandLine(os.Args[1:])
	r.Loads = reportLoads(cfg)
	m := &mirroredBench{cfg: cfg}
	defer m.shutdown()
	if err := m.open(ctx, logger, "report"); err != nil {
		return r, err
	}
	r.Machine = describeMachine(ctx, m.plain.Nodes()[0])

	b, err := brokerOf(m.plain.Nodes()[0])
	if err != nil {
		return r, err
	}
	passThrough := cfg
	passThrough.targets = []string{targetDirect, "proxy"}
	spec := loadSpec{
		scenario: "full", publishers: cfg.publishers, consumers: cfg.consumers,
		window: cfg.confirmWindow, prefetch: cfg.prefetch, multiAck: cfg.multiAck,
		size: cfg.size, persistent: true, warmup: cfg.warmup, duration: cfg.duration,
	}
	r.PassThrough, err = runAlternating(ctx, passThrough, b, spec)
	if err != nil {
		return r, err
	}
	r.Mirrored, err = m.runLoads(ctx)
	if err != nil {
		return r, err
	}
	r.Machine.OtherCores = otherCores(append(append([]runResult(nil), r.PassThrough...), r.Mirrored...))

	for _, target := range []string{targetMirror, targetNativeHA, targetQuorum} {
		progress("timeline through a master kill: %s", target)
		var tl timelineResult
		switch target {
		case targetMirror:
			tl, err = m.timelineMirror(ctx)
		default:
			tl, err = m.timelineNative(ctx, target == targetQuorum)
		}
		tl.Target = target
		r.Timelines = append(r.Timelines, tl)
		if err != nil {
			return r, fmt.Errorf("timeline, %s: %w", target, err)
		}
	}
	r.Elapsed = time.Since(began)
	r.Campaigns = readCampaignTables(cfg.campaignReports)
	return r, nil
}

// brokerOf is a harness node as the pass-through loads address it.
func brokerOf(node *harness.Node) (broker, error) {
	u, err := url.Parse(node.URL())
	if err != nil {
		return broker{}, err
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "5672")
	}
	return broker{url: node.URL(), addr: addr, pid: node.PID()}, nil
}

// otherCores is the median of the runs' CPU of the rest of the machine.
func otherCores(runs []runResult) float64 {
	values := make([]float64, len(runs))
	for i, r := range runs {
		values[i] = r.CPU.Other
	}
	return medianOf(values)
}

// reportLoads says what each part of the report ran.
func reportLoads(cfg config) []string {
	rounds := "one round"
	if cfg.rounds > 1 {
		rounds = fmt.Sprintf("%d rounds", cfg.rounds)
	}
	load := fmt.Sprintf("amqp091-go, %d publishers with confirms (at most %d unconfirmed each), %d consumers (prefetch %d, %s), persistent %d B messages, durable queues, %v after %v of warm-up",
		cfg.publishers, cfg.confirmWindow, cfg.consumers, cfg.prefetch, ackMode(cfg.multiAck), cfg.size, cfg.duration, cfg.warmup)
	return []string{
		"Pass-through: " + load + "; one plain RabbitMQ node directly and through amqp-mirror's proxy, alternately: " + rounds + " and a last direct run. Ratios are of the medians; per round, of each proxy run against the direct runs beside it.",
		"Mirrored: the same load on one plain node; on `amqp-mirror serve` in front of three plain nodes with `ha-mode: all` and `ha-sync-mode: automatic`; on RabbitMQ's classic mirroring with the same policy and on quorum queues, both on a three-node RabbitMQ cluster: " + rounds + " and a last run on the plain node. Ratios and CPU per message are of each row's medians.",
		fmt.Sprintf("Master kill: one publisher (one persistent %d B message at a time, waiting for its confirm, at most %d per second) and one consumer (prefetch 20, an ack per message) on a durable queue mirrored on three nodes; after %v of steady load the node holding the master (a quorum queue's leader) is killed with SIGKILL. amqp-mirror's clients have no reconnect logic; the cluster's clients start on another node than the master's and, when they lose their connection, connect to another node, consume again and publish again what was not confirmed. A confirm's latency counts from the message's first publish attempt.",
			max(cfg.size, 16), timelineRate, timelineBefore+timelineSettle),
	}
}

// describeMachine says where the bench runs; what it cannot find out reads "unknown".
func describeMachine(ctx context.Context, node *harness.Node) machine {
	m := machine{Cores: runtime.NumCPU(), Go: runtime.Version(), CPU: "unknown", Kernel: "unknown", RabbitMQ: "unknown", Erlang: "unknown"}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		scanner := bufio.NewScanner(f)
		for scanner.Scan() {
			if name, value, ok := strings.Cut(scanner.Text(), ":"); ok && strings.TrimSpace(name) == "model name" {
				m.CPU = strings.Join(strings.Fields(value), " ")
				break
			}
		}
		f.Close()
	}
	if release, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(release))
	}
	if v, err := node.Eval(ctx, "rabbit_misc:version()"); err == nil {
		m.RabbitMQ = string(v)
	}
	if v, err := node.Eval(ctx, "erlang:system_info(otp_release)"); err == nil {
		m.Erlang = string(v)
	}
	return m
}

// commandLine is the bench's command with these arguments, quoted for a shell where
// needed.
func commandLine(args []string) string {
	words := []string{"go", "run", "./integration/bench"}
	for _, a := range args {
		if strings.ContainsAny(a, " \t'\"$`\\*?;&|<>()") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		words = append(words, a)
	}
	return strings.Join(words, " ")
}

// The report's rounds and load durations, unless -rounds, -warmup and -duration are
// given.
const (
	reportRounds   = 3
	reportWarmup   = 2 * time.Second
	reportDuration = 8 * time.Second
)
