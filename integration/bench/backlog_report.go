package main

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// print prints the backlog scenario's table: one measure a row.
func (r backlogResult) print(out io.Writer, cfg config) error {
	fmt.Fprintf(out, "\nbacklog: one durable queue through amqp-mirror serve, mirrored on three plain nodes (ha-mode all, automatic sync);\n")
	fmt.Fprintf(out, "filled by %d publishers (confirm window %d) with no consumer; then a slave's node wiped and started again empty,\n", cfg.publishers, cfg.confirmWindow)
	fmt.Fprintf(out, "then kill -9 of the master's node and the backlog consumed through the proxy (prefetch %d, an ack per message)\n\n", cfg.prefetch)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, row := range r.rows() {
		fmt.Fprintf(w, "  %s\t%s\n", row[0], row[1])
	}
	return w.Flush()
}

// rows are the table's rows: what was measured, and its value.
func (r backlogResult) rows() [][2]string {
	return [][2]string{
		{"messages", fmt.Sprintf("%d of %d B, persistent", r.Messages, r.BodyBytes)},
		{"publish", fmt.Sprintf("%.0f msg/s (%.1f s)", r.PublishRate, r.PublishSeconds)},
		{"proxy RSS before / with backlog", fmt.Sprintf("%s / %s (high-water mark %s)",
			bytesString(r.ProxyRSSBefore), bytesString(r.ProxyRSSBacklog), bytesString(r.ProxyRSSPeakFill))},
		{"proxy RSS per backlog message", fmt.Sprintf("%.0f B", r.ProxyBytesPerMessage)},
		{"proxy CPU per published message", fmt.Sprintf("%.1f µs", r.ProxyCPUPerPublish)},
		{"cores during the fill", fmt.Sprintf("brokers %.2f, proxy %.2f, bench %.2f, other %.2f",
			r.FillCPU.Broker, r.FillCPU.Proxy, r.FillCPU.Load, r.FillCPU.Other)},
		{"sync of " + orDefault(r.SyncedNode, "a slave") + ", wiped", fmt.Sprintf("%.1f s, %.0f msg/s; its copy then holds %d",
			r.SyncSeconds, r.SyncRate, r.SyncedCopyHolds)},
		{"proxy RSS during / after sync", fmt.Sprintf("peak %s / %s", bytesString(r.ProxyRSSSyncPeak), bytesString(r.ProxyRSSSynced))},
		{"kill -9 of " + orDefault(r.KilledNode, "the master") + ": promoted", fmt.Sprintf("%.2f s (%s)", r.PromotedSeconds, orDefault(r.NewMaster, "-"))},
		{"first delivery after the kill", fmt.Sprintf("%.2f s (consumer connects: %d)", r.FirstDeliverySeconds, r.ConsumeAttempts)},
		{"consume", fmt.Sprintf("%.0f msg/s (%.1f s)", r.ConsumeRate, r.ConsumeSeconds)},
		{"confirmed / nacked", fmt.Sprintf("%d / %d", r.Confirmed, r.Nacked)},
		{"lost / duplicates", fmt.Sprintf("%d / %d", r.Lost, r.Duplicates)},
	}
}
