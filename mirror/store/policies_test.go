package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

func runtimePolicy(t *testing.T, name, pattern string, priority int) config.Policy {
	t.Helper()
	p, err := config.Policy{Name: name, VHost: "/", Pattern: pattern, Priority: priority, ApplyTo: config.ApplyQueues,
		Definition: config.Definition{HAMode: config.HAAll}}.Validated(false)
	if err != nil {
		t.Fatal(err)
	}
	p.Source = config.SourceRuntime
	return p
}

func names(list []config.Policy) string {
	var out []string
	for _, p := range list {
		out = append(out, p.Name)
	}
	return strings.Join(out, ",")
}

// The runtime policies' state machine, change by change: what each
// operation leaves, and which are refused.
func TestRuntimePoliciesApply(t *testing.T) {
	a, b := runtimePolicy(t, "a", "^a", 0), runtimePolicy(t, "b", "^b", 0)
	aAgain := runtimePolicy(t, "a", "^a2", 5)
	start := RuntimePolicies{Policies: []config.Policy{bare(a)}, OperatorPolicies: nil, Index: 3}
	tests := []struct {
		name         string
		state        RuntimePolicies
		change       PolicyChange
		wantPolicies string
		wantOperator string
		wantIndex    uint64
		wantChanged  bool
		wantErr      error
	}{
		{name: "set a new policy", state: start, change: PolicyChange{Op: PolicySet, Policy: &b},
			wantPolicies: "a,b", wantIndex: 10, wantChanged: true},
		{name: "set replaces the policy of the same vhost and name", state: start, change: PolicyChange{Op: PolicySet, Policy: &aAgain},
			wantPolicies: "a", wantIndex: 10, wantChanged: true},
		{name: "set an operator policy", state: start, change: PolicyChange{Op: PolicySet, Policy: &b, Operator: true},
			wantPolicies: "a", wantOperator: "b", wantIndex: 10, wantChanged: true},
		{name: "clear", state: start, change: PolicyChange{Op: PolicyClear, VHost: "/", Name: "a"},
			wantPolicies: "", wantIndex: 10, wantChanged: true},
		{name: "clear in the default vhost", state: start, change: PolicyChange{Op: PolicyClear, Name: "a"},
			wantPolicies: "", wantIndex: 10, wantChanged: true},
		{name: "clear of a missing policy", state: start, change: PolicyChange{Op: PolicyClear, VHost: "/", Name: "b"},
			wantPolicies: "a", wantIndex: 3, wantErr: config.ErrPolicyNotFound},
		{name: "clear of a user policy among operator policies", state: start, change: PolicyChange{Op: PolicyClear, VHost: "/", Name: "a", Operator: true},
			wantPolicies: "a", wantIndex: 3, wantErr: config.ErrPolicyNotFound},
		{name: "import into an empty log", state: RuntimePolicies{},
			change:       PolicyChange{Op: PolicyImport, Import: &RuntimePolicies{Policies: []config.Policy{a, b}, OperatorPolicies: []config.Policy{b}}},
			wantPolicies: "a,b", wantOperator: "b", wantIndex: 10, wantChanged: true},
		{name: "import once the log has policies", state: start,
			change:       PolicyChange{Op: PolicyImport, Import: &RuntimePolicies{Policies: []config.Policy{b}}},
			wantPolicies: "a", wantIndex: 3},
		{name: "import after every policy was cleared", state: RuntimePolicies{Index: 7},
			change:    PolicyChange{Op: PolicyImport, Import: &RuntimePolicies{Policies: []config.Policy{b}}},
			wantIndex: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := tt.state.Clone()
			res, err := state.apply(tt.change, 10)
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if res.Changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", res.Changed, tt.wantChanged)
			}
			if got := names(state.Policies); got != tt.wantPolicies {
				t.Errorf("policies = %q, want %q", got, tt.wantPolicies)
			}
			if got := names(state.OperatorPolicies); got != tt.wantOperator {
				t.Errorf("operator policies = %q, want %q", got, tt.wantOperator)
			}
			if state.Index != tt.wantIndex {
				t.Errorf("index = %d, want %d", state.Index, tt.wantIndex)
			}
			for _, p := range append(state.Policies, state.OperatorPolicies...) {
				if p.Source != "" || p.OverridesFile {
					t.Errorf("policy %s kept its source %q (overrides_file %v); the log holds bare policies", p.Name, p.Source, p.OverridesFile)
				}
			}
		})
	}
}

// A deleted queue leaves a tombstone naming its copies; a new declaration
// removes it; past MaxTombstones the oldest goes.
func TestTombstones(t *testing.T) {
	f := newMetaFSM()
	apply := func(index uint64, cmd command) applyResult {
		t.Helper()
		data, err := cmd.encode()
		if err != nil {
			t.Fatal(err)
		}
		res, _ := f.Apply(&raft.Log{Index: index, Data: data, AppendedAt: time.Unix(int64(index), 0)}).(applyResult)
		return res
	}
	put := func(index uint64, m mirror.QueueMeta) mirror.QueueMeta {
		t.Helper()
		res := apply(index, command{Op: opPut, Meta: &m})
		if res.err != nil {
			t.Fatalf("put %s: %v", m.ID, res.err)
		}
		return *res.meta
	}
	m := put(1, testMeta("queue_1", "rabbit1", "rabbit2", "rabbit3"))
	if res := apply(2, command{Op: opDelete, ID: m.ID, Expect: m.Version}); res.err != nil {
		t.Fatal(res.err)
	}
	ts, ok := f.tombstone(m.ID)
	if !ok || fmt.Sprint(ts.Backends) != "[rabbit1 rabbit2 rabbit3]" || ts.Index != 2 || !ts.At.Equal(time.Unix(2, 0)) {
		t.Fatalf("tombstone = %+v, %v; want rabbit1..3 at index 2, appended at 2s", ts, ok)
	}
	if res := apply(3, command{Op: opDelete, ID: m.ID, Expect: m.Version}); !errors.Is(res.err, ErrConflict) {
		t.Errorf("second delete: err = %v, want ErrConflict", res.err)
	}
	put(4, testMeta("queue_1", "rabbit2"))
	if ts, ok := f.tombstone(m.ID); ok {
		t.Errorf("tombstone %+v kept after the queue was declared again", ts)
	}

	index := uint64(10)
	for i := range MaxTombstones + 1 {
		m := put(index, testMeta(fmt.Sprintf("bulk_%05d", i), "rabbit1"))
		apply(index+1, command{Op: opDelete, ID: m.ID, Expect: m.Version})
		index += 2
	}
	if got := len(f.listTombstones()); got != MaxTombstones {
		t.Errorf("%d tombstones after %d deletes, want the bound %d", got, MaxTombstones+1, MaxTombstones)
	}
	if _, ok := f.tombstone(mirror.QueueID{VHost: "/", Name: "bulk_00000"}); ok {
		t.Error("the oldest tombstone is kept past the bound")
	}
	if _, ok := f.tombstone(mirror.QueueID{VHost: "/", Name: fmt.Sprintf("bulk_%05d", MaxTombstones)}); !ok {
		t.Error("the newest tombstone is missing")
	}
}

// Runtime policies and tombstones survive a restart, replayed from the log
// or restored from a snapshot; a snapshot written before they were in the
// log (a bare array of queues) still restores.
func TestPoliciesAndTombstonesSurviveRestart(t *testing.T) {
	for _, snapshot := range []bool{false, true} {
		t.Run(fmt.Sprintf("snapshot=%v", snapshot), func(t *testing.T) {
			dir := t.TempDir()
			s := openTestStore(t, dir)
			ctx := context.Background()
			p := runtimePolicy(t, "ha-all", "^queue_", 0)
			set, err := s.ChangePolicies(ctx, PolicyChange{Op: PolicySet, Policy: &p})
			if err != nil {
				t.Fatal(err)
			}
			written, err := s.Put(ctx, testMeta("queue_1", "rabbit1", "rabbit2"), 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, written.ID, written.Version); err != nil {
				t.Fatal(err)
			}
			if snapshot {
				if err := s.Snapshot(); err != nil {
					t.Fatal(err)
				}
			}
			s.Close()

			s = openTestStore(t, dir)
			if err := s.WaitApplied(ctx, set.Index); err != nil {
				t.Fatal(err)
			}
			if got := s.Policies(); names(got.Policies) != "ha-all" || got.Index != set.Index {
				t.Errorf("policies after the restart = %q at %d, want ha-all at %d", names(got.Policies), got.Index, set.Index)
			}
			ts, ok := s.Tombstone(written.ID)
			if !ok {
				t.Error("the tombstone is gone after the restart")
			}
			// OpenedAt is what the state held before the log was replayed:
			// the snapshot's index, or nothing without one.
			if got, want := s.OpenedAt() >= ts.Index, snapshot; got != want {
				t.Errorf("OpenedAt() = %d with the tombstone at %d: covered %v, want %v", s.OpenedAt(), ts.Index, got, want)
			}
		})
	}

	t.Run("snapshot of an earlier version", func(t *testing.T) {
		f := newMetaFSM()
		old, err := json.Marshal([]mirror.QueueMeta{testMeta("queue_1", "rabbit1")})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Restore(io.NopCloser(strings.NewReader(string(old)))); err != nil {
			t.Fatal(err)
		}
		if _, ok := f.get(mirror.QueueID{VHost: "/", Name: "queue_1"}); !ok {
			t.Error("the queue of an old snapshot is not restored")
		}
		if got := f.runtimePolicies(); got.Index != 0 {
			t.Errorf("an old snapshot restores runtime policies at index %d, want none", got.Index)
		}
	})
}
