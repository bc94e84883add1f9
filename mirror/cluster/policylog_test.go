package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

func testPolicy(t *testing.T, name, pattern string) config.Policy {
	t.Helper()
	p, err := config.Policy{Name: name, VHost: "/", Pattern: pattern, ApplyTo: config.ApplyQueues, Definition: config.Definition{HAMode: config.HAAll}}.Validated(false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// writeRuntimeFile writes a state_dir with a runtime policies file holding
// the given policies, as a proxy of an earlier version left it.
func writeRuntimeFile(t *testing.T, policies ...config.Policy) string {
	t.Helper()
	dir := t.TempDir()
	if len(policies) == 0 {
		return dir
	}
	store, err := config.OpenPolicyStore(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range policies {
		if _, err := store.SetPolicy(p); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRuntimePoliciesReachEveryProxy runs three proxies' clusters and
// policy stores in process: a policy set through one is in the others'
// stores moments later (in the setter's at once), a clear through another
// removes it everywhere, the file policies of each stay its own, and the
// runtime policies one proxy had in state_dir from an earlier version are
// imported into the log once (the others' files are not: the log already
// has policies).
func TestRuntimePoliciesReachEveryProxy(t *testing.T) {
	logger := testLogger(t)

	filePolicy := func(name string) []config.Policy { return []config.Policy{testPolicy(t, name, "^file-")} }
	stateDirs := []string{writeRuntimeFile(t, testPolicy(t, "old-1", "^old_")), writeRuntimeFile(t), writeRuntimeFile(t)}
	nodes := startCluster(t, 3)
	var stores []*config.PolicyStore
	for i := range nodes {
		store, err := config.OpenPolicyStore(stateDirs[i], filePolicy(fmt.Sprintf("file-%d", i+1)), nil)
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, store)
	}
	for i, n := range nodes {
		c := n.Cluster
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Store().WaitLeader(ctx); err != nil {
			t.Fatal(err)
		}
		policyLog := StartPolicyLog(c, c.Store(), stores[i], logger)
		defer policyLog.Close()
	}
	for i, s := range stores {
		testutil.Eventually(t, 15*time.Second, func() error { return hasPolicies(s, fmt.Sprintf("file-%d", i+1), "old-1") })
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(stateDirs[0], config.PoliciesFile)); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("the imported policies file is still there (stat: %v), want it renamed", err)
		}
		return nil
	})

	if _, err := stores[0].SetPolicy(testPolicy(t, "ha-all", "^queue_")); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	if err := hasPolicies(stores[0], "file-1", "ha-all", "old-1"); err != nil {
		t.Errorf("the setter's store when set_policy returned: %v", err)
	}
	testutil.Eventually(t, 15*time.Second, func() error { return hasPolicies(stores[2], "file-3", "ha-all", "old-1") })
	t.Logf("proxy 3's store had the policy %v after proxy 1's set_policy returned", time.Since(set))
	if err := stores[1].ClearPolicy("/", "ha-all"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, func() error { return hasPolicies(stores[0], "file-1", "old-1") })
	if err := hasPolicies(stores[1], "file-2", "old-1"); err != nil {
		t.Error(err)
	}

	tests := []struct {
		name    string
		clear   string
		wantErr error
	}{
		{name: "a file policy of the proxy asked", clear: "file-2", wantErr: config.ErrFilePolicy},
		{name: "a policy nobody has", clear: "nope", wantErr: config.ErrPolicyNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := stores[1].ClearPolicy("/", tt.clear); !errors.Is(err, tt.wantErr) {
				t.Errorf("clear %s: err = %v, want %v", tt.clear, err, tt.wantErr)
			}
		})
	}
}

// A proxy alone keeps its runtime policies in its single-voter log: a
// policy set before a restart is there after it, and a state_dir file
// left by an earlier version is imported on the first start only.
func TestRuntimePoliciesSurviveRestartAlone(t *testing.T) {
	defer leaktest.VerifyNone(t, goleak.IgnoreCurrent())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	stateDir := writeRuntimeFile(t, testPolicy(t, "old", "^old_"))
	raftDir := t.TempDir()
	start := func() (*config.PolicyStore, *store.Store, func()) {
		t.Helper()
		metadata, err := store.Open(store.Config{Dir: raftDir, NodeID: "proxy", Logger: logger, ElectionTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := metadata.WaitLeader(ctx); err != nil {
			metadata.Close()
			t.Fatal(err)
		}
		policies, err := config.OpenPolicyStore(stateDir, nil, nil)
		if err != nil {
			metadata.Close()
			t.Fatal(err)
		}
		policyLog := StartPolicyLog(metadata, metadata, policies, logger)
		return policies, metadata, func() { policyLog.Close(); metadata.Close() }
	}
	logNames := func(s *store.Store) string {
		var out []string
		for _, p := range s.Policies().Policies {
			out = append(out, p.Name)
		}
		return fmt.Sprint(out)
	}

	// A proxy alone has a leader at once: the import is done when
	// StartPolicyLog returns, before any change can overtake it.
	policies, store, stop := start()
	if got := logNames(store); got != "[old]" {
		stop()
		t.Fatalf("the log after the first start holds %s, want state_dir's [old]", got)
	}
	_, setErr := policies.SetPolicy(testPolicy(t, "ha-all", "^queue_"))
	clearErr := policies.ClearPolicy("/", "old")
	stop()
	if setErr != nil || clearErr != nil {
		t.Fatalf("set: %v, clear: %v", setErr, clearErr)
	}

	// A file written again by hand is not imported: the log has policies.
	writeAgain, err := config.OpenPolicyStore(stateDir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writeAgain.SetPolicy(testPolicy(t, "stale", "^stale_")); err != nil {
		t.Fatal(err)
	}
	policies, store, stop = start()
	defer stop()
	if got := logNames(store); got != "[ha-all]" {
		t.Errorf("the log after the restart holds %s, want [ha-all]", got)
	}
	if err := hasPolicies(policies, "ha-all"); err != nil {
		t.Error(err)
	}
}

// hasPolicies checks the names of the store's user policies, in the store's order
// (vhost, priority, name).
func hasPolicies(s *config.PolicyStore, want ...string) error {
	var got []string
	for _, p := range s.Snapshot().Policies {
		got = append(got, p.Name)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("policies %v, want %v", got, want)
	}
	return nil
}
