package mirror

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// queue builds metadata for tables: the master, then the slaves in join
// order, a trailing "+" marking a synchronised slave ("rabbit2+").
func queue(master string, slaves ...string) QueueMeta {
	m := QueueMeta{ID: QueueID{VHost: "/", Name: "q"}, Master: master, Durable: true, Arguments: []byte{0, 0, 0, 0}, Version: 7}
	for _, s := range slaves {
		name, synced := strings.CutSuffix(s, "+")
		m.Slaves = append(m.Slaves, Slave{Backend: name, Synchronised: synced})
	}
	return m
}

// describe prints metadata the way queue takes it, for got/want messages.
func describe(m QueueMeta) string {
	parts := []string{"master " + m.Master}
	for _, s := range m.Slaves {
		if s.Synchronised {
			parts = append(parts, s.Backend+"+")
		} else {
			parts = append(parts, s.Backend)
		}
	}
	return fmt.Sprintf("%s, epoch %d", strings.Join(parts, " "), m.Epoch)
}

// withEpoch returns m with its epoch set.
func withEpoch(m QueueMeta, epoch uint64) QueueMeta { m.Epoch = epoch; return m }

// checkUntouched fails when a decision changed the metadata it was given.
func checkUntouched(t *testing.T, before, after QueueMeta) {
	t.Helper()
	if !reflect.DeepEqual(before, after) {
		t.Errorf("decision changed its input: before %s (%+v), after %s (%+v)", describe(before), before, describe(after), after)
	}
}

// checkMeta compares a decision's metadata with want on what decisions
// change (master, slaves, epoch) and checks that the rest was carried over.
func checkMeta(t *testing.T, got, want QueueMeta) {
	t.Helper()
	if got.Master != want.Master || got.Epoch != want.Epoch || !slices.Equal(got.Slaves, want.Slaves) {
		t.Errorf("metadata = %s, want %s", describe(got), describe(want))
	}
	if got.ID != want.ID || got.Durable != want.Durable || !slices.Equal(got.Arguments, want.Arguments) || got.Version != want.Version {
		t.Errorf("metadata lost its declaration: got %+v", got)
	}
}

func def(mode config.HAMode) config.Definition { return config.Definition{HAMode: mode} }

func exactly(n int) config.Definition {
	return config.Definition{HAMode: config.HAExactly, HAParams: config.HAParams{Count: n}}
}

func nodes(names ...string) config.Definition {
	return config.Definition{HAMode: config.HANodes, HAParams: config.HAParams{Nodes: names}}
}

func automatic(d config.Definition) config.Definition { d.SyncMode = config.SyncAutomatic; return d }

func TestReconcile(t *testing.T) {
	four := []string{"rabbit1", "rabbit2", "rabbit3", "rabbit4"}
	tests := []struct {
		name     string
		meta     QueueMeta
		def      config.Definition
		backends []string // seedBackends when nil
		live     []string // every backend when nil
		want     QueueMeta
		add      []string
		drop     []string
		handOver HandOver
		sync     []string
	}{
		// The seed's walkthrough: policy ^queue_ with ha-mode all on
		// queue_1..3 mastered on rabbit1..3; slaves join in ring order.
		{name: "seed: all, queue_1 on rabbit1", meta: queue("rabbit1"), def: def(config.HAAll),
			want: queue("rabbit1", "rabbit2", "rabbit3"), add: []string{"rabbit2", "rabbit3"}},
		{name: "seed: all, queue_2 on rabbit2", meta: queue("rabbit2"), def: def(config.HAAll),
			want: queue("rabbit2", "rabbit3", "rabbit1"), add: []string{"rabbit3", "rabbit1"}},
		{name: "seed: all, queue_3 on rabbit3", meta: queue("rabbit3"), def: def(config.HAAll),
			want: queue("rabbit3", "rabbit1", "rabbit2"), add: []string{"rabbit1", "rabbit2"}},
		{name: "all: already mirrored everywhere, nothing to do", meta: queue("rabbit1", "rabbit3+", "rabbit2"), def: def(config.HAAll),
			want: queue("rabbit1", "rabbit3+", "rabbit2")},
		{name: "all: a dead backend gets no slave yet", meta: queue("rabbit1"), def: def(config.HAAll), live: []string{"rabbit1", "rabbit3"},
			want: queue("rabbit1", "rabbit3"), add: []string{"rabbit3"}},
		{name: "all: a backend that joins gets a slave, youngest", meta: queue("rabbit1", "rabbit3+"), def: def(config.HAAll),
			want: queue("rabbit1", "rabbit3+", "rabbit2"), add: []string{"rabbit2"}},
		{name: "all: a slave on a dead backend stays", meta: queue("rabbit1", "rabbit2", "rabbit3+"), def: def(config.HAAll), live: []string{"rabbit1", "rabbit3"},
			want: queue("rabbit1", "rabbit2", "rabbit3+")},
		{name: "all, automatic: new and unsynchronised live slaves sync now", meta: queue("rabbit1", "rabbit2"), def: automatic(def(config.HAAll)), backends: four, live: []string{"rabbit1", "rabbit2", "rabbit3"},
			want: queue("rabbit1", "rabbit2", "rabbit3"), add: []string{"rabbit3"}, sync: []string{"rabbit2", "rabbit3"}},
		{name: "manual to automatic: existing unsynchronised slave syncs, dead one does not", meta: queue("rabbit1", "rabbit2+", "rabbit3", "rabbit4"), def: automatic(def(config.HAAll)), backends: four, live: []string{"rabbit1", "rabbit2", "rabbit3"},
			want: queue("rabbit1", "rabbit2+", "rabbit3", "rabbit4"), sync: []string{"rabbit3"}},

		{name: "no policy: master only", meta: queue("rabbit1"), def: config.Definition{},
			want: queue("rabbit1")},
		{name: "policy removed: every slave dropped", meta: queue("rabbit2", "rabbit3+", "rabbit1"), def: config.Definition{},
			want: queue("rabbit2"), drop: []string{"rabbit3", "rabbit1"}},

		{name: "exactly 2: one slave, next in ring order", meta: queue("rabbit2"), def: exactly(2),
			want: queue("rabbit2", "rabbit3"), add: []string{"rabbit3"}},
		{name: "exactly 1: master only", meta: queue("rabbit1", "rabbit2+"), def: exactly(1),
			want: queue("rabbit1"), drop: []string{"rabbit2"}},
		{name: "exactly 5 on 3 backends: every backend", meta: queue("rabbit1"), def: exactly(5),
			want: queue("rabbit1", "rabbit2", "rabbit3"), add: []string{"rabbit2", "rabbit3"}},
		{name: "exactly 2: lost slave replaced on another live backend", meta: queue("rabbit1", "rabbit2+"), def: exactly(2), live: []string{"rabbit1", "rabbit3"},
			want: queue("rabbit1", "rabbit3"), add: []string{"rabbit3"}, drop: []string{"rabbit2"}},
		{name: "exactly 2: lost slave kept when no backend is free", meta: queue("rabbit1", "rabbit2"), def: exactly(2), backends: []string{"rabbit1", "rabbit2"}, live: []string{"rabbit1"},
			want: queue("rabbit1", "rabbit2")},
		{name: "exactly 3 of 4: replacement takes the dead slave's slot, live slave stays", meta: queue("rabbit1", "rabbit2", "rabbit3+"), def: exactly(3), backends: four, live: []string{"rabbit1", "rabbit3", "rabbit4"},
			want: queue("rabbit1", "rabbit3+", "rabbit4"), add: []string{"rabbit4"}, drop: []string{"rabbit2"}},
		{name: "exactly 3 of 4: two dead slaves, one replacement, the oldest dead slave keeps a slot", meta: queue("rabbit1", "rabbit2", "rabbit3"), def: exactly(3), backends: four, live: []string{"rabbit1", "rabbit4"},
			want: queue("rabbit1", "rabbit2", "rabbit4"), add: []string{"rabbit4"}, drop: []string{"rabbit3"}},
		{name: "exactly lowered from 3 to 2: youngest slave dropped", meta: queue("rabbit1", "rabbit2+", "rabbit3+"), def: exactly(2),
			want: queue("rabbit1", "rabbit2+"), drop: []string{"rabbit3"}},
		{name: "exactly 2: returned slave beyond the count is dropped, the replacement stays", meta: queue("rabbit1", "rabbit3+", "rabbit2"), def: exactly(2),
			want: queue("rabbit1", "rabbit3+"), drop: []string{"rabbit2"}},
		{name: "exactly 2, automatic: the replacement syncs", meta: queue("rabbit3", "rabbit1"), def: automatic(exactly(2)), live: []string{"rabbit2", "rabbit3"},
			want: queue("rabbit3", "rabbit2"), add: []string{"rabbit2"}, drop: []string{"rabbit1"}, sync: []string{"rabbit2"}},

		{name: "nodes: slaves on the named backends only", meta: queue("rabbit1", "rabbit2+", "rabbit3"), def: nodes("rabbit1", "rabbit2"),
			want: queue("rabbit1", "rabbit2+"), drop: []string{"rabbit3"}},
		{name: "nodes: names that are not backends are ignored", meta: queue("rabbit1"), def: nodes("rabbit9", "rabbit3", "rabbit1"),
			want: queue("rabbit1", "rabbit3"), add: []string{"rabbit3"}},
		{name: "nodes: only unknown names, master alone", meta: queue("rabbit1", "rabbit2"), def: nodes("rabbit9"),
			want: queue("rabbit1"), drop: []string{"rabbit2"}},
		{name: "nodes: slaves join in ring order, not list order", meta: queue("rabbit2"), def: nodes("rabbit1", "rabbit3", "rabbit2"),
			want: queue("rabbit2", "rabbit3", "rabbit1"), add: []string{"rabbit3", "rabbit1"}},
		{name: "nodes: master not named stays until a named slave is synchronised", meta: queue("rabbit1"), def: nodes("rabbit2", "rabbit3"),
			want: queue("rabbit1", "rabbit2", "rabbit3"), add: []string{"rabbit2", "rabbit3"}},
		{name: "nodes: master not named, unsynchronised slaves: still no hand-over", meta: queue("rabbit1", "rabbit2", "rabbit3"), def: nodes("rabbit2", "rabbit3"),
			want: queue("rabbit1", "rabbit2", "rabbit3")},
		{name: "nodes: hand-over to the oldest synchronised named slave", meta: queue("rabbit1", "rabbit2", "rabbit3+"), def: nodes("rabbit2", "rabbit3"),
			want: withEpoch(queue("rabbit3", "rabbit2"), 1), drop: []string{"rabbit1"}, handOver: HandOver{From: "rabbit1", To: "rabbit3"}},
		{name: "nodes: hand-over picks join order over list order", meta: withEpoch(queue("rabbit1", "rabbit2+", "rabbit3+"), 4), def: nodes("rabbit3", "rabbit2"),
			want: withEpoch(queue("rabbit2", "rabbit3+"), 5), drop: []string{"rabbit1"}, handOver: HandOver{From: "rabbit1", To: "rabbit2"}},
		{name: "nodes: hand-over skips a synchronised slave on a dead backend", meta: queue("rabbit1", "rabbit2+", "rabbit3"), def: nodes("rabbit2", "rabbit3"), live: []string{"rabbit1", "rabbit3"},
			want: queue("rabbit1", "rabbit2+", "rabbit3")},
		{name: "nodes: hand-over skips a synchronised slave not named, which is dropped", meta: queue("rabbit1", "rabbit2+", "rabbit3+"), def: nodes("rabbit3"), backends: four,
			want: withEpoch(queue("rabbit3"), 1), drop: []string{"rabbit2", "rabbit1"}, handOver: HandOver{From: "rabbit1", To: "rabbit3"}},
		{name: "nodes: after hand-over new named slaves ring after the new master", meta: queue("rabbit1", "rabbit2+"), def: nodes("rabbit2", "rabbit3", "rabbit4"), backends: four,
			want: withEpoch(queue("rabbit2", "rabbit3", "rabbit4"), 1), add: []string{"rabbit3", "rabbit4"}, drop: []string{"rabbit1"}, handOver: HandOver{From: "rabbit1", To: "rabbit2"}},

		{name: "master not live: nothing changes until Promote", meta: queue("rabbit1", "rabbit2+"), def: config.Definition{}, live: []string{"rabbit2", "rabbit3"},
			want: queue("rabbit1", "rabbit2+")},
		{name: "slave on a backend no longer configured is dropped", meta: queue("rabbit1", "rabbit9+", "rabbit2"), def: def(config.HAAll), live: []string{"rabbit1", "rabbit2", "rabbit3", "rabbit9"},
			want: queue("rabbit1", "rabbit2", "rabbit3"), add: []string{"rabbit3"}, drop: []string{"rabbit9"}},
		{name: "a slave entry naming the master or listed twice leaves, its copy is not deleted", meta: queue("rabbit1", "rabbit1", "rabbit2+", "rabbit2"), def: def(config.HAAll),
			want: queue("rabbit1", "rabbit2+", "rabbit3"), add: []string{"rabbit3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			backends := tt.backends
			if backends == nil {
				backends = seedBackends
			}
			live := NewLiveSet(backends...)
			if tt.live != nil {
				live = NewLiveSet(tt.live...)
			}
			before := tt.meta.Clone()
			plan := Reconcile(tt.meta, tt.def, backends, live)
			checkUntouched(t, before, tt.meta)
			checkMeta(t, plan.Meta, tt.want)
			if !slices.Equal(plan.Add, tt.add) {
				t.Errorf("Add = %v, want %v", plan.Add, tt.add)
			}
			if !slices.Equal(plan.Drop, tt.drop) {
				t.Errorf("Drop = %v, want %v", plan.Drop, tt.drop)
			}
			if plan.HandOver != tt.handOver {
				t.Errorf("HandOver = %+v, want %+v", plan.HandOver, tt.handOver)
			}
			if !slices.Equal(plan.Sync, tt.sync) {
				t.Errorf("Sync = %v, want %v", plan.Sync, tt.sync)
			}
			wantChanged := len(tt.add) > 0 || len(tt.drop) > 0 || tt.handOver.To != ""
			if plan.Changed() != wantChanged {
				t.Errorf("Changed() = %v, want %v", plan.Changed(), wantChanged)
			}
			// A plan carried out is stable: reconciling its result again
			// changes nothing more.
			again := Reconcile(plan.Meta, tt.def, backends, live)
			if again.Changed() {
				t.Errorf("second Reconcile not empty: add %v drop %v hand-over %+v, from %s", again.Add, again.Drop, again.HandOver, describe(plan.Meta))
			}
		})
	}
}

// Reconcile shares no slice with its input: appending to the plan's
// slaves does not show in the metadata it read.
func TestReconcileDoesNotAliasInput(t *testing.T) {
	m := queue("rabbit1", "rabbit2+")
	m.Slaves = slices.Grow(m.Slaves, 4) // room that an append would reuse
	before := m.Clone()
	plan := Reconcile(m, def(config.HAAll), seedBackends, NewLiveSet(seedBackends...))
	plan.Meta.Slaves[0].Synchronised = false
	checkUntouched(t, before, m)
	if got := m.Slaves[:cap(m.Slaves)][1]; got.Backend != "" {
		t.Errorf("Reconcile wrote %+v into the spare capacity of its input", got)
	}
}
