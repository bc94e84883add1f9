package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// syntheticReport has medians that make the ratios easy to check by hand.
func syntheticReport() benchReport {
	run := func(target string, rate, brokers, proxy float64) runResult {
		return runResult{Target: target, ConsumeRate: rate, CPU: cpuUse{Broker: brokers, Proxy: proxy, Other: 0.25}}
	}
	return benchReport{
		Date:    time.Date(2026, 12, 2, 9, 30, 0, 0, time.UTC),
		Machine: machine{Cores: 2, CPU: "Test CPU", Kernel: "Linux 6.1", Go: "go1.26.8", RabbitMQ: "3.10.8", Erlang: "25", OtherCores: 0.25},
		Command: "go run ./integration/bench -scenario=report",
		Elapsed: 6*time.Minute + 12*time.Second,
		Loads:   []string{"Pass-through: a load.", "Master kill: another."},
		PassThrough: []runResult{
			run(targetDirect, 20000, 1, 0), run("proxy", 16000, 1, 0.16), run(targetDirect, 20000, 1, 0),
			run("proxy", 18000, 1, 0.18), run(targetDirect, 25000, 1, 0),
		},
		Mirrored: []runResult{
			run(targetDirect, 20000, 1, 0), run(targetMirror, 8000, 1.6, 0.4), run(targetNativeHA, 6400, 1.6, 0),
			run(targetQuorum, 10000, 1.5, 0), run(targetDirect, 20000, 1, 0),
		},
		Timelines: []timelineResult{
			{Target: targetMirror, KilledNode: "plain1", ResumeSeconds: 0.047, Confirmed: 2345, Lost: 0},
			{Target: targetNativeHA, KilledNode: "native1", ResumeSeconds: 0.1456, Confirmed: 1200, Lost: 0, Duplicates: 1},
			{Target: targetQuorum, KilledNode: "native2", ResumeSeconds: 2.5, Confirmed: 900, Lost: 3},
		},
	}
}

func TestHeadlines(t *testing.T) {
	full := syntheticReport()
	noQuorum := syntheticReport()
	noQuorum.Mirrored = slices.DeleteFunc(noQuorum.Mirrored, func(r runResult) bool { return r.Target == targetQuorum })
	noQuorum.Timelines = noQuorum.Timelines[:2]
	onlyPassThrough := syntheticReport()
	onlyPassThrough.Mirrored, onlyPassThrough.Timelines = nil, nil

	tests := []struct {
		name   string
		report benchReport
		want   []headline
	}{
		{
			name:   "every part",
			report: full,
			want: []headline{
				// Medians 17 000 / 20 000; per round 16 000 against 20 000 and 20 000 beside
				// it, 18 000 against 20 000 and 25 000.
				{"pass-through: consumed msg/s through amqp-mirror ÷ directly, one broker", "0.85", "medians 17 000 / 20 000 msg/s; per round 0.80, 0.80"},
				// 0.17 cores / 17 000 msg/s, both medians.
				{"pass-through: the proxy's CPU per message", "10.0 µs", "0.17 cores at 17 000 msg/s"},
				{"mirrored: consumed msg/s, amqp-mirror ha-mode all ÷ RabbitMQ classic mirroring, ha-mode all", "1.25", "8 000 / 6 400 msg/s"},
				{"mirrored: consumed msg/s, amqp-mirror ha-mode all ÷ quorum queues", "0.80", "8 000 / 10 000 msg/s"},
				{"mirrored: consumed msg/s, amqp-mirror ha-mode all ÷ one plain node, no mirroring", "0.40", "8 000 / 20 000 msg/s"},
				// (1.6 + 0.4) / 8 000, 1.6 / 6 400, 1.5 / 10 000 cores per msg/s.
				{"mirrored: CPU per message, brokers and proxy together", "250 / 250 / 150 µs", "amqp-mirror / RabbitMQ classic mirroring / RabbitMQ quorum queue"},
				{"master kill: time to resume, amqp-mirror", "0.047 s", "kill -9 of plain1 to the first delivery of a message published after it"},
				{"master kill: time to resume, RabbitMQ classic mirroring", "0.146 s", "kill -9 of native1 to the first delivery of a message published after it"},
				{"master kill: time to resume, RabbitMQ quorum queue", "2.500 s", "kill -9 of native2 to the first delivery of a message published after it"},
				{"master kill: messages lost, amqp-mirror", "0", "confirmed and never delivered, of 2 345 confirmed; 0 delivered twice"},
				{"master kill: messages lost, RabbitMQ classic mirroring", "0", "confirmed and never delivered, of 1 200 confirmed; 1 delivered twice"},
				{"master kill: messages lost, RabbitMQ quorum queue", "3", "confirmed and never delivered, of 900 confirmed; 0 delivered twice"},
			},
		},
		{
			name:   "no quorum queues",
			report: noQuorum,
			want: []headline{
				{"pass-through: consumed msg/s through amqp-mirror ÷ directly, one broker", "0.85", "medians 17 000 / 20 000 msg/s; per round 0.80, 0.80"},
				{"pass-through: the proxy's CPU per message", "10.0 µs", "0.17 cores at 17 000 msg/s"},
				{"mirrored: consumed msg/s, amqp-mirror ha-mode all ÷ RabbitMQ classic mirroring, ha-mode all", "1.25", "8 000 / 6 400 msg/s"},
				{"mirrored: consumed msg/s, amqp-mirror ha-mode all ÷ one plain node, no mirroring", "0.40", "8 000 / 20 000 msg/s"},
				{"mirrored: CPU per message, brokers and proxy together", "250 / 250 µs", "amqp-mirror / RabbitMQ classic mirroring"},
				{"master kill: time to resume, amqp-mirror", "0.047 s", "kill -9 of plain1 to the first delivery of a message published after it"},
				{"master kill: time to resume, RabbitMQ classic mirroring", "0.146 s", "kill -9 of native1 to the first delivery of a message published after it"},
				{"master kill: messages lost, amqp-mirror", "0", "confirmed and never delivered, of 2 345 confirmed; 0 delivered twice"},
				{"master kill: messages lost, RabbitMQ classic mirroring", "0", "confirmed and never delivered, of 1 200 confirmed; 1 delivered twice"},
			},
		},
		{
			name:   "pass-through only",
			report: onlyPassThrough,
			want: []headline{
				{"pass-through: consumed msg/s through amqp-mirror ÷ directly, one broker", "0.85", "medians 17 000 / 20 000 msg/s; per round 0.80, 0.80"},
				{"pass-through: the proxy's CPU per message", "10.0 µs", "0.17 cores at 17 000 msg/s"},
			},
		},
		{name: "nothing measured", report: benchReport{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := headlines(tt.report)
			if len(got) != len(tt.want) {
				t.Errorf("got %d headlines, want %d", len(got), len(tt.want))
			}
			for i := range min(len(got), len(tt.want)) {
				if got[i] != tt.want[i] {
					t.Errorf("headline %d:\n got  %q\n want %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestWriteReportMarkdown(t *testing.T) {
	r := syntheticReport()
	var out bytes.Buffer
	if err := writeReportMarkdown(&out, r, "failover.svg"); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	var rows [][]string
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		rows = append(rows, cells)
	}
	want := headlines(r)
	if len(rows) != len(want)+2 {
		t.Fatalf("got %d table lines, want a header, a separator and %d rows:\n%s", len(rows), len(want), text)
	}
	if got := strings.Join(rows[0], "|"); got != " headline|figure|from " {
		t.Errorf("header %q", got)
	}
	for i, h := range want {
		row := rows[i+2]
		if len(row) != 3 {
			t.Errorf("row %d has %d cells, want 3: %q", i, len(row), row)
			continue
		}
		if got := strings.TrimSpace(row[1]); got != "**"+h.Figure+"**" {
			t.Errorf("row %d figure %q, want **%s**", i, got, h.Figure)
		}
	}
	for _, s := range []string{
		"2026-12-02 09:30 UTC", "in 6m12s", "2 cores (Test CPU)", "Go go1.26.8", "RabbitMQ 3.10.8 on Erlang/OTP 25", "0.25 cores",
		"](failover.svg)", "- Pass-through: a load.", "`go run ./integration/bench -scenario=report`",
		"## Fault campaigns", "No campaign table was found",
	} {
		if !strings.Contains(text, s) {
			t.Errorf("report.md has no %q:\n%s", s, text)
		}
	}
}

// TestReportIncludesCampaignTables: the campaign tables found are in report.md, each
// with its file and date; a file that does not exist is left out.
func TestReportIncludesCampaignTables(t *testing.T) {
	dir := t.TempDir()
	written := filepath.Join(dir, "campaign-sidecar-report.txt")
	if err := os.WriteFile(written, []byte("fault  injected\nall    100\n\nlost   0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	if err := os.Chtimes(written, at, at); err != nil {
		t.Fatal(err)
	}
	r := syntheticReport()
	r.Campaigns = readCampaignTables([]string{filepath.Join(dir, "missing.txt"), written})
	if len(r.Campaigns) != 1 {
		t.Fatalf("read %d campaign tables, want 1 (the missing file left out)", len(r.Campaigns))
	}
	var out bytes.Buffer
	if err := writeReportMarkdown(&out, r, "failover.svg"); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, s := range []string{"## Fault campaigns", "campaign-sidecar-report.txt`, written 2026-12-05 03:00 UTC", "all    100", "lost   0\n```"} {
		if !strings.Contains(text, s) {
			t.Errorf("report.md has no %q:\n%s", s, text)
		}
	}
	if strings.Contains(text, "No campaign table was found") {
		t.Errorf("report.md says no table was found although one was:\n%s", text)
	}
}

func TestRoundRatios(t *testing.T) {
	runs := func(targetsAndRates ...any) []runResult {
		var out []runResult
		for i := 0; i < len(targetsAndRates); i += 2 {
			out = append(out, runResult{Target: targetsAndRates[i].(string), ConsumeRate: targetsAndRates[i+1].(float64)})
		}
		return out
	}
	tests := []struct {
		name string
		runs []runResult
		want []float64
	}{
		{"each between two direct runs", runs(targetDirect, 10.0, "proxy", 9.0, targetDirect, 8.0, "proxy", 6.0, targetDirect, 4.0), []float64{1, 1}},
		{"a direct run on one side only", runs("proxy", 5.0, targetDirect, 10.0), []float64{0.5}},
		{"no direct run beside it", runs("proxy", 5.0, "socat", 10.0), nil},
		{"another target's runs left out", runs(targetDirect, 10.0, "socat", 1.0, targetDirect, 10.0), nil},
	}
	for _, tt := range tests {
		got := roundRatios(tt.runs, "proxy")
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: roundRatios = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestMarkdownCell(t *testing.T) {
	if got, want := markdownCell("a | b\nc"), `a \| b c`; got != want {
		t.Errorf("markdownCell = %q, want %q", got, want)
	}
}

func TestThousands(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0"}, {999, "999"}, {1000, "1 000"}, {21047, "21 047"}, {1234567, "1 234 567"}, {-15646, "-15 646"},
	}
	for _, tt := range tests {
		if got := thousands(tt.n); got != tt.want {
			t.Errorf("thousands(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "go run ./integration/bench"},
		{[]string{"-scenario=report", "-report-dir=out"}, "go run ./integration/bench -scenario=report -report-dir=out"},
		{[]string{"-report-dir=my dir", "-x=it's"}, `go run ./integration/bench '-report-dir=my dir' '-x=it'\''s'`},
	}
	for _, tt := range tests {
		if got := commandLine(tt.args); got != tt.want {
			t.Errorf("commandLine(%q) = %q, want %q", tt.args, got, tt.want)
		}
	}
}

// TestWriteReportFiles: both files land in a directory that did not exist, and the
// markdown links the chart beside it.
func TestWriteReportFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "report")
	r := syntheticReport()
	r.Timelines[0] = syntheticTimeline(targetMirror, 1)
	if err := writeReportFiles(dir, r); err != nil {
		t.Fatal(err)
	}
	chart, err := os.ReadFile(filepath.Join(dir, "failover.svg"))
	if err != nil {
		t.Fatal(err)
	}
	parseSVG(t, chart)
	text, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), "](failover.svg)") {
		t.Errorf("report.md does not show failover.svg:\n%s", text)
	}
}

func TestReportDefaults(t *testing.T) {
	tests := []struct {
		name         string
		args         []string
		wantRounds   int
		wantWarmup   time.Duration
		wantDuration time.Duration
	}{
		{"full keeps its defaults", []string{"-scenario=full"}, 1, 3 * time.Second, 15 * time.Second},
		{"report shortens them", []string{"-scenario=report"}, reportRounds, reportWarmup, reportDuration},
		{"flags given win", []string{"-scenario=report", "-duration=20s", "-rounds=1"}, 1, reportWarmup, 20 * time.Second},
	}
	for _, tt := range tests {
		cfg, err := parseFlags(tt.args)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if cfg.rounds != tt.wantRounds || cfg.warmup != tt.wantWarmup || cfg.duration != tt.wantDuration {
			t.Errorf("%s: rounds %d, warmup %v, duration %v, want %d, %v, %v",
				tt.name, cfg.rounds, cfg.warmup, cfg.duration, tt.wantRounds, tt.wantWarmup, tt.wantDuration)
		}
	}
}
