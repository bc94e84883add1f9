package admin

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// noMajority is a policy log on the minority side of a partition.
type noMajority struct{}

func (noMajority) SetPolicy(config.Policy, bool) error {
	return fmt.Errorf("%w: test", config.ErrNoMajority)
}

func (noMajority) ClearPolicy(string, string, bool) error {
	return fmt.Errorf("%w: test", config.ErrNoMajority)
}

// A policy change the replicated log cannot take (no majority) is 503
// Service Unavailable, which ctl turns into its "try again" exit code, and
// the policies stay as they were.
func TestPolicyChangeWithoutMajority(t *testing.T) {
	f := newFixture(t)
	f.store.UseLog(noMajority{})
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
	}{
		{"set_policy", func() error { return f.client.SetPolicy(ctx, "/", "ha-all", ".", "", 0, `{"ha-mode":"all"}`) }},
		{"set_operator_policy", func() error {
			return f.client.SetOperatorPolicy(ctx, "/", "op", ".", "", 0, `{"max-length":10}`)
		}},
		{"clear_policy", func() error { return f.client.ClearPolicy(ctx, "/", "ha-all") }},
		{"clear_operator_policy", func() error { return f.client.ClearOperatorPolicy(ctx, "/", "op") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var api *APIError
			if !errors.As(err, &api) || api.Status != 503 {
				t.Fatalf("err = %v, want a 503 APIError", err)
			}
			if got := exitCode(err); got != ExitUnavailable {
				t.Errorf("ctl exit code = %d, want ExitUnavailable (%d)", got, ExitUnavailable)
			}
		})
	}
	if got := len(f.store.Snapshot().Policies); got != 1 {
		t.Errorf("%d policies after refused changes, want the file's 1", got)
	}
}
