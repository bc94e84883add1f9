package config

import (
	"slices"
	"strings"
	"testing"
)

func TestPolicyWarningNamesUnknownNodes(t *testing.T) {
	backends := []string{"rabbit1", "rabbit2", "rabbit3"}
	tests := []struct {
		name        string
		definition  string
		wantUnknown []string
	}{
		{"nodes, all backends", `{"ha-mode":"nodes","ha-params":["rabbit1","rabbit3"]}`, nil},
		{"an Erlang node name", `{"ha-mode":"nodes","ha-params":["rabbit1","rabbit@r9"]}`, []string{"rabbit@r9"}},
		{"none known, in the order written", `{"ha-mode":"nodes","ha-params":["r9","rabbit@rabbit1"]}`, []string{"r9", "rabbit@rabbit1"}},
		{"names are case-sensitive", `{"ha-mode":"nodes","ha-params":["Rabbit1"]}`, []string{"Rabbit1"}},
		{"exactly names no node", `{"ha-mode":"exactly","ha-params":2}`, nil},
		{"all names no node", `{"ha-mode":"all"}`, nil},
		{"no mirroring", `{"max-length":5}`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := mustPolicy(t, "ha-pinned", "prod", "^q", ApplyQueues, 0, tc.definition)
			if got := p.Definition.UnknownNodes(backends); !slices.Equal(got, tc.wantUnknown) {
				t.Errorf("UnknownNodes: got %q, want %q", got, tc.wantUnknown)
			}
			warning := PolicyWarning(p, backends)
			if len(tc.wantUnknown) == 0 {
				if warning != "" {
					t.Errorf("PolicyWarning: got %q, want none", warning)
				}
				return
			}
			for _, want := range append([]string{`policy "ha-pinned" in vhost "prod"`, "rabbit1, rabbit2, rabbit3"}, tc.wantUnknown...) {
				if !strings.Contains(warning, want) {
					t.Errorf("PolicyWarning: got %q, want it to name %q", warning, want)
				}
			}
		})
	}
}

func TestConfigWarningsCoverOperatorPolicies(t *testing.T) {
	cfg := &Config{
		Backends:         []Backend{{Name: "rabbit1"}, {Name: "rabbit2"}},
		Policies:         []Policy{mustPolicy(t, "fine", "/", "^a", ApplyAll, 0, `{"ha-mode":"nodes","ha-params":["rabbit2"]}`)},
		OperatorPolicies: []Policy{mustPolicy(t, "pinned", "/", "^b", ApplyAll, 0, `{"ha-mode":"nodes","ha-params":["rabbit@r9"]}`)},
	}
	got := cfg.Warnings()
	if len(got) != 1 || !strings.Contains(got[0], `policy "pinned"`) || !strings.Contains(got[0], `"rabbit@r9"`) {
		t.Errorf("Warnings: got %q, want one naming policy \"pinned\" and \"rabbit@r9\"", got)
	}
}
