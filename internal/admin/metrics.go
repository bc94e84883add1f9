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

// Metrics is what the proxy, the engine and the cluster register their
// metrics into. Gauges, counters and families are read through functions
// at scrape time, so each part keeps its own atomic counters or state and
// nothing here sits on its hot path; a histogram is the one value kept
// here, since its buckets are the point of it, and observing one is a few
// atomic additions with no lock.
//
// The methods use only built-in types, so that a package that must not
// import this one (proxy, mirror/...) declares the same methods in an
// interface of its own and Registry satisfies it.
type Metrics interface {
	// Gauge registers a value that goes up and down. name may carry
	// constant labels: amqp_mirror_backend_up{backend="rabbit1"}.
	Gauge(name, help string, value func() float64)
	// Counter registers a value that only goes up.
	Counter(name, help string, value func() float64)
	// Histogram registers a distribution with the given bucket upper
	// bounds and returns the function that records one observation. name
	// may carry constant labels, as for Gauge.
	Histogram(name, help string, buckets []float64) (observe func(float64))
	// GaugeFamily registers gauges that share a name and label names but
	// whose series are known only at scrape time (one per queue, per
	// state): collect calls emit once per series, with one value per
	// label, in the order of labels.
	GaugeFamily(name, help string, labels []string, collect func(emit func(value float64, labelValues ...string)))
	// CounterFamily is GaugeFamily for counters.
	CounterFamily(name, help string, labels []string, collect func(emit func(value float64, labelValues ...string)))
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

// Histogram implements Metrics with a prometheus.Histogram, whose Observe
// takes no lock. A name registered twice panics, as for Gauge.
func (r *Registry) Histogram(name, help string, buckets []float64) func(float64) {
	metric, labels := parseSeries(name)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: metric, Help: help, ConstLabels: labels, Buckets: buckets})
	r.registry.MustRegister(h)
	return h.Observe
}

// GaugeFamily implements Metrics. An invalid name or label name panics; a
// series emitted with the wrong number of label values fails that series
// alone at scrape time (Handler serves the rest).
func (r *Registry) GaugeFamily(name, help string, labels []string, collect func(emit func(value float64, labelValues ...string))) {
	r.family(name, help, prometheus.GaugeValue, labels, collect)
}

// CounterFamily implements Metrics.
func (r *Registry) CounterFamily(name, help string, labels []string, collect func(emit func(value float64, labelValues ...string))) {
	r.family(name, help, prometheus.CounterValue, labels, collect)
}

func (r *Registry) family(name, help string, kind prometheus.ValueType, labels []string, collect func(emit func(float64, ...string))) {
	if !metricName.MatchString(name) {
		panic(fmt.Sprintf("admin: invalid metric name %q", name))
	}
	for _, l := range labels {
		if !labelName.MatchString(l) {
			panic(fmt.Sprintf("admin: invalid label name %q of metric %q", l, name))
		}
	}
	r.registry.MustRegister(&familyCollector{
		desc:    prometheus.NewDesc(name, help, labels, nil),
		kind:    kind,
		collect: collect,
	})
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
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

func (r *Registry) register(name, help string, kind prometheus.ValueType, value func() float64) {
	metric, labels := parseSeries(name)
	r.registry.MustRegister(&valueCollector{
		desc:  prometheus.NewDesc(metric, help, nil, labels),
		kind:  kind,
		value: value,
	})
}

// parseSeries splits a series name with constant labels,
// name{label="value",...}, into the metric's name and its labels; one it
// cannot read panics.
func parseSeries(name string) (string, prometheus.Labels) {
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
	return m[1], labels
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

// familyCollector is a family of series whose set is read at scrape time
// (familyCollector.collect), for series that come and go with queues or
// members.
type familyCollector struct {
	desc    *prometheus.Desc
	kind    prometheus.ValueType
	collect func(emit func(float64, ...string))
}

func (c *familyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *familyCollector) Collect(ch chan<- prometheus.Metric) {
	c.collect(func(value float64, labelValues ...string) {
		m, err := prometheus.NewConstMetric(c.desc, c.kind, value, labelValues...)
		if err != nil {
			// A collector that panics would end the process from the
			// scrape's goroutine; an invalid metric fails this series.
			m = prometheus.NewInvalidMetric(c.desc, err)
		}
		ch <- m
	})
}
