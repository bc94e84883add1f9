package main

import (
	"os"
	"path/filepath"
	"testing"

	productconfig "github.com/amqp-mirror/amqp-mirror/config"
	harness "github.com/amqp-mirror/amqp-mirror/mirror/localbroker"
)

// TestServerConfig: the config the mirrored scenario gives `amqp-mirror serve` loads
// with the product's own loader, lists the three nodes as backends, and mirrors every
// queue of the amqp-mirror row (ha-mode all, automatic sync), not the queues the
// native cluster's policy is for. A row measured with a config the proxy read otherwise
// would compare the wrong thing.
func TestServerConfig(t *testing.T) {
	nodes := []*harness.Node{{Name: "plain1", Port: 5701}, {Name: "plain2", Port: 5702}, {Name: "plain3", Port: 5703}}
	dir := t.TempDir()
	path := filepath.Join(dir, "amqp-mirror.yaml")
	text := serverConfig("127.0.0.1:5799", filepath.Join(dir, "state"), "warn", nodes)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := productconfig.Load(path, nil)
	if err != nil {
		t.Fatalf("productconfig.Load of\n%s\n: %v", text, err)
	}
	if got, want := cfg.Listen.AMQP, "127.0.0.1:5799"; got != want {
		t.Errorf("listen.amqp: got %q, want %q", got, want)
	}
	if cfg.Listen.Admin != "" || cfg.Cluster.Bind != "" {
		t.Errorf("listen.admin %q, cluster.bind %q: want both empty, no ports beside the AMQP one", cfg.Listen.Admin, cfg.Cluster.Bind)
	}
	if len(cfg.Backends) != len(nodes) {
		t.Fatalf("backends: got %v, want %d", cfg.Backends, len(nodes))
	}
	for i, b := range cfg.Backends {
		if b.Name != nodes[i].Name || b.URL != nodes[i].URL() {
			t.Errorf("backends[%d]: got %s %s, want %s %s", i, b.Name, b.URL, nodes[i].Name, nodes[i].URL())
		}
	}

	cases := []struct {
		queue    string
		mirrored bool
	}{
		{queuePrefix(targetMirror) + "-x-0", true},
		{queuePrefix(targetMirror) + "-declare-x", true},
		{queuePrefix(targetDirect) + "-x-0", true}, // never declared through the proxy; matched all the same
		{"other", false},
	}
	for _, c := range cases {
		policy, _ := productconfig.Match(cfg.Policies, "/", c.queue, productconfig.KindQueue, false)
		if got := policy != nil; got != c.mirrored {
			t.Errorf("queue %s: policy matched %v, want %v", c.queue, got, c.mirrored)
			continue
		}
		if policy == nil {
			continue
		}
		d := productconfig.Effective(policy, nil)
		if d.HAMode != productconfig.HAAll || d.SyncMode != productconfig.SyncAutomatic {
			t.Errorf("queue %s: got ha-mode %v ha-sync-mode %v, want all and automatic", c.queue, d.HAMode, d.SyncMode)
		}
	}
}
