package node

import (
	"testing"

	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
)

func TestReadiness(t *testing.T) {
	yes := func() bool { return true }
	no := func() bool { return false }
	state := func(s controllink.State) func(string) controllink.State {
		return func(string) controllink.State { return s }
	}
	tests := []struct {
		name      string
		paused    func() bool
		hasLeader func() bool
		backend   controllink.State
		want      string // "" means ready
	}{
		{name: "serving", paused: no, hasLeader: yes, backend: controllink.Up},
		{name: "one backend, no metadata log", paused: no, backend: controllink.Up},
		{name: "paused in a minority", paused: yes, hasLeader: no, backend: controllink.Up,
			want: "paused: this proxy sees no majority of the sidecar cluster"},
		{name: "paused while the log catches up", paused: yes, hasLeader: yes, backend: controllink.Up,
			want: "paused: the metadata log has not caught up with the leader yet"},
		{name: "no leader, not paused yet", paused: no, hasLeader: no, backend: controllink.Up,
			want: "the metadata log has no leader: mirrored queues cannot change"},
		{name: "home backend down", paused: no, hasLeader: yes, backend: controllink.Down,
			want: "backend rabbit1, which serves this proxy's clients, is down"},
		{name: "home backend not probed yet", paused: no, backend: controllink.Unknown,
			want: "backend rabbit1, which serves this proxy's clients, has not answered the proxy's first probe yet"},
		{name: "the pause comes first", paused: yes, hasLeader: no, backend: controllink.Down,
			want: "paused: this proxy sees no majority of the sidecar cluster"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := readiness{paused: tc.paused, hasLeader: tc.hasLeader, home: "rabbit1", backend: state(tc.backend)}
			got := ""
			if err := r.check(); err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("check() = %q, want %q", got, tc.want)
			}
		})
	}
}
