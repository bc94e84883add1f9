package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func openStore(t *testing.T, dir string, file []Policy) *PolicyStore {
	t.Helper()
	s, err := OpenPolicyStore(dir, file, nil)
	if err != nil {
		t.Fatalf("OpenPolicyStore: %v", err)
	}
	return s
}

func TestStorePersistsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, nil)
	if _, err := s.SetPolicy(mustPolicy(t, "ha", "/", "^q", ApplyQueues, 2, `{"ha-mode":"exactly","ha-params":2}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetOperatorPolicy(Policy{Name: "cap", VHost: "v", Pattern: ".", Definition: Definition{Other: map[string]any{"max-length": int64(5)}}}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, PoliciesFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("policies.json: %v, mode %v; want 0600", err, st)
	}

	restarted := openStore(t, dir, nil)
	snap := restarted.Snapshot()
	if len(snap.Policies) != 1 || snap.Policies[0].Name != "ha" || snap.Policies[0].Source != SourceRuntime ||
		snap.Policies[0].Definition.HAParams.Count != 2 || snap.Policies[0].ApplyTo != ApplyQueues || snap.Policies[0].Priority != 2 {
		t.Errorf("policies after restart: got %+v", snap.Policies)
	}
	if len(snap.OperatorPolicies) != 1 || snap.OperatorPolicies[0].Source != SourceOperatorRuntime {
		t.Errorf("operator policies after restart: got %+v", snap.OperatorPolicies)
	}
	if p := snap.Match("/", "queue", KindQueue, false); p == nil || p.Name != "ha" {
		t.Errorf("Match after restart: got %v, want ha", p)
	}
	if err := restarted.ClearPolicy("/", "ha"); err != nil {
		t.Fatal(err)
	}
	if got := openStore(t, dir, nil).Snapshot().Policies; len(got) != 0 {
		t.Errorf("after clear and restart: got %+v, want none", got)
	}
}

func TestStoreRuntimeOverridesFile(t *testing.T) {
	file := []Policy{mustPolicy(t, "ha", "/", "^q", ApplyAll, 0, `{"ha-mode":"all"}`)}
	file[0].Source = SourceFile
	s := openStore(t, "", file)

	if err := s.ClearPolicy("/", "ha"); !errors.Is(err, ErrFilePolicy) {
		t.Errorf("clearing a file policy: got %v, want ErrFilePolicy", err)
	}
	if err := s.ClearPolicy("/", "nope"); !errors.Is(err, ErrPolicyNotFound) {
		t.Errorf("clearing a missing policy: got %v, want ErrPolicyNotFound", err)
	}
	if _, err := s.SetPolicy(mustPolicy(t, "ha", "/", "^q", ApplyAll, 0, `{"ha-mode":"exactly","ha-params":2}`)); err != nil {
		t.Fatal(err)
	}
	got := s.Snapshot().List("/", false)
	if len(got) != 1 || got[0].Source != SourceRuntime || !got[0].OverridesFile || got[0].Definition.HAMode != HAExactly {
		t.Errorf("after override: got %+v, want one runtime policy overriding the file", got)
	}
	if err := s.ClearPolicy("/", "ha"); err != nil {
		t.Fatal(err)
	}
	got = s.Snapshot().List("/", false)
	if len(got) != 1 || got[0].Source != SourceFile || got[0].Definition.HAMode != HAAll {
		t.Errorf("after clearing the override: got %+v, want the file policy back", got)
	}
}

func TestStoreRefusesInvalid(t *testing.T) {
	s := openStore(t, "", nil)
	tests := []struct {
		name string
		p    Policy
		want string
	}{
		{"bad pattern", Policy{Name: "x", Pattern: "(", Definition: Definition{HAMode: HAAll}}, "pattern: expected a regular expression"},
		{"no name", Policy{Pattern: ".", Definition: Definition{HAMode: HAAll}}, "name: expected a non-empty policy name"},
		{"bad params", Policy{Name: "x", Pattern: ".", Definition: Definition{HAMode: HAExactly}}, "definition.ha-params"},
	}
	for _, tc := range tests {
		if _, err := s.SetPolicy(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := s.SetOperatorPolicy(Policy{Name: "x", Pattern: ".", Definition: Definition{HAMode: HAAll, PromoteOnFailure: PromoteAlways}}); err == nil {
		t.Error("operator policy with ha-promote-on-failure: accepted, want refused")
	}
}

func TestStoreSubscribers(t *testing.T) {
	s := openStore(t, "", nil)
	ch, cancel := s.Subscribe()
	t.Cleanup(cancel)
	for i, name := range []string{"a", "b", "c"} {
		if _, err := s.SetPolicy(mustPolicy(t, name, "/", ".", ApplyAll, i, `{"ha-mode":"all"}`)); err != nil {
			t.Fatal(err)
		}
	}
	snap := <-ch
	if len(snap.Policies) != 3 || snap != s.Snapshot() {
		t.Errorf("subscriber got %d policies (version %d), want the latest snapshot with 3", len(snap.Policies), snap.Version)
	}
	select {
	case extra := <-ch:
		t.Errorf("got a second snapshot %d, want only the latest", extra.Version)
	default:
	}
	s.SetFilePolicies(nil, nil) // no change: no notification
	select {
	case extra := <-ch:
		t.Errorf("notified without a change: version %d", extra.Version)
	default:
	}
}

func TestStoreConcurrentUse(t *testing.T) {
	s := openStore(t, t.TempDir(), nil)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				p := Policy{Name: "p", Pattern: ".", Priority: i, Definition: Definition{HAMode: HAAll}}
				if _, err := s.SetPolicy(p); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				_ = s.Snapshot().Match("/", "q", KindQueue, false)
			}
		}()
	}
	wg.Wait()
	if got := len(s.Snapshot().Policies); got != 1 {
		t.Errorf("got %d policies, want 1", got)
	}
}
