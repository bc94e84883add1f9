package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	const revision = "3203426d1c0f5e7a9b8c7d6e5f4a3b2c1d0e9f8a"
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	tests := []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{
			name: "a tagged release",
			bi:   debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.0"}, Settings: settings("vcs.revision", revision, "vcs.modified", "false")},
			want: "amqp-mirror v1.2.0 (go1.26.0, commit 3203426d1c0f)",
		},
		{
			name: "a work tree with changes",
			bi:   debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.0.0-20261201142456-3203426d1c0f+dirty"}, Settings: settings("vcs.revision", revision, "vcs.modified", "true")},
			want: "amqp-mirror v0.0.0-20261201142456-3203426d1c0f+dirty (go1.26.0, commit 3203426d1c0f, modified)",
		},
		{
			name: "no VCS stamp",
			bi:   debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			want: "amqp-mirror devel (go1.26.0)",
		},
		{
			name: "nothing recorded",
			bi:   debug.BuildInfo{},
			want: "amqp-mirror devel",
		},
		{
			name: "modified without a revision says nothing of it",
			bi:   debug.BuildInfo{GoVersion: "go1.26.0", Settings: settings("vcs.modified", "true")},
			want: "amqp-mirror devel (go1.26.0)",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromBuildInfo(&tc.bi).String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestReadNamesTheProgramAndGo(t *testing.T) {
	got := Read().String()
	if !strings.HasPrefix(got, "amqp-mirror ") || !strings.Contains(got, "(go1.") {
		t.Errorf("Read().String() = %q, want \"amqp-mirror VERSION (go1.…\"", got)
	}
}
