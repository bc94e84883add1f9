package admin

import (
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Metrics is what the proxy registers its gauges and counters into. Values
// are read through the functions at scrape time, so the proxy keeps its own
// atomic counters and nothing here sits on its hot path.
type Metrics interface {
	// Gauge registers a value that goes up and down. name may carry
	// constant labels: amqp_mirror_backend_up{backend="rabbit1"}.
	Gauge(name, help string, value func() float64)
	// Counter registers a value that only goes up.
	Counter(name, help string, value func() float64)
}

// Registry is the Metrics implementation served at /metrics in the
// Prometheus text format (version 0.0.4), written by hand.
type Registry struct {
	mu      sync.Mutex
	metrics map[string]*family // by base name
}

type family struct {
	help, kind string
	series     map[string]func() float64 // by full name with labels
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{metrics: map[string]*family{}} }

var metricName = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})?$`)

// Gauge implements Metrics. An invalid name, or one registered earlier with
// another kind, panics: both are programming errors.
func (r *Registry) Gauge(name, help string, value func() float64) {
	r.register(name, help, "gauge", value)
}

// Counter implements Metrics.
func (r *Registry) Counter(name, help string, value func() float64) {
	r.register(name, help, "counter", value)
}

func (r *Registry) register(name, help, kind string, value func() float64) {
	m := metricName.FindStringSubmatch(name)
	if m == nil {
		panic(fmt.Sprintf("admin: invalid metric name %q", name))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.metrics[m[1]]
	if f == nil {
		f = &family{help: help, kind: kind, series: map[string]func() float64{}}
		r.metrics[m[1]] = f
	}
	if f.kind != kind {
		panic(fmt.Sprintf("admin: metric %s registered as %s and %s", m[1], f.kind, kind))
	}
	f.series[name] = value
}

// WriteTo writes every metric, families and series sorted by name. The
// value functions run without the registry lock, so one that registers a
// metric cannot deadlock a scrape.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	type series struct {
		name  string
		value func() float64
	}
	type snapshot struct {
		name, help, kind string
		series           []series
	}
	r.mu.Lock()
	families := make([]snapshot, 0, len(r.metrics))
	for name, f := range r.metrics {
		fs := snapshot{name: name, help: f.help, kind: f.kind}
		for s, v := range f.series {
			fs.series = append(fs.series, series{s, v})
		}
		sort.Slice(fs.series, func(i, j int) bool { return fs.series[i].name < fs.series[j].name })
		families = append(families, fs)
	}
	r.mu.Unlock()
	sort.Slice(families, func(i, j int) bool { return families[i].name < families[j].name })

	var b strings.Builder
	for _, f := range families {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, escapeHelp(f.help), f.name, f.kind)
		for _, s := range f.series {
			b.WriteString(s.name + " " + formatValue(s.value()) + "\n")
		}
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
