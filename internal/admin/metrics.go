package admin

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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

// Registry is the Metrics implementation served at /metrics, built on
// prometheus/client_golang: a registry of its own (never the global
// default, so two servers in one process or test do not collide) holding
// the Go runtime and process collectors beside amqp-mirror's values.
type Registry struct {
	registry *prometheus.Registry
}

// NewRegistry returns a registry with the Go runtime (go_*) and process
// (process_*) collectors and nothing of amqp-mirror's yet.
func NewRegistry() *Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return &Registry{registry: r}
}

// Gauge implements Metrics. An invalid name, a series registered twice, or
// a name registered earlier with another kind or help panics: all are
// programming errors.
func (r *Registry) Gauge(name, help string, value func() float64) {
	r.register(name, help, prometheus.GaugeValue, value)
}

// Counter implements Metrics.
func (r *Registry) Counter(name, help string, value func() float64) {
	r.register(name, help, prometheus.CounterValue, value)
}

// Gatherer returns what Handler serves, for tests and for embedding the
// metrics in another registry.
func (r *Registry) Gatherer() prometheus.Gatherer { return r.registry }

// Handler serves the registry in the format the scraper asks for (the
// Prometheus text format by default, OpenMetrics on request). A collector
// that fails leaves its metrics out of the answer rather than failing the
// whole scrape.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

var (
	seriesName = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$`)
	labelPair  = regexp.MustCompile(`^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?`)
)

func (r *Registry) register(name, help string, kind prometheus.ValueType, value func() float64) {
	m := seriesName.FindStringSubmatch(name)
	if m == nil {
		panic(fmt.Sprintf("admin: invalid metric name %q", name))
	}
	labels := prometheus.Labels{}
	for rest := m[2]; rest != ""; {
		pair := labelPair.FindStringSubmatch(rest)
		if pair == nil {
			panic(fmt.Sprintf("admin: invalid labels in metric name %q", name))
		}
		labels[pair[1]] = unescapeLabel(pair[2])
		rest = rest[len(pair[0]):]
	}
	r.registry.MustRegister(&valueCollector{
		desc:  prometheus.NewDesc(m[1], help, nil, labels),
		kind:  kind,
		value: value,
	})
}

func unescapeLabel(s string) string {
	return strings.NewReplacer(`\\`, `\`, `\"`, `"`, `\n`, "\n").Replace(s)
}

// valueCollector is one series whose value is read from the proxy (or the
// policy store) when Prometheus scrapes, so keeping the number costs the
// proxy no more than the atomic it already has.
type valueCollector struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func() float64
}

func (c *valueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *valueCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, c.kind, c.value())
}
