package integration

import (
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// TestComposeConfigIsValid keeps the config that docker-compose.yml mounts
// loadable, since no Docker engine runs it here.
func TestComposeConfigIsValid(t *testing.T) {
	cfg, err := config.Load("testdata/compose/amqp-mirror.yaml", nil)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if got, want := len(cfg.Backends), 3; got != want {
		t.Errorf("backends: got %d, want %d", got, want)
	}
}
