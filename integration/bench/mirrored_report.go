package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// mirroredLabels say what each row of the mirrored table measures.
var mirroredLabels = map[string]string{
	targetDirect: "one node directly",
	targetMirror: "amqp-mirror, 3 plain nodes, ha-mode all",
	// The build given by -amqp-mirror-baseline-bin, on the same nodes.
	targetMirrorBaseline: "amqp-mirror baseline build, same nodes",
	targetNativeHA:       "RabbitMQ classic mirroring, 3-node cluster, ha-mode all",
	targetQuorum:         "quorum queues, 3-node cluster",
}

// printMirrored prints the mirrored scenario's runs, the median of each target with its
// ratio to direct's median, and the queue.declare rates.
func printMirrored(out io.Writer, cfg config, runs []runResult, declares []declareResult) error {
	if len(runs) == 0 && len(declares) == 0 {
		return nil
	}
	fmt.Fprintf(out, "\nmirrored: amqp091-go, %d publishers (confirm window %d), %d consumers (prefetch %d, %s), %d B persistent, durable queues, %v after %v warm-up\n",
		cfg.publishers, cfg.confirmWindow, cfg.consumers, cfg.prefetch, ackMode(cfg.multiAck), cfg.size, cfg.duration, cfg.warmup)
	if cfg.classicQueueVersion != 0 {
		fmt.Fprintf(out, "classic queues in storage version %d on every node (-classic-queue-version)\n", cfg.classicQueueVersion)
	}
	if cfg.mirroredRate > 0 {
		fmt.Fprintf(out, "publishers paced at %.0f msg/s together (-mirrored-rate)\n", cfg.mirroredRate)
	}
	fmt.Fprintf(out, "copies: brokers holding each queue, counted on the brokers; cpu in cores (brokers: every node the row uses; other: the rest of the machine, idle nodes included)\n")
	fmt.Fprintf(out, "whole run: from the clients' start to the end of the work they left (drain, and amqp-mirror's trimming of the slaves, settle s); CPU per message consumed in it\n\n")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "target\trun\tcopies\tconsumed/s\tpublished/s\tconfirm p50\tp99\tdelivery p50\tp99\tcpu brokers\tproxy\tbench\tother\twhole run s\tsettle s\tbrokers µs/msg\teach broker µs/msg\tproxy µs/msg\t")
	for _, r := range runs {
		fmt.Fprintf(w, "%s\t%d\t%d\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%.2f\t%.2f\t%.1f\t%.1f\t%.0f\t%s\t%s\t\n",
			r.Target, r.Run, r.Copies, r.ConsumeRate, r.PublishRate, r.Confirm.P50, r.Confirm.P99,
			r.Deliver.P50, r.Deliver.P99, r.CPU.Broker, proxyCPU(r), r.CPU.Load, r.CPU.Other,
			r.Whole.Seconds, r.Whole.SettleSeconds, r.Whole.BrokerCPUPerMessage, eachBrokerCPU(r.Whole), wholeProxyCPU(r))
	}
	if err := w.Flush(); err != nil {
		return err
	}

	// One node's rate, and its broker's CPU per message over the whole run: what the
	// proxy's and the busiest broker's CPU per message are set against.
	var direct, node float64
	if d := runsOf(runs, targetDirect); len(d) > 0 {
		direct = median(d).ConsumeRate
		node = median(d).Whole.BusiestBrokerCPUPerMessage
	}
	fmt.Fprintln(out)
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "median of runs\tcopies\tconsumed/s\t(runs)\tratio\tconfirm p50/p99 ms\tdelivery p50/p99 ms\tcpu brokers\tproxy\tproxy CPU/msg\tbrokers+proxy CPU/msg\twhole run: proxy / brokers / busiest broker CPU/msg\tproxy / busiest ÷ one node's")
	for _, target := range mirroredRows {
		rs := runsOf(runs, target)
		if len(rs) == 0 {
			continue
		}
		m := median(rs)
		rates := make([]float64, len(rs))
		copies := rs[0].Copies
		for i, r := range rs {
			rates[i] = r.ConsumeRate
			copies = min(copies, r.Copies)
		}
		perMessage := "-"
		proxy := "-"
		if target == targetMirror || target == targetMirrorBaseline {
			proxy = fmt.Sprintf("%.2f", m.CPU.Proxy)
			if m.ConsumeRate > 0 {
				perMessage = fmt.Sprintf("%.1f µs", m.CPU.Proxy/m.ConsumeRate*1e6)
			}
		}
		// What the row costs per message, whoever runs it: on a shared machine it moves
		// less than the throughput, which is what other tenants leave over.
		total := "-"
		if m.ConsumeRate > 0 {
			total = fmt.Sprintf("%.0f µs", (m.CPU.Broker+m.CPU.Proxy)/m.ConsumeRate*1e6)
		}
		proxyShare := "-"
		if target == targetMirror || target == targetMirrorBaseline {
			proxyShare = fmt.Sprintf("%.2f", ratio(m.Whole.ProxyCPUPerMessage, node))
		}
		fmt.Fprintf(w, "%s\t%d\t%.0f\t%s\t%.2f\t%.2f / %.2f\t%.2f / %.2f\t%.2f\t%s\t%s\t%s\t%s / %.0f µs / %.0f µs\t%s / %.2f\n",
			mirroredLabels[target], copies, m.ConsumeRate, rateRange(rates), ratio(m.ConsumeRate, direct),
			m.Confirm.P50, m.Confirm.P99, m.Deliver.P50, m.Deliver.P99, m.CPU.Broker, proxy, perMessage, total,
			wholeProxyCPU(m), m.Whole.BrokerCPUPerMessage, m.Whole.BusiestBrokerCPUPerMessage,
			proxyShare, ratio(m.Whole.BusiestBrokerCPUPerMessage, node))
	}
	if err := w.Flush(); err != nil {
		return err
	}

	if len(declares) == 0 {
		return nil
	}
	fmt.Fprintf(out, "\nqueue.declare, one channel, each call waiting for the last (as an RPC client), %v per run; median (runs):\n", cfg.declareDuration)
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "kind\tdirect calls/s\t\tamqp-mirror calls/s\t\tratio")
	var kinds []string
	for _, d := range declares {
		if !slices.Contains(kinds, d.Kind) {
			kinds = append(kinds, d.Kind)
		}
	}
	for _, kind := range kinds {
		rates := map[string][]float64{}
		for _, d := range declares {
			if d.Kind == kind {
				rates[d.Target] = append(rates[d.Target], d.Rate)
			}
		}
		direct, through := medianOf(rates[targetDirect]), medianOf(rates[targetMirror])
		fmt.Fprintf(w, "%s\t%.0f\t(%s)\t%.0f\t(%s)\t%.2f\n", kind, direct, rateRange(rates[targetDirect]),
			through, rateRange(rates[targetMirror]), ratio(through, direct))
	}
	return w.Flush()
}

// runsOf are the runs of one target.
func runsOf(runs []runResult, target string) []runResult {
	var out []runResult
	for _, r := range runs {
		if r.Target == target {
			out = append(out, r)
		}
	}
	return out
}

// medianOf is the median of the values, 0 for none.
func medianOf(values []float64) float64 {
	if len(values) == 0 {
		return 0
	}
	v := slices.Sorted(slices.Values(values))
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// rateRange is the lowest and highest of the rates, or the one rate.
func rateRange(rates []float64) string {
	switch len(rates) {
	case 0:
		return "-"
	case 1:
		return fmt.Sprintf("%.0f", rates[0])
	}
	return fmt.Sprintf("%.0f-%.0f", slices.Min(rates), slices.Max(rates))
}

// eachBrokerCPU is each broker's CPU per message over the whole run, "55 / 49 / 48".
func eachBrokerCPU(w wholeRun) string {
	if len(w.EachBrokerCPUPerMessage) == 0 {
		return "-"
	}
	parts := make([]string, len(w.EachBrokerCPUPerMessage))
	for i, v := range w.EachBrokerCPUPerMessage {
		parts[i] = fmt.Sprintf("%.0f", v)
	}
	return strings.Join(parts, " / ")
}
