package engine

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestReplyNodesOwner(t *testing.T) {
	now := time.Unix(1000, 0)
	probed := func() *replyNodes {
		r := &replyNodes{}
		r.record("a", "reply@1", 1, nil, now)
		r.record("b", "reply@2", 1, nil, now)
		r.record("c", "", 1, errors.New("refused"), now)
		return r
	}
	tests := []struct {
		name          string
		nodes         *replyNodes
		node          string
		generations   map[string]uint64
		at            time.Time
		wantOwner     string
		wantAmbiguous bool
		wantUnprobed  []string
	}{
		{"known on its connection", probed(), "reply@2", map[string]uint64{"a": 1, "b": 1, "c": 1}, now, "b", false, nil},
		{"a failed probe waits", probed(), "reply@9", map[string]uint64{"a": 1, "b": 1, "c": 1}, now, "", false, nil},
		{"a failed probe is tried again later", probed(), "reply@9", map[string]uint64{"a": 1, "b": 1, "c": 1}, now.Add(replyProbeRetry), "", false, []string{"c"}},
		{"a new connection is probed again", probed(), "reply@1", map[string]uint64{"a": 2, "b": 1, "c": 1}, now, "", false, []string{"a"}},
		{"a backend that is down owns nothing", probed(), "reply@1", map[string]uint64{"b": 1, "c": 1}, now, "", false, nil},
		{"never probed", &replyNodes{}, "reply@1", map[string]uint64{"a": 1, "b": 1}, now, "", false, []string{"a", "b"}},
		{"two backends, one node", func() *replyNodes {
			r := probed()
			r.record("c", "reply@1", 1, nil, now)
			return r
		}(), "reply@1", map[string]uint64{"a": 1, "b": 1, "c": 1}, now, "", true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			owner, ambiguous, unprobed := tt.nodes.owner(tt.node, tt.generations, tt.at)
			slices.Sort(unprobed)
			if ambiguous {
				owner = ""
			}
			if owner != tt.wantOwner || ambiguous != tt.wantAmbiguous || !slices.Equal(unprobed, tt.wantUnprobed) {
				t.Errorf("owner(%q) = %q, ambiguous %v, unprobed %v; want %q, %v, %v",
					tt.node, owner, ambiguous, unprobed, tt.wantOwner, tt.wantAmbiguous, tt.wantUnprobed)
			}
		})
	}
}
