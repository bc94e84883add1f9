package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeLog is a replicated log of one: a change is committed at the next
// index and handed back through SetRuntime, as the proxy's log does.
type fakeLog struct {
	store    *PolicyStore
	index    uint64
	policies []Policy
	refuse   error
}

func (l *fakeLog) SetPolicy(p Policy, operator bool) error {
	if l.refuse != nil {
		return l.refuse
	}
	var next []Policy
	for _, q := range l.policies {
		if q.VHost != p.VHost || q.Name != p.Name {
			next = append(next, q)
		}
	}
	l.policies = append(next, p)
	l.index++
	return l.store.SetRuntime(l.index, l.policies, nil)
}

func (l *fakeLog) ClearPolicy(vhost, name string, operator bool) error {
	if l.refuse != nil {
		return l.refuse
	}
	for i, q := range l.policies {
		if q.VHost == vhost && q.Name == name {
			l.policies = append(l.policies[:i:i], l.policies[i+1:]...)
			l.index++
			return l.store.SetRuntime(l.index, l.policies, nil)
		}
	}
	return fmt.Errorf("%w: %q", ErrPolicyNotFound, name)
}

func userNames(s *PolicyStore) string {
	var out []string
	for _, p := range s.Snapshot().Policies {
		out = append(out, p.Name+":"+p.Source)
	}
	return strings.Join(out, ",")
}

// With a log, set and clear go to it and the store shows what the log
// hands back; state_dir's file is neither written nor, once retired, read.
func TestStoreWithLog(t *testing.T) {
	dir := t.TempDir()
	seed := openStore(t, dir, nil)
	if _, err := seed.SetPolicy(mustPolicy(t, "old", "/", "^old", ApplyQueues, 0, `{"ha-mode":"all"}`)); err != nil {
		t.Fatal(err)
	}
	file := []Policy{mustPolicy(t, "from-file", "/", "^file", ApplyQueues, 0, `{"ha-mode":"all"}`)}
	s := openStore(t, dir, file)
	log := &fakeLog{store: s}
	if p, _ := s.Runtime(); len(p) != 1 || p[0].Name != "old" {
		t.Fatalf("Runtime() before the log = %+v, want state_dir's policy old", p)
	}
	s.UseLog(log)
	if got, want := userNames(s), "from-file:file,old:runtime"; got != want {
		t.Errorf("before the log's first state: %s, want %s (state_dir's until then)", got, want)
	}

	if _, err := s.SetPolicy(mustPolicy(t, "ha", "/", "^q", ApplyQueues, 0, `{"ha-mode":"all"}`)); err != nil {
		t.Fatal(err)
	}
	if got, want := userNames(s), "from-file:file,ha:runtime"; got != want {
		t.Errorf("after a set through the log: %s, want %s", got, want)
	}
	if err := s.SetRuntime(log.index, nil, nil); err != nil || userNames(s) != "from-file:file,ha:runtime" {
		t.Errorf("a state not newer than the last taken replaced it: %s (err %v)", userNames(s), err)
	}

	tests := []struct {
		name    string
		clear   string
		refuse  error
		wantErr error
	}{
		{name: "a file policy", clear: "from-file", wantErr: ErrFilePolicy},
		{name: "a policy nobody has", clear: "nope", wantErr: ErrPolicyNotFound},
		{name: "no majority", clear: "ha", refuse: fmt.Errorf("%w: test", ErrNoMajority), wantErr: ErrNoMajority},
		{name: "a runtime policy", clear: "ha"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log.refuse = tt.refuse
			if err := s.ClearPolicy("/", tt.clear); !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Errorf("clear %s: err = %v, want %v", tt.clear, err, tt.wantErr)
			}
		})
	}
	if got, want := userNames(s), "from-file:file"; got != want {
		t.Errorf("after the clears: %s, want %s", got, want)
	}

	b, err := os.ReadFile(filepath.Join(dir, PoliciesFile))
	if err != nil || !strings.Contains(string(b), `"old"`) || strings.Contains(string(b), `"ha"`) {
		t.Errorf("state_dir's file was written with a log in use: %s (err %v)", b, err)
	}
	retired, err := s.RetireFile()
	if err != nil || retired != filepath.Join(dir, PoliciesFile)+".imported" {
		t.Fatalf("RetireFile = %q, %v", retired, err)
	}
	if again, err := s.RetireFile(); again != "" || err != nil {
		t.Errorf("RetireFile without a file = %q, %v; want nothing to do", again, err)
	}
	if p, _ := openStore(t, dir, nil).Runtime(); len(p) != 0 {
		t.Errorf("a store opened after the file was retired reads %+v, want nothing", p)
	}
}
