package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// testNode is one proxy of a test cluster.
type testNode struct {
	*Cluster
	cfg    Config
	net    *testNetwork
	events chan Event // buffered far beyond what a test produces
}

// testLogger writes to t.Log until the test ends (raft and serf goroutines
// may log while a cleanup shuts them down).
func testLogger(t *testing.T) *slog.Logger {
	w := &testLogWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testLogWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// newConfig is the configuration of node name: loopback, free ports.
func newConfig(t *testing.T, name string, expect int, join ...string) Config {
	return Config{
		NodeName:        name,
		Bind:            "127.0.0.1:0",
		Join:            join,
		RaftBind:        "127.0.0.1:0",
		DataDir:         t.TempDir(),
		BootstrapExpect: expect,
		AMQP:            "127.0.0.1:5672",
		Admin:           "127.0.0.1:15680",
		Backend:         name,
	}
}

// startNode starts a node and shuts it down (without leaving) when the
// test ends.
func startNode(t *testing.T, cfg Config) *testNode {
	t.Helper()
	n := &testNode{cfg: cfg, net: newTestNetwork(), events: make(chan Event, 4096)}
	cfg.Events = n.events
	cfg.Logger = testLogger(t).With("test_node", cfg.NodeName)
	cfg.network = n.net
	c, err := Start(cfg)
	if err != nil {
		t.Fatalf("starting %s: %v", cfg.NodeName, err)
	}
	n.Cluster = c
	t.Cleanup(func() { c.Shutdown() })
	return n
}

// restart starts the node again after a Shutdown, with its data dir and
// gossip address (serf refuses a known name at a new address for a while),
// on its raft address or a new one, joining the given proxies.
func (n *testNode) restart(t *testing.T, newRaftPort bool, join ...string) *testNode {
	t.Helper()
	cfg := n.cfg
	cfg.Bind = n.LocalMember().Gossip
	if !newRaftPort {
		cfg.RaftBind = n.LocalMember().Raft
	}
	cfg.Join = join
	return startNode(t, cfg)
}

// startCluster starts size nodes named rabbit1… that bootstrap together,
// and waits until all of them see each other and a leader.
func startCluster(t *testing.T, size int) []*testNode {
	t.Helper()
	first := startNode(t, newConfig(t, "rabbit1", size))
	nodes := []*testNode{first}
	for i := 2; i <= size; i++ {
		nodes = append(nodes, startNode(t, newConfig(t, fmt.Sprintf("rabbit%d", i), size, first.LocalMember().Gossip)))
	}
	waitMembers(t, nodes, names(nodes), nil)
	waitLeader(t, nodes)
	waitVoters(t, nodes, names(nodes))
	return nodes
}

func names(nodes []*testNode) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.cfg.NodeName)
	}
	slices.Sort(out)
	return out
}

// waitMembers waits until every node sees exactly the given members alive
// and the given ones failed.
func waitMembers(t *testing.T, nodes []*testNode, alive, failed []string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		for _, n := range nodes {
			var gotAlive, gotFailed []string
			for _, m := range n.Members() {
				switch m.Status {
				case StatusAlive:
					gotAlive = append(gotAlive, m.Name)
				case StatusFailed:
					gotFailed = append(gotFailed, m.Name)
				}
			}
			if !slices.Equal(gotAlive, alive) || !slices.Equal(gotFailed, failed) {
				return fmt.Errorf("%s sees alive %v and failed %v, want %v and %v", n.cfg.NodeName, gotAlive, gotFailed, alive, failed)
			}
		}
		return nil
	})
}

// waitLeader waits until all nodes agree on one leader, and returns it.
func waitLeader(t *testing.T, nodes []*testNode) *testNode {
	t.Helper()
	var leader *testNode
	testutil.Eventually(t, 10*time.Second, func() error {
		leader = nil
		for _, n := range nodes {
			if n.Store().IsLeader() {
				if leader != nil {
					return fmt.Errorf("two leaders: %s and %s", leader.cfg.NodeName, n.cfg.NodeName)
				}
				leader = n
			}
		}
		if leader == nil {
			return fmt.Errorf("no leader among %v", names(nodes))
		}
		for _, n := range nodes {
			if id, _ := n.Store().Leader(); id != leader.cfg.NodeName {
				return fmt.Errorf("%s follows %q, want %s", n.cfg.NodeName, id, leader.cfg.NodeName)
			}
		}
		return nil
	})
	return leader
}

// waitVoters waits until every node's configuration has exactly the given
// voters.
func waitVoters(t *testing.T, nodes []*testNode, want []string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		for _, n := range nodes {
			if got := voterNames(t, n); !slices.Equal(got, want) {
				return fmt.Errorf("%s has voters %v, want %v", n.cfg.NodeName, got, want)
			}
		}
		return nil
	})
}

func voterNames(t *testing.T, n *testNode) []string {
	t.Helper()
	voters, err := n.Store().Voters()
	if err != nil {
		t.Fatalf("voters of %s: %v", n.cfg.NodeName, err)
	}
	var out []string
	for _, v := range voters {
		out = append(out, v.ID)
	}
	return out
}

// waitEvent reads n's events until one of kind about member arrives, and
// returns when it did.
func waitEvent(t *testing.T, n *testNode, kind EventKind, member string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case e := <-n.events:
			if e.Kind == kind && e.Member.Name == member {
				return time.Now()
			}
		case <-deadline:
			t.Fatalf("%s: no %s event for %s within %v", n.cfg.NodeName, kind, member, timeout)
		}
	}
}

func queueMeta(name, master string, slaves ...string) mirror.QueueMeta {
	m := mirror.QueueMeta{ID: mirror.QueueID{VHost: "/", Name: name}, Master: master, Durable: true}
	for _, s := range slaves {
		m.Slaves = append(m.Slaves, mirror.Slave{Backend: s})
	}
	return m
}

// put writes a new queue through n (forwarded to the leader when n does
// not lead) and returns the record as written. An election on a loaded
// machine makes a write fail with ErrNotLeader; put retries then, as a
// proxy would, and accepts a conflict after such a retry when the record
// it finds is its own (the failed attempt committed after all).
func put(t *testing.T, n *testNode, meta mirror.QueueMeta) mirror.QueueMeta {
	t.Helper()
	var written mirror.QueueMeta
	retried := false
	testutil.Eventually(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		w, err := n.Put(ctx, meta, 0)
		switch {
		case err == nil:
			written = w
			return nil
		case retried && errors.Is(err, store.ErrConflict):
			if got, ok := n.Store().Get(meta.ID); ok && got.Master == meta.Master {
				written = got
				return nil
			}
		case errors.Is(err, store.ErrNotLeader):
			retried = true
		}
		return fmt.Errorf("put %s through %s: %w", meta.ID, n.cfg.NodeName, err)
	})
	return written
}

// waitReplicated waits until every node's store holds want.
func waitReplicated(t *testing.T, nodes []*testNode, want mirror.QueueMeta) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		for _, n := range nodes {
			got, ok := n.Store().Get(want.ID)
			if !ok || got.Version != want.Version || got.Master != want.Master {
				return fmt.Errorf("%s has %s = %+v (present %v), want version %d master %s",
					n.cfg.NodeName, want.ID, got, ok, want.Version, want.Master)
			}
		}
		return nil
	})
}

func without(nodes []*testNode, gone *testNode) []*testNode {
	var out []*testNode
	for _, n := range nodes {
		if n != gone {
			out = append(out, n)
		}
	}
	return out
}
