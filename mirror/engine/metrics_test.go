package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// recordedMetrics is a Metrics that reads every series at once, as a
// scrape does: name{label="value",...} → value.
type recordedMetrics struct {
	mu         sync.Mutex
	values     map[string]func() float64
	families   map[string]func(emit func(float64, ...string))
	labels     map[string][]string
	histograms map[string]*[]float64
}

func newRecordedMetrics() *recordedMetrics {
	return &recordedMetrics{
		values:     map[string]func() float64{},
		families:   map[string]func(emit func(float64, ...string)){},
		labels:     map[string][]string{},
		histograms: map[string]*[]float64{},
	}
}

func (r *recordedMetrics) Counter(name, _ string, value func() float64) { r.values[name] = value }

func (r *recordedMetrics) Histogram(name, _ string, _ []float64) func(float64) {
	observed := &[]float64{}
	r.histograms[name] = observed
	return func(v float64) {
		r.mu.Lock()
		defer r.mu.Unlock()
		*observed = append(*observed, v)
	}
}

func (r *recordedMetrics) GaugeFamily(name, _ string, labels []string, collect func(emit func(float64, ...string))) {
	r.families[name], r.labels[name] = collect, labels
}

func (r *recordedMetrics) CounterFamily(name, help string, labels []string, collect func(emit func(float64, ...string))) {
	r.GaugeFamily(name, help, labels, collect)
}

func (r *recordedMetrics) scrape() map[string]float64 {
	out := map[string]float64{}
	for name, value := range r.values {
		out[name] = value()
	}
	for name, collect := range r.families {
		collect(func(v float64, values ...string) {
			pairs := make([]string, len(values))
			for i, value := range values {
				pairs[i] = fmt.Sprintf("%s=%q", r.labels[name][i], value)
			}
			out[name+"{"+strings.Join(pairs, ",")+"}"] = v
		})
	}
	return out
}

func (r *recordedMetrics) observed(name string) []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]float64(nil), *r.histograms[name]...)
}

// metricsEngine is an engine that is never started, over a store of its
// own: what its metrics read is the store's records and the parts' state.
func metricsEngine(t *testing.T) *Engine {
	t.Helper()
	s, err := store.Open(store.Config{Dir: t.TempDir(), NodeID: "test", Logger: quietLogger(), ElectionTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	policies, err := config.OpenPolicyStore("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := New(Options{Store: s, Policies: policies, Logger: quietLogger()})
	t.Cleanup(e.Close)
	return e
}

// Each recorded queue counts in exactly one state, read from the log's
// records and the syncs running, and per-queue series exist only when
// asked for.
func TestQueueStateMetrics(t *testing.T) {
	records := []mirror.QueueMeta{
		{ID: queueID("alone"), Master: "rabbit1"},
		{ID: queueID("unsynced"), Master: "rabbit1", Slaves: []mirror.Slave{{Backend: "rabbit2"}}},
		{ID: queueID("mirrored"), Master: "rabbit1", Slaves: []mirror.Slave{{Backend: "rabbit2", Synchronised: true}, {Backend: "rabbit3"}}},
		{ID: queueID("mirrored-too"), Master: "rabbit2", Slaves: []mirror.Slave{{Backend: "rabbit3", Synchronised: true}}, Epoch: 4},
		{ID: queueID("syncing"), Master: "rabbit3", Slaves: []mirror.Slave{{Backend: "rabbit1"}}},
	}
	cases := []struct {
		name     string
		perQueue bool
		want     map[string]float64
		absent   []string
	}{
		{
			name: "by state",
			want: map[string]float64{
				`amqp_mirror_queues{state="unmirrored"}`:     1,
				`amqp_mirror_queues{state="unsynchronised"}`: 1,
				`amqp_mirror_queues{state="mirrored"}`:       2,
				`amqp_mirror_queues{state="syncing"}`:        1,
			},
			absent: []string{`amqp_mirror_queue_slaves{vhost="/",queue="alone"}`},
		},
		{
			name:     "per queue",
			perQueue: true,
			want: map[string]float64{
				`amqp_mirror_queue_slaves{vhost="/",queue="alone"}`:                 0,
				`amqp_mirror_queue_slaves{vhost="/",queue="mirrored"}`:              2,
				`amqp_mirror_queue_slaves_synchronised{vhost="/",queue="mirrored"}`: 1,
				`amqp_mirror_queue_slaves_synchronised{vhost="/",queue="unsynced"}`: 0,
				`amqp_mirror_queue_syncing{vhost="/",queue="syncing"}`:              1,
				`amqp_mirror_queue_syncing{vhost="/",queue="mirrored"}`:             0,
				`amqp_mirror_queue_epoch{vhost="/",queue="mirrored-too"}`:           4,
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := metricsEngine(t)
			for _, m := range records {
				if _, err := e.opts.Store.Put(context.Background(), m, 0); err != nil {
					t.Fatal(err)
				}
			}
			e.syncs.mu.Lock()
			e.syncs.entryLocked(queueID("syncing")).run = &syncRun{targets: []string{"rabbit1"}}
			e.syncs.mu.Unlock()
			r := newRecordedMetrics()
			e.RegisterMetrics(r, tc.perQueue)
			got := r.scrape()
			for series, want := range tc.want {
				if v, ok := got[series]; !ok || v != want {
					t.Errorf("%s = %v (present %v), want %v; scrape: %v", series, v, ok, want, got)
				}
			}
			for _, series := range tc.absent {
				if _, ok := got[series]; ok {
					t.Errorf("%s present, want it absent", series)
				}
			}
		})
	}
}

// A promotion counts under its cause, an unsynchronised one also apart,
// and its time since the loss was detected is observed unless it has
// none (a drain).
func TestPromotionMetrics(t *testing.T) {
	e := metricsEngine(t)
	r := newRecordedMetrics()
	e.RegisterMetrics(r, false)
	e.metrics.promoted(causeFailure, true, time.Now().Add(-2*time.Second))
	e.metrics.promoted(causeFailure, false, time.Now().Add(-time.Second))
	e.metrics.promoted(causeShutdown, true, time.Now())
	e.metrics.promoted(causeDrain, true, time.Time{})
	e.metrics.synced(5)
	e.metrics.synced(0)
	got := r.scrape()
	want := map[string]float64{
		`amqp_mirror_promotions_total{cause="failure"}`:  2,
		`amqp_mirror_promotions_total{cause="shutdown"}`: 1,
		`amqp_mirror_promotions_total{cause="drain"}`:    1,
		"amqp_mirror_promotions_unsynchronised_total":    1,
		"amqp_mirror_sync_messages_total":                5,
	}
	for series, w := range want {
		if got[series] != w {
			t.Errorf("%s = %v, want %v", series, got[series], w)
		}
	}
	observed := r.observed("amqp_mirror_promotion_duration_seconds")
	if len(observed) != 3 || observed[0] < 2 || observed[1] < 1 || observed[2] > 1 {
		t.Errorf("promotion durations %v, want about [2 1 0] (the drain not observed)", observed)
	}
}
