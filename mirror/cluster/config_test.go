package cluster

import (
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	valid := Config{NodeName: "rabbit1", Bind: "127.0.0.1:7946", RaftBind: "127.0.0.1:7947", DataDir: "/tmp/x"}
	tests := []struct {
		name   string
		change func(*Config)
		want   []string // substrings of the error; none means valid
	}{
		{name: "valid", change: func(*Config) {}},
		{name: "port zero picks a port", change: func(c *Config) { c.Bind, c.RaftBind = "127.0.0.1:0", "127.0.0.1:0" }},
		{
			name:   "every problem at once",
			change: func(c *Config) { c.NodeName, c.DataDir, c.Bind = "", "", "nowhere" },
			want:   []string{"node name is empty", "data dir is empty", "bind: address nowhere"},
		},
		{
			name:   "raft on all interfaces needs an advertised address",
			change: func(c *Config) { c.RaftBind = "0.0.0.0:7947" },
			want:   []string{"set raft advertise"},
		},
		{
			name:   "raft on all interfaces with an advertised address",
			change: func(c *Config) { c.RaftBind, c.RaftAdvertise = "0.0.0.0:7947", "10.0.0.1:7947" },
		},
		{
			name:   "advertised address must be reachable",
			change: func(c *Config) { c.Advertise = "0.0.0.0:7946" },
			want:   []string{`advertise "0.0.0.0:7946"`},
		},
		{
			name:   "port out of range",
			change: func(c *Config) { c.RaftBind = "127.0.0.1:70000" },
			want:   []string{`port "70000"`},
		},
		{
			name:   "negative bootstrap expect",
			change: func(c *Config) { c.BootstrapExpect = -1 },
			want:   []string{"bootstrap expect -1"},
		},
		{
			name:   "probe timeout not shorter than the interval",
			change: func(c *Config) { c.ProbeInterval, c.ProbeTimeout = 100e6, 100e6 },
			want:   []string{"probe timeout"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.change(&c)
			err := c.validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("validate() = nil, want an error mentioning %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("validate() = %q, want it to mention %q", err, w)
				}
			}
		})
	}
}

func TestNamesNeverPanic(t *testing.T) {
	tests := []struct{ got, want string }{
		{StatusAlive.String(), "alive"},
		{StatusLeaving.String(), "leaving"},
		{StatusLeft.String(), "left"},
		{StatusFailed.String(), "failed"},
		{Status(42).String(), "Status(42)"},
		{EventJoin.String(), "join"},
		{EventLeave.String(), "leave"},
		{EventFail.String(), "fail"},
		{EventUpdate.String(), "update"},
		{EventReap.String(), "reap"},
		{EventKind(-1).String(), "EventKind(-1)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("String() = %q, want %q", tt.got, tt.want)
		}
	}
}
