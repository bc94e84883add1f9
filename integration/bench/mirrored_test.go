package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	productconfig "github.com/amqp-mirror/amqp-mirror/config"
	harness "github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// TestServerConfig: the config the mirrored scenario gives `amqp-mirror serve` loads
// with the product's own loader, lists the three nodes as backends, and mirrors every
// queue of the amqp-mirror row (ha-mode all, automatic sync) and the sync scenario's
// with manual sync, not the queues the native cluster's policy is for. A row measured
// with a config the proxy read otherwise would compare the wrong thing.
func TestServerConfig(t *testing.T) {
	nodes := []*harness.Node{{Name: "plain1", Port: 5701}, {Name: "plain2", Port: 5702}, {Name: "plain3", Port: 5703}}
	dir := t.TempDir()
	path := filepath.Join(dir, "amqp-mirror.yaml")
	text := serverConfig("127.0.0.1:5799", filepath.Join(dir, "state"), "warn", nodes)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := productconfig.Load(path, nil)
	if err != nil {
		t.Fatalf("productconfig.Load of\n%s\n: %v", text, err)
	}
	if got, want := cfg.Listen.AMQP, "127.0.0.1:5799"; got != want {
		t.Errorf("listen.amqp: got %q, want %q", got, want)
	}
	if cfg.Listen.Admin != "" || cfg.Cluster.Bind != "" {
		t.Errorf("listen.admin %q, cluster.bind %q: want both empty, no ports beside the AMQP one", cfg.Listen.Admin, cfg.Cluster.Bind)
	}
	if len(cfg.Backends) != len(nodes) {
		t.Fatalf("backends: got %v, want %d", cfg.Backends, len(nodes))
	}
	for i, b := range cfg.Backends {
		if b.Name != nodes[i].Name || b.URL != nodes[i].URL() {
			t.Errorf("backends[%d]: got %s %s, want %s %s", i, b.Name, b.URL, nodes[i].Name, nodes[i].URL())
		}
	}

	cases := []struct {
		queue    string
		mirrored bool
		sync     productconfig.SyncMode
	}{
		{queuePrefix(targetMirror) + "-x-0", true, productconfig.SyncAutomatic},
		{queuePrefix(targetMirror) + "-declare-x", true, productconfig.SyncAutomatic},
		{queuePrefix(targetDirect) + "-x-0", true, productconfig.SyncAutomatic}, // never declared through the proxy; matched all the same
		{syncQueuePrefix + targetMirror, true, productconfig.SyncManual},
		{"other", false, 0},
	}
	for _, c := range cases {
		policy, _ := productconfig.Match(cfg.Policies, "/", c.queue, productconfig.KindQueue, false)
		if got := policy != nil; got != c.mirrored {
			t.Errorf("queue %s: policy matched %v, want %v", c.queue, got, c.mirrored)
			continue
		}
		if policy == nil {
			continue
		}
		d := productconfig.Effective(policy, nil)
		if d.HAMode != productconfig.HAAll || d.SyncMode != c.sync {
			t.Errorf("queue %s: got ha-mode %v ha-sync-mode %v, want all and %v", c.queue, d.HAMode, d.SyncMode, c.sync)
		}
	}
}

// TestPrintMirroredRatios: each row's ratio is its median over direct's median, the
// proxy's CPU per message is given for the amqp-mirror row only, in the measured window
// and over the whole run, and every row has the CPU per message of its brokers and proxy
// together, of its brokers over the whole run and of its busiest broker. The proxy's and
// the busiest broker's CPU per message are also given against one node's broker.
func TestPrintMirroredRatios(t *testing.T) {
	run := func(target string, rate, proxyCores float64) runResult {
		busiest := 40.0
		if target == targetDirect {
			busiest = 50
		}
		return runResult{
			Scenario: "mirrored", Target: target, Copies: 3, ConsumeRate: rate, CPU: cpuUse{Broker: 0.6, Proxy: proxyCores},
			Whole: wholeRun{ProxyCPUPerMessage: proxyCores * 300, BrokerCPUPerMessage: 100, BusiestBrokerCPUPerMessage: busiest},
		}
	}
	runs := []runResult{
		run(targetDirect, 9000, 0), run(targetMirror, 4000, 0.2), run(targetNativeHA, 3000, 0),
		run(targetQuorum, 6000, 0), run(targetDirect, 11000, 0), run(targetMirror, 6000, 0.3),
	}
	declares := []declareResult{
		{Kind: declareNamed, Target: targetDirect, Rate: 1000}, {Kind: declareNamed, Target: targetMirror, Rate: 500},
	}
	var out strings.Builder
	cfg := config{publishers: 2, consumers: 2, confirmWindow: 256, prefetch: 256, size: 1024}
	if err := printMirrored(&out, cfg, runs, declares); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		row  string
		want []string // fields of the row, in order
	}{
		{mirroredLabels[targetDirect], []string{"10000", "9000-11000", "1.00", "60 µs", "- / 100 µs / 50 µs", "- / 1.00"}},
		{mirroredLabels[targetMirror], []string{"5000", "4000-6000", "0.50", "50.0 µs", "170 µs", "75.0 µs / 100 µs / 40 µs", "1.50 / 0.80"}},
		{mirroredLabels[targetNativeHA], []string{"3000", "3000", "0.30", "200 µs", "- / 100 µs / 40 µs", "- / 0.80"}},
		{mirroredLabels[targetQuorum], []string{"6000", "6000", "0.60"}},
		{declareNamed, []string{"1000", "500", "0.50"}},
	}
	for _, c := range cases {
		line := lineOf(out.String(), c.row)
		rest := strings.TrimPrefix(line, c.row)
		for _, field := range c.want {
			i := strings.Index(rest, field)
			if i < 0 {
				t.Errorf("row %q: got %q, want %v in that order", c.row, line, c.want)
				break
			}
			rest = rest[i+len(field):]
		}
	}
	// Its figures in µs are the brokers' own CPU per message: all of them in the window
	// and over the whole run, and the busiest one's over the whole run.
	if strings.Count(lineOf(out.String(), mirroredLabels[targetNativeHA]), "µs") != 3 {
		t.Errorf("native-ha row has a proxy CPU per message:\n%s", out.String())
	}
}

func lineOf(text, prefix string) string {
	for l := range strings.Lines(text) {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestBaselineRowFlags: the baseline row and its binary come together, so that a
// comparison never runs one build twice under two names.
func TestBaselineRowFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr bool
	}{
		{name: "neither", args: []string{"-scenario=mirrored"}},
		{name: "both", args: []string{"-scenario=mirrored", "-mirrored-targets=direct,amqp-mirror,amqp-mirror-baseline", "-amqp-mirror-baseline-bin=/tmp/old"}},
		{name: "row without binary", args: []string{"-scenario=mirrored", "-mirrored-targets=direct,amqp-mirror-baseline"}, wantErr: true},
		{name: "binary without row", args: []string{"-scenario=mirrored", "-amqp-mirror-baseline-bin=/tmp/old"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args)
			if got := err != nil; got != tt.wantErr {
				t.Errorf("parseFlags(%q): error %v, want an error: %v", tt.args, err, tt.wantErr)
			}
		})
	}
}

// TestWholeRunEachBroker: the whole run gives each broker's CPU per consumed message, in
// the order of the row's nodes, and the largest of them as the busiest broker's.
func TestWholeRunEachBroker(t *testing.T) {
	start := time.Now()
	from := cpuSnapshot{at: start, each: []time.Duration{time.Second, 2 * time.Second, 0}}
	to := cpuSnapshot{
		at:   start.Add(10 * time.Second),
		each: []time.Duration{1500 * time.Millisecond, 3 * time.Second, 800 * time.Millisecond},
	}
	to.broker = to.each[0] + to.each[1] + to.each[2]
	from.broker = from.each[0] + from.each[1] + from.each[2]
	w := wholeRun{Consumed: 10_000}
	w.measure(watched{brokers: []int{1, 2, 3}}, from, to)
	if got, want := eachBrokerCPU(w), "50 / 100 / 80"; got != want {
		t.Errorf("each broker's CPU per message = %q, want %q", got, want)
	}
	if w.BusiestBrokerCPUPerMessage != 100 {
		t.Errorf("busiest broker's CPU per message = %v µs, want 100", w.BusiestBrokerCPUPerMessage)
	}
	if math.Abs(w.BrokerCPUPerMessage-230) > 1e-6 {
		t.Errorf("brokers' CPU per message = %v µs, want 230", w.BrokerCPUPerMessage)
	}
	if got := eachBrokerCPU(wholeRun{}); got != "-" {
		t.Errorf("a run without brokers gives %q, want -", got)
	}
}
