package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The report scenario's files: report.md, the headline ratios with the machine, the date
// and the command, and failover.svg, the timelines' chart (chart.go).

// benchReport is what the report scenario measured.
type benchReport struct {
	Date    time.Time     `json:"date"`
	Machine machine       `json:"machine"`
	Command string        `json:"command"`
	Elapsed time.Duration `json:"elapsed_ns"`
	// Loads says what each part ran, one line each.
	Loads []string `json:"loads"`
	// PassThrough are the runs of one plain node directly (direct) and through the
	// bench's proxy (proxy); Mirrored the mirrored scenario's runs.
	PassThrough []runResult      `json:"pass_through"`
	Mirrored    []runResult      `json:"mirrored"`
	Timelines   []timelineResult `json:"timelines"`
	// Campaigns are the fault campaigns' last tables found (-campaign-reports).
	Campaigns []campaignTable `json:"campaigns"`
}

// campaignTable is a fault campaign's table as its run wrote it.
type campaignTable struct {
	Path    string    `json:"path"`
	Written time.Time `json:"written"`
	Table   string    `json:"table"`
}

// readCampaignTables reads the campaign tables among paths that exist; a campaign runs
// apart from the report (make chaos, make chaos-sidecar), for far longer.
func readCampaignTables(paths []string) []campaignTable {
	var out []campaignTable
	for _, path := range paths {
		info, err := os.Stat(path)
		if err != nil {
			continue
		}
		table, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		out = append(out, campaignTable{Path: path, Written: info.ModTime(), Table: string(table)})
	}
	return out
}

// machine is where the report was measured.
type machine struct {
	Cores    int    `json:"cores"`
	CPU      string `json:"cpu"`
	Kernel   string `json:"kernel"`
	Go       string `json:"go"`
	RabbitMQ string `json:"rabbitmq"`
	Erlang   string `json:"erlang"`
	// OtherCores is the median, over the measured load runs, of the cores the rest of
	// the machine used: neither the brokers, nor the proxy, nor the bench.
	OtherCores float64 `json:"other_cores"`
}

// headline is one row of the report's table.
type headline struct {
	Measure string
	Figure  string
	From    string
}

// timelineLabels name the timelines' targets in the report.
var timelineLabels = map[string]string{
	targetMirror:   "amqp-mirror",
	targetNativeHA: "RabbitMQ classic mirroring",
	targetQuorum:   "RabbitMQ quorum queue",
}

func timelineLabel(target string) string {
	if label, ok := timelineLabels[target]; ok {
		return label
	}
	return target
}

// headlines are the report's figures: the proxy against one broker, amqp-mirror against
// RabbitMQ's mirroring, quorum queues and one node, and each target through a master
// kill. A part without its runs gives no rows.
func headlines(r benchReport) []headline {
	out := passThroughHeadlines(r.PassThrough)
	out = append(out, mirroredHeadlines(r.Mirrored)...)
	return append(out, killHeadlines(r.Timelines)...)
}

// passThroughHeadlines compare the proxy's runs with the direct ones.
func passThroughHeadlines(runs []runResult) []headline {
	var out []headline
	direct, proxy := runsOf(runs, targetDirect), runsOf(runs, "proxy")
	if len(direct) > 0 && len(proxy) > 0 {
		d, p := median(direct), median(proxy)
		from := fmt.Sprintf("medians %s / %s msg/s", rounded(p.ConsumeRate), rounded(d.ConsumeRate))
		// Each round's ratio as well: on a shared machine, a round the other work
		// crowded shows.
		if rounds := roundRatios(runs, "proxy"); len(rounds) > 1 {
			parts := make([]string, len(rounds))
			for i, x := range rounds {
				parts[i] = fmt.Sprintf("%.2f", x)
			}
			from += "; per round " + strings.Join(parts, ", ")
		}
		out = append(out, headline{
			Measure: "pass-through: consumed msg/s through amqp-mirror ÷ directly, one broker",
			Figure:  fmt.Sprintf("%.2f", ratio(p.ConsumeRate, d.ConsumeRate)),
			From:    from,
		})
		if p.ConsumeRate > 0 {
			out = append(out, headline{
				Measure: "pass-through: the proxy's CPU per message",
				Figure:  fmt.Sprintf("%.1f µs", p.CPU.Proxy/p.ConsumeRate*1e6),
				From:    fmt.Sprintf("%.2f cores at %s msg/s", p.CPU.Proxy, rounded(p.ConsumeRate)),
			})
		}
	}
	return out
}

// mirroredHeadlines compare amqp-mirror's median with each other row's, and the CPU per
// message of the three mirrored rows.
func mirroredHeadlines(runs []runResult) []headline {
	var out []headline
	mirror := runsOf(runs, targetMirror)
	if len(mirror) > 0 {
		m := median(mirror)
		against := []struct{ target, name string }{
			{targetNativeHA, "RabbitMQ classic mirroring, ha-mode all"},
			{targetQuorum, "quorum queues"},
			{targetDirect, "one plain node, no mirroring"},
		}
		for _, a := range against {
			others := runsOf(runs, a.target)
			if len(others) == 0 {
				continue
			}
			o := median(others)
			out = append(out, headline{
				Measure: "mirrored: consumed msg/s, amqp-mirror ha-mode all ÷ " + a.name,
				Figure:  fmt.Sprintf("%.2f", ratio(m.ConsumeRate, o.ConsumeRate)),
				From:    fmt.Sprintf("%s / %s msg/s", rounded(m.ConsumeRate), rounded(o.ConsumeRate)),
			})
		}
		var figures, names []string
		for _, target := range []string{targetMirror, targetNativeHA, targetQuorum} {
			rows := runsOf(runs, target)
			if len(rows) == 0 {
				continue
			}
			o := median(rows)
			if o.ConsumeRate <= 0 {
				continue
			}
			figures = append(figures, fmt.Sprintf("%.0f", (o.CPU.Broker+o.CPU.Proxy)/o.ConsumeRate*1e6))
			names = append(names, timelineLabel(target))
		}
		if len(figures) > 1 {
			out = append(out, headline{
				Measure: "mirrored: CPU per message, brokers and proxy together",
				Figure:  strings.Join(figures, " / ") + " µs",
				From:    strings.Join(names, " / "),
			})
		}
	}
	return out
}

// killHeadlines are each timeline's resume time, then each one's loss.
func killHeadlines(timelines []timelineResult) []headline {
	var out []headline
	for _, tl := range timelines {
		out = append(out, headline{
			Measure: "master kill: time to resume, " + timelineLabel(tl.Target),
			Figure:  fmt.Sprintf("%.3f s", tl.ResumeSeconds),
			From:    fmt.Sprintf("kill -9 of %s to the first delivery of a message published after it", tl.KilledNode),
		})
	}
	for _, tl := range timelines {
		out = append(out, headline{
			Measure: "master kill: messages lost, " + timelineLabel(tl.Target),
			Figure:  fmt.Sprint(tl.Lost),
			From: fmt.Sprintf("confirmed and never delivered, of %s confirmed; %d delivered twice",
				thousands(int64(tl.Confirmed)), tl.Duplicates),
		})
	}
	return out
}

// roundRatios are target's runs, in run order, each against the mean of the direct runs
// beside it: the closest in time, so that drift of the broker weighs on both sides.
func roundRatios(runs []runResult, target string) []float64 {
	var out []float64
	for i, r := range runs {
		if r.Target != target {
			continue
		}
		var sum float64
		var n int
		for _, j := range []int{i - 1, i + 1} {
			if j >= 0 && j < len(runs) && runs[j].Target == targetDirect {
				sum += runs[j].ConsumeRate
				n++
			}
		}
		if n > 0 {
			out = append(out, ratio(r.ConsumeRate, sum/float64(n)))
		}
	}
	return out
}

// writeReportMarkdown writes report.md: when and where, the headlines, the chart, the
// loads and the command.
func writeReportMarkdown(out io.Writer, r benchReport, chart string) error {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "# amqp-mirror benchmark report\n\n")
	fmt.Fprintf(&b, "%s, in %s. %d cores (%s), %s, Go %s, RabbitMQ %s on Erlang/OTP %s. ",
		r.Date.UTC().Format("2006-01-02 15:04 MST"), r.Elapsed.Round(time.Second), m.Cores, m.CPU, m.Kernel, m.Go, m.RabbitMQ, m.Erlang)
	fmt.Fprintf(&b, "The brokers, the proxy and the load generator share the cores; the rest of the machine used %.2f cores (median of the measured load runs).\n\n", m.OtherCores)
	fmt.Fprintf(&b, "| headline | figure | from |\n| --- | ---: | --- |\n")
	for _, h := range headlines(r) {
		fmt.Fprintf(&b, "| %s | **%s** | %s |\n", markdownCell(h.Measure), markdownCell(h.Figure), markdownCell(h.From))
	}
	if chart != "" {
		fmt.Fprintf(&b, "\n![Delivered msg/s and confirm latency through a kill -9 of the master's node](%s)\n", chart)
	}
	if len(r.Loads) > 0 {
		fmt.Fprintf(&b, "\n")
		for _, load := range r.Loads {
			fmt.Fprintf(&b, "- %s\n", load)
		}
	}
	fmt.Fprintf(&b, "\nReproduce: `%s` (root, RabbitMQ 3.10's `rabbitmq-server` installed).\n", r.Command)
	fmt.Fprintf(&b, "\n## Fault campaigns\n\n")
	if len(r.Campaigns) == 0 {
		fmt.Fprintf(&b, "No campaign table was found: `make chaos` and `make chaos-sidecar` write them (docs/testing.md).\n")
	}
	for _, c := range r.Campaigns {
		fmt.Fprintf(&b, "`%s`, written %s:\n\n```\n%s```\n\n", c.Path, c.Written.UTC().Format("2006-01-02 15:04 MST"), strings.TrimRight(c.Table, "\n")+"\n")
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// markdownCell keeps a table cell on its row.
func markdownCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// thousands writes n with its thousands separated by spaces, as the docs do.
func thousands(n int64) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	digits := fmt.Sprint(n)
	var groups []string
	for len(digits) > 3 {
		groups = append([]string{digits[len(digits)-3:]}, groups...)
		digits = digits[:len(digits)-3]
	}
	return sign + strings.Join(append([]string{digits}, groups...), " ")
}

// rounded writes x rounded to a whole number, thousands separated.
func rounded(x float64) string { return thousands(int64(math.Round(x))) }

// writeReportFiles writes report.md and failover.svg into dir, creating it.
func writeReportFiles(dir string, r benchReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("-report-dir: %w", err)
	}
	const chart = "failover.svg"
	write := func(name string, f func(io.Writer) error) error {
		file, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if err := f(file); err != nil {
			file.Close()
			return err
		}
		return file.Close()
	}
	if err := write(chart, func(w io.Writer) error { return writeFailoverSVG(w, r.Timelines) }); err != nil {
		return err
	}
	return write("report.md", func(w io.Writer) error { return writeReportMarkdown(w, r, chart) })
}
