package integration

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// mirroredOptions configure startMirroredProxyWith.
type mirroredOptions struct {
	// definition is the policy applied to every queue of every vhost, as
	// JSON; "" is ha-mode all with automatic sync.
	definition string
	// grace is the watcher's Grace (failover_grace); 0 for its default.
	grace  time.Duration
	logger *slog.Logger
	// linkAddrs sends the proxy's client links to a backend through another
	// address (a faultyLink); the engine still reaches it directly.
	linkAddrs map[string]string
}

// mirroredProxy is a proxy in this process with the replication engine.
type mirroredProxy struct {
	url string
	srv *proxy.Server
	eng *engine.Engine
}

// startMirroredProxy runs a proxy in this process (so under the test
// binary's -race) with home as its home backend, the other shared nodes as
// the other backends, and the replication engine with one policy, ha-mode
// all on every queue of every vhost: the configuration under which the
// client suites must see what they see from one broker. It returns the URL
// clients use.
func startMirroredProxy(t testing.TB, home *localbroker.Node, level slog.Level) (string, *proxy.Server) {
	t.Helper()
	p := startMirroredProxyWith(t, home, mirroredOptions{
		logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level})),
	})
	return p.url, p.srv
}

// startMirroredProxyWith is startMirroredProxy with another policy,
// failover_grace or log destination.
func startMirroredProxyWith(t testing.TB, home *localbroker.Node, opts mirroredOptions) mirroredProxy {
	t.Helper()
	if opts.definition == "" {
		opts.definition = `{"ha-mode":"all","ha-sync-mode":"automatic"}`
	}
	logger := opts.logger
	var others []proxy.Backend
	var watched []controllink.Backend
	for _, n := range cluster.Nodes() {
		watched = append(watched, controllink.Backend{Name: n.Name, URL: n.URL()})
		if n.Name != home.Name {
			addr := nodeAddr(n)
			if a, ok := opts.linkAddrs[n.Name]; ok {
				addr = a
			}
			others = append(others, proxy.Backend{Name: n.Name, Addr: addr})
		}
	}
	def, err := config.ParseDefinition([]byte(opts.definition))
	if err != nil {
		t.Fatalf("definition %s: %v", opts.definition, err)
	}
	policy, err := config.Policy{Name: "mirror-every-queue", Pattern: ".*", ApplyTo: config.ApplyQueues, Definition: def}.Validated(false)
	if err != nil {
		t.Fatal(err)
	}
	policies, err := config.OpenPolicyStore("", []config.Policy{policy}, nil)
	if err != nil {
		t.Fatalf("policies: %v", err)
	}
	metadata, err := store.Open(store.Config{Dir: t.TempDir(), NodeID: "test", Logger: logger, ElectionTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("metadata store: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := metadata.WaitLeader(ctx); err != nil {
		t.Fatalf("metadata store: %v", err)
	}
	watcher := controllink.NewWatcher(watched, controllink.WatcherOptions{Logger: logger, Grace: opts.grace})
	eng := engine.New(engine.Options{Backends: watched, Node: home.Name, Store: metadata, Policies: policies, Watcher: watcher, Logger: logger})
	if err := eng.Start(ctx); err != nil {
		t.Fatalf("engine: %v", err)
	}
	// Cleanups run last first: the proxy closes before the engine, the
	// engine before the store.
	t.Cleanup(func() {
		eng.Close()
		watcher.Close()
		metadata.Close()
	})
	url, srv := startProxy(t, home, func(o *proxy.Options) {
		o.Logger = logger
		o.Others = others
		o.Mirror = eng
		o.ClientNode = home.Name
	})
	return mirroredProxy{url: url, srv: srv, eng: eng}
}
