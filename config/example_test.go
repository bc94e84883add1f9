package config

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/viper"
)

// shippedExample is the commented example configuration at the root of the
// repository, the one the README's quick start and docs/configuration.md point at.
const shippedExample = "../amqp-mirror.example.yaml"

// TestLoadShippedExample loads the shipped example with the loader serve
// uses, so that it stays valid as keys and checks change.
func TestLoadShippedExample(t *testing.T) {
	c, err := Load(shippedExample, nil)
	if err != nil {
		t.Fatalf("Load(%s): %v", shippedExample, err)
	}
	d := Default()
	checks := []struct {
		name      string
		got, want any
	}{
		{"node", c.Node, "rabbit1"},
		{"backends", len(c.Backends), 2},
		{"listen", c.Listen.AMQP + " " + c.Listen.Admin, d.Listen.AMQP + " " + d.Listen.Admin},
		{"failover_grace", c.FailoverGrace, d.FailoverGrace},
		{"heartbeat", c.Heartbeat, 60 * time.Second},
		{"frame_max", c.FrameMax, d.FrameMax},
		{"channel_max", c.ChannelMax, d.ChannelMax},
		{"log", c.Log, d.Log},
		{"policy", c.Policies[0].Name + " " + c.Policies[0].Definition.String(), `ha-queues {"ha-mode":"exactly","ha-params":2,"ha-sync-mode":"automatic"}`},
	}
	for _, tc := range checks {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// TestShippedExampleHasEveryKey checks that the example names every key
// the loader knows, so a new key cannot be left out of it.
func TestShippedExampleHasEveryKey(t *testing.T) {
	v := viper.New()
	v.SetConfigFile(shippedExample)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		t.Fatal(err)
	}
	m := v.AllSettings()
	for _, key := range topKeys {
		if _, ok := m[key]; !ok {
			t.Errorf("the example lacks the top-level key %s", key)
		}
	}
	p := &problems{}
	for _, f := range scalarFields {
		if _, ok := lookup(p, m, f.key); !ok {
			t.Errorf("the example lacks %s", f.key)
		}
	}
	policy := m["policies"].([]any)[0].(map[string]any)
	for _, key := range []string{"name", "vhost", "pattern", "apply-to", "priority", "definition"} {
		if _, ok := policy[key]; !ok {
			t.Errorf("the example's policy lacks %s", key)
		}
	}
}

// TestReferenceShowsTheShippedExample checks that the configuration
// reference's block is the shipped example, comments included, below its
// two header lines: they are one text, kept in two places for readers.
func TestReferenceShowsTheShippedExample(t *testing.T) {
	reference, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(shippedExample)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(reference), "\n## Every key\n")
	if !ok {
		t.Fatal("docs/configuration.md has no ## Every key section")
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("docs/configuration.md's Every key section has no ```yaml block")
	}
	block, _, _ = strings.Cut(block, "```")
	var body []string
	for _, line := range strings.SplitAfter(string(example), "\n") {
		if !strings.HasPrefix(line, "# ") {
			body = append(body, line)
		}
	}
	if want := strings.Join(body, ""); block != want {
		t.Errorf("docs/configuration.md's yaml block differs from %s (without its header comment).\nreference:\n%s\nexample:\n%s", shippedExample, block, want)
	}
}
