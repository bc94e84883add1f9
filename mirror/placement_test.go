package mirror

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// errAny in a table accepts any non-nil error.
var errAny = errors.New("any error")

// The seed's cluster: three backends, configured in this order.
var seedBackends = []string{"rabbit1", "rabbit2", "rabbit3"}

func TestResolveLocator(t *testing.T) {
	policy := func(l config.Locator) config.Definition { return config.Definition{QueueMasterLocator: l} }
	tests := []struct {
		name       string
		argument   string
		policy     config.Definition
		configured config.Locator
		want       config.Locator
		wantErr    error
	}{
		{name: "nothing set: min-masters", want: config.LocatorMinMasters},
		{name: "config only", configured: config.LocatorRandom, want: config.LocatorRandom},
		{name: "policy beats config", policy: policy(config.LocatorClientLocal), configured: config.LocatorRandom, want: config.LocatorClientLocal},
		{name: "argument beats policy and config", argument: "random", policy: policy(config.LocatorClientLocal), configured: config.LocatorMinMasters, want: config.LocatorRandom},
		{name: "argument client-local", argument: "client-local", want: config.LocatorClientLocal},
		{name: "argument min-masters", argument: "min-masters", configured: config.LocatorRandom, want: config.LocatorMinMasters},
		{name: "unknown argument refused", argument: "least-leaders", wantErr: ErrUnknownLocator},
		{name: "argument with underscore refused", argument: "min_masters", wantErr: ErrUnknownLocator},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ResolveLocator(tt.argument, tt.policy, tt.configured)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ResolveLocator(%q) error = %v, want %v", tt.argument, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ResolveLocator(%q) = %s, want %s", tt.argument, got, tt.want)
			}
		})
	}
}

func TestPlacementMaster(t *testing.T) {
	allLive := NewLiveSet(seedBackends...)
	always := func(i int) func(int) int { return func(int) int { return i } }
	tests := []struct {
		name      string
		placement Placement
		locator   config.Locator
		want      string
		wantErr   error
	}{
		{
			name:      "min-masters: fewest masters",
			placement: Placement{Backends: seedBackends, Live: allLive, Masters: map[string]int{"rabbit1": 2, "rabbit2": 1, "rabbit3": 3}},
			locator:   config.LocatorMinMasters,
			want:      "rabbit2",
		},
		{
			name:      "min-masters: ties go to the first configured",
			placement: Placement{Backends: seedBackends, Live: allLive, Masters: map[string]int{"rabbit1": 1, "rabbit2": 0, "rabbit3": 0}},
			locator:   config.LocatorMinMasters,
			want:      "rabbit2",
		},
		{
			name:      "min-masters: no queues yet",
			placement: Placement{Backends: seedBackends, Live: allLive},
			locator:   config.LocatorMinMasters,
			want:      "rabbit1",
		},
		{
			name:      "min-masters: a dead backend is never chosen",
			placement: Placement{Backends: seedBackends, Live: NewLiveSet("rabbit1", "rabbit3"), Masters: map[string]int{"rabbit1": 4, "rabbit3": 5}},
			locator:   config.LocatorMinMasters,
			want:      "rabbit1",
		},
		{
			name:      "unset locator is min-masters",
			placement: Placement{Backends: seedBackends, Live: allLive, Masters: map[string]int{"rabbit1": 1}},
			want:      "rabbit2",
		},
		{
			name:      "client-local: the proxy's own backend",
			placement: Placement{Backends: seedBackends, Live: allLive, Masters: map[string]int{"rabbit3": 9}, ClientNode: "rabbit3"},
			locator:   config.LocatorClientLocal,
			want:      "rabbit3",
		},
		{
			name:      "client-local: own backend down falls back to min-masters",
			placement: Placement{Backends: seedBackends, Live: NewLiveSet("rabbit1", "rabbit2"), Masters: map[string]int{"rabbit1": 1}, ClientNode: "rabbit3"},
			locator:   config.LocatorClientLocal,
			want:      "rabbit2",
		},
		{
			name:      "client-local: drop-in proxy without node falls back to min-masters",
			placement: Placement{Backends: seedBackends, Live: allLive, Masters: map[string]int{"rabbit1": 1, "rabbit2": 1}},
			locator:   config.LocatorClientLocal,
			want:      "rabbit3",
		},
		{
			name:      "client-local: node that is not a configured backend falls back",
			placement: Placement{Backends: seedBackends, Live: NewLiveSet("rabbit1", "rabbit2", "rabbit3", "rabbit9"), ClientNode: "rabbit9"},
			locator:   config.LocatorClientLocal,
			want:      "rabbit1",
		},
		{
			name:      "random: index into the live backends",
			placement: Placement{Backends: seedBackends, Live: allLive, Random: always(2)},
			locator:   config.LocatorRandom,
			want:      "rabbit3",
		},
		{
			name:      "random: dead backends are skipped",
			placement: Placement{Backends: seedBackends, Live: NewLiveSet("rabbit1", "rabbit3"), Random: always(1)},
			locator:   config.LocatorRandom,
			want:      "rabbit3",
		},
		{
			name:      "random: nil source picks the first live",
			placement: Placement{Backends: seedBackends, Live: NewLiveSet("rabbit2", "rabbit3")},
			locator:   config.LocatorRandom,
			want:      "rabbit2",
		},
		{
			name:      "random: a source out of range is an error, not a panic",
			placement: Placement{Backends: seedBackends, Live: allLive, Random: always(3)},
			locator:   config.LocatorRandom,
			wantErr:   errAny,
		},
		{
			name:      "nothing live",
			placement: Placement{Backends: seedBackends, Live: NewLiveSet("rabbit9")},
			locator:   config.LocatorMinMasters,
			wantErr:   ErrNoLiveBackend,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.placement.Master(tt.locator)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("Master(%s) error = %v, want none", tt.locator, err)
			case tt.wantErr != nil && err == nil:
				t.Fatalf("Master(%s) = %q, want error %v", tt.locator, got, tt.wantErr)
			case tt.wantErr != errAny && !errors.Is(err, tt.wantErr):
				t.Fatalf("Master(%s) error = %v, want %v", tt.locator, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("Master(%s) = %q, want %q", tt.locator, got, tt.want)
			}
		})
	}
}

// Every value of the random source picks a different live backend, so a
// uniform source gives a uniform choice.
func TestPlacementRandomCoversLiveBackends(t *testing.T) {
	backends := []string{"rabbit1", "rabbit2", "rabbit3", "rabbit4"}
	live := NewLiveSet("rabbit1", "rabbit2", "rabbit4")
	var got []string
	for i := range 3 {
		p := Placement{Backends: backends, Live: live, Random: func(n int) int {
			if n != 3 {
				t.Fatalf("random source asked for [0, %d), want [0, 3): one per live backend", n)
			}
			return i
		}}
		b, err := p.Master(config.LocatorRandom)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b)
	}
	if want := []string{"rabbit1", "rabbit2", "rabbit4"}; !slices.Equal(got, want) {
		t.Errorf("random picks 0, 1, 2 = %v, want %v", got, want)
	}
}

// The seed creates queue_1, queue_2, queue_3 one after another; with
// min-masters they land on rabbit1, rabbit2, rabbit3 as in the seed.
func TestPlacementSeedQueuesSpreadWithMinMasters(t *testing.T) {
	var queues []QueueMeta
	for _, name := range []string{"queue_1", "queue_2", "queue_3"} {
		p := Placement{Backends: seedBackends, Live: NewLiveSet(seedBackends...), Masters: CountMasters(queues)}
		master, err := p.Master(config.LocatorMinMasters)
		if err != nil {
			t.Fatal(err)
		}
		queues = append(queues, QueueMeta{ID: QueueID{VHost: "/", Name: name}, Master: master})
	}
	var got []string
	for _, q := range queues {
		got = append(got, q.Master)
	}
	if want := seedBackends; !slices.Equal(got, want) {
		t.Errorf("masters of queue_1..3 = %v, want %v", got, want)
	}
}

func TestCountMasters(t *testing.T) {
	queues := []QueueMeta{
		{Master: "rabbit1"}, {Master: "rabbit2", Slaves: []Slave{{Backend: "rabbit1"}}}, {Master: "rabbit1"},
	}
	got := CountMasters(queues)
	want := map[string]int{"rabbit1": 2, "rabbit2": 1}
	if !maps.Equal(got, want) {
		t.Errorf("CountMasters = %v, want %v (slaves do not count)", got, want)
	}
}

func TestRingAfter(t *testing.T) {
	tests := []struct {
		start string
		want  []string
	}{
		{"rabbit1", []string{"rabbit2", "rabbit3"}},
		{"rabbit2", []string{"rabbit3", "rabbit1"}},
		{"rabbit3", []string{"rabbit1", "rabbit2"}},
		{"gone", []string{"rabbit1", "rabbit2", "rabbit3"}},
	}
	for _, tt := range tests {
		if got := ringAfter(seedBackends, tt.start); !slices.Equal(got, tt.want) {
			t.Errorf("ringAfter(%v, %q) = %v, want %v", seedBackends, tt.start, got, tt.want)
		}
	}
}
