package admin

import (
	"strings"
	"testing"
)

// The registry's histograms and families, scraped as Prometheus reads
// them: each case registers into a fresh registry and lists lines the
// scrape must hold and lines it must not.
func TestRegistryKinds(t *testing.T) {
	cases := []struct {
		name     string
		register func(r *Registry)
		want     []string
		absent   []string
	}{
		{
			name: "histogram counts observations into cumulative buckets",
			register: func(r *Registry) {
				observe := r.Histogram("amqp_mirror_test_seconds", "A latency.", []float64{0.01, 0.1, 1})
				observe(0.005)
				observe(0.05)
				observe(0.05)
				observe(5)
			},
			want: []string{
				"# TYPE amqp_mirror_test_seconds histogram",
				`amqp_mirror_test_seconds_bucket{le="0.01"} 1`,
				`amqp_mirror_test_seconds_bucket{le="0.1"} 3`,
				`amqp_mirror_test_seconds_bucket{le="1"} 3`,
				`amqp_mirror_test_seconds_bucket{le="+Inf"} 4`,
				"amqp_mirror_test_seconds_sum 5.105",
				"amqp_mirror_test_seconds_count 4",
			},
		},
		{
			name: "histogram with constant labels",
			register: func(r *Registry) {
				r.Histogram(`amqp_mirror_test_seconds{kind="a"}`, "A latency.", []float64{1})(0.5)
			},
			want: []string{`amqp_mirror_test_seconds_bucket{kind="a",le="1"} 1`, `amqp_mirror_test_seconds_count{kind="a"} 1`},
		},
		{
			name: "histogram without observations is exposed at zero",
			register: func(r *Registry) {
				r.Histogram("amqp_mirror_test_seconds", "A latency.", []float64{1})
			},
			want: []string{`amqp_mirror_test_seconds_bucket{le="+Inf"} 0`, "amqp_mirror_test_seconds_count 0"},
		},
		{
			name: "gauge family emits the series collect names",
			register: func(r *Registry) {
				r.GaugeFamily("amqp_mirror_test_queues", "Queues by state.", []string{"state"}, func(emit func(float64, ...string)) {
					emit(3, "mirrored")
					emit(0, "syncing")
				})
			},
			want: []string{
				"# TYPE amqp_mirror_test_queues gauge",
				`amqp_mirror_test_queues{state="mirrored"} 3`,
				`amqp_mirror_test_queues{state="syncing"} 0`,
			},
		},
		{
			name: "counter family with two labels",
			register: func(r *Registry) {
				r.CounterFamily("amqp_mirror_test_total", "Things.", []string{"vhost", "queue"}, func(emit func(float64, ...string)) {
					emit(7, "/", "q\"1")
				})
			},
			want: []string{"# TYPE amqp_mirror_test_total counter", `amqp_mirror_test_total{queue="q\"1",vhost="/"} 7`},
		},
		{
			name: "family that emits nothing has no series",
			register: func(r *Registry) {
				r.GaugeFamily("amqp_mirror_test_queues", "Queues.", []string{"vhost"}, func(func(float64, ...string)) {})
				r.Gauge("amqp_mirror_test_other", "Other.", func() float64 { return 1 })
			},
			want:   []string{"amqp_mirror_test_other 1"},
			absent: []string{"amqp_mirror_test_queues"},
		},
		{
			name: "a series with the wrong label count fails alone",
			register: func(r *Registry) {
				r.GaugeFamily("amqp_mirror_test_queues", "Queues.", []string{"vhost", "queue"}, func(emit func(float64, ...string)) {
					emit(1, "only-one")
				})
				r.Gauge("amqp_mirror_test_other", "Other.", func() float64 { return 1 })
			},
			want:   []string{"amqp_mirror_test_other 1"},
			absent: []string{"only-one"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry()
			tc.register(r)
			got := scrape(t, r.Handler())
			for _, want := range tc.want {
				if !strings.Contains(got, want+"\n") {
					t.Errorf("scrape lacks %q; got:\n%s", want, got)
				}
			}
			for _, absent := range tc.absent {
				if strings.Contains(got, absent) {
					t.Errorf("scrape holds %q, want it absent; got:\n%s", absent, got)
				}
			}
		})
	}
}

// Names and label names the registry cannot serve are programming errors:
// registering them panics.
func TestRegistryRefusesBadNames(t *testing.T) {
	noop := func(func(float64, ...string)) {}
	cases := []struct {
		name     string
		register func(r *Registry)
	}{
		{"histogram with a dash", func(r *Registry) { r.Histogram("a-b", "x", nil) }},
		{"histogram registered twice", func(r *Registry) {
			r.Histogram("amqp_mirror_test_seconds", "x", nil)
			r.Histogram("amqp_mirror_test_seconds", "x", nil)
		}},
		{"family with labels in its name", func(r *Registry) { r.GaugeFamily(`a{b="c"}`, "x", nil, noop) }},
		{"family with a bad label name", func(r *Registry) { r.GaugeFamily("a", "x", []string{"a-b"}, noop) }},
		{"family named like a gauge", func(r *Registry) {
			r.Gauge("amqp_mirror_test", "x", func() float64 { return 0 })
			r.CounterFamily("amqp_mirror_test", "x", nil, noop)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("accepted, want a panic")
				}
			}()
			tc.register(NewRegistry())
		})
	}
}

// BenchmarkHistogramObserve is the data path's cost of one observation.
func BenchmarkHistogramObserve(b *testing.B) {
	observe := NewRegistry().Histogram("amqp_mirror_test_seconds", "x", []float64{0.001, 0.01, 0.1, 1})
	b.ReportAllocs()
	for b.Loop() {
		observe(0.005)
	}
}
