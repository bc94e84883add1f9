package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
)

// TestRuntimePoliciesReachEveryProxy runs two proxies' clusters and policy
// stores in process: a policy set through one appears in the other, a
// clear through the other removes it from the first, and the file
// policies of each stay its own.
func TestRuntimePoliciesReachEveryProxy(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(),
		// memberlist does not wait for its probe goroutine at Shutdown.
		goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	filePolicy := func(name string) []config.Policy {
		p, err := config.Policy{Name: name, VHost: "/", Pattern: "^file-", ApplyTo: config.ApplyQueues, Definition: config.Definition{HAMode: config.HAAll}}.Validated(false)
		if err != nil {
			t.Fatal(err)
		}
		return []config.Policy{p}
	}
	var stores []*config.PolicyStore
	var join []string
	for i, name := range []string{"rabbit1", "rabbit2"} {
		c, err := cluster.Start(cluster.Config{
			NodeName: name, Bind: "127.0.0.1:0", RaftBind: "127.0.0.1:0", Join: join,
			DataDir: t.TempDir(), BootstrapExpect: 2, Backend: name, Logger: logger,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Shutdown()
		join = []string{c.LocalMember().Gossip}
		store, err := config.OpenPolicyStore(t.TempDir(), filePolicy(fmt.Sprintf("file-%d", i+1)), nil)
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, store)
		stop := startPolicySync(ctx, c, store, name, logger)
		defer stop()
	}

	set, err := config.Policy{Name: "ha-all", VHost: "/", Pattern: "^queue_", ApplyTo: config.ApplyQueues, Definition: config.Definition{HAMode: config.HAAll}}.Validated(false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stores[0].SetPolicy(set); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, func() error { return hasPolicies(stores[1], "file-2", "ha-all") })
	if err := stores[1].ClearPolicy("/", "ha-all"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, func() error { return hasPolicies(stores[0], "file-1") })
	if err := hasPolicies(stores[1], "file-2"); err != nil {
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
