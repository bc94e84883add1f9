// Package version says which build of amqp-mirror is running, from what the
// Go toolchain recorded in the binary (runtime/debug.ReadBuildInfo): the
// module version, the Go version, and the VCS revision it was built from.
package version

import (
	"runtime/debug"
	"strings"
)

// Info is what a binary knows about its own build.
type Info struct {
	Version   string // the module version, "devel" when the build has none
	GoVersion string // e.g. go1.26.0
	Revision  string // the VCS commit, "" when not recorded
	Modified  bool   // the work tree had uncommitted changes
}

// Read returns the running binary's Info.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "devel"}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo extracts Info from bi. A version of "" or "(devel)" (a
// build of a work tree without VCS stamping) is "devel".
func FromBuildInfo(bi *debug.BuildInfo) Info {
	info := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if info.Version == "" || info.Version == "(devel)" {
		info.Version = "devel"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is the --version line: "amqp-mirror v1.2.0 (go1.26.0, commit
// 0123456789ab, modified)"; the parts the build did not record are left out.
func (i Info) String() string {
	var details []string
	if i.GoVersion != "" {
		details = append(details, i.GoVersion)
	}
	if i.Revision != "" {
		details = append(details, "commit "+short(i.Revision))
		if i.Modified {
			details = append(details, "modified")
		}
	}
	s := "amqp-mirror " + i.Version
	if len(details) > 0 {
		s += " (" + strings.Join(details, ", ") + ")"
	}
	return s
}

// short abbreviates a commit hash to 12 digits, as git does in most logs.
func short(revision string) string {
	if len(revision) > 12 {
		return revision[:12]
	}
	return revision
}

// LogAttrs are the slog attributes of serve's first log line.
func (i Info) LogAttrs() []any {
	attrs := []any{"version", i.Version, "go", i.GoVersion}
	if i.Revision != "" {
		attrs = append(attrs, "commit", short(i.Revision), "modified", i.Modified)
	}
	return attrs
}
