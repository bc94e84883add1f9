package config

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestYAMLSyntaxErrorLines(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string
	}{
		{"unclosed flow sequence on line 2", "backends:\n  - name: [x\n", "line 2: did not find expected ',' or ']' (YAML syntax)"},
		{"unclosed flow mapping on line 3", "node: a\nb: c\nlisten: {amqp: x\n", "line 3: did not find expected ',' or '}' (YAML syntax)"},
		{"sequence item where a key belongs, line 2", "node: a\n- c\n", "line 2: did not find expected key (YAML syntax)"},
		{"bad indentation on line 4", "node: a\nlisten:\n  amqp: x\n admin: y\n", "line 4: did not find expected key (YAML syntax)"},
		// The sequence opened on line 1 is found unclosed where the file ends.
		{"unclosed flow sequence at the end of the file", "node: [x\n", "line 2: did not find expected ',' or ']' (YAML syntax)"},
		{"tab on line 2 (scanner)", "node: a\n\tlisten: 3\n", "line 2: found a tab character that violates indentation (YAML syntax)"},
		{"colon in a plain value on line 3 (scanner)", "a: b\nc: d\ne: f: g\n", "line 3: mapping values are not allowed in this context (YAML syntax)"},
		{"key given twice", "node: a\nnode: b\n", `YAML unmarshal errors: line 2: mapping key "node" already defined at line 1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.body)
			_, err := Load(path, nil)
			if err == nil {
				t.Fatal("Load succeeded, want a YAML error")
			}
			if want := "config file " + path + ": " + tc.want; err.Error() != want {
				t.Errorf("got  %q\nwant %q", err.Error(), want)
			}
		})
	}
}

func TestYAMLSyntaxErrorHidesTheLine(t *testing.T) {
	path := writeConfig(t, "backends:\n  - {name: a, url: \"amqp://mirror:s3cretpw@h/\"\n")
	_, err := Load(path, nil)
	if err == nil || strings.Contains(err.Error(), "s3cretpw") {
		t.Errorf("got %v, want a YAML error without the password", err)
	}
}

func TestListenAddressPorts(t *testing.T) {
	tests := []struct {
		addr string
		ok   bool
	}{
		{"0.0.0.0:5672", true},
		{"127.0.0.1:1", true},
		{"[::1]:65535", true},
		{":5672", true},
		{"127.0.0.1:0", false},
		{"127.0.0.1:65536", false},
		{"127.0.0.1:99999", false},
		{"127.0.0.1:amqp", false},
		{"127.0.0.1:-1", false},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			_, err := Load(writeConfig(t, validBackends+"listen: {amqp: \""+tc.addr+"\"}\n"), nil)
			switch {
			case tc.ok && err != nil:
				t.Errorf("Load: got %v, want no error", err)
			case !tc.ok && err == nil:
				t.Errorf("Load succeeded, want an error for listen.amqp %s", tc.addr)
			case !tc.ok && !strings.Contains(err.Error(), "listen.amqp: expected an address host:port such as 0.0.0.0:5672") ||
				!tc.ok && strings.Contains(tc.addr, ":0") && !strings.Contains(err.Error(), "port from 1 to 65535"):
				t.Errorf("error %q does not name listen.amqp and its port range", err)
			}
		})
	}
}

// TestTextValueMessages checks what a flag or an environment variable,
// which are always text, is told: the number as a number, a word quoted,
// and never "(string)".
func TestTextValueMessages(t *testing.T) {
	tests := []struct {
		name string
		flag string // --name=value
		env  string // NAME=value
		want string
	}{
		{"flag below the minimum", "--frame_max=100", "", `flag --frame_max: frame_max: expected an integer from 4096 to 4294967295, found 100, below the minimum 4096`},
		{"flag above the maximum", "--channel_max=70000", "", `flag --channel_max: channel_max: expected an integer from 1 to 65535, found 70000, above the maximum 65535`},
		{"flag not a number", "--frame_max=big", "", `flag --frame_max: frame_max: expected an integer from 4096 to 4294967295, found "big"`},
		{"flag bad duration", "--failover_grace=soon", "", `flag --failover_grace: failover_grace: expected a positive duration such as 2s or 500ms, found "soon"`},
		{"flag listen port", "--listen.admin=127.0.0.1:99999", "", `flag --listen.admin: listen.admin: expected an address host:port such as 0.0.0.0:5672 with a port from 1 to 65535, found "127.0.0.1:99999"`},
		{"environment below the minimum", "", "AMQP_MIRROR_CHANNEL_MAX=0", `environment AMQP_MIRROR_CHANNEL_MAX: channel_max: expected an integer from 1 to 65535, found 0, below the minimum 1`},
		{"environment enum", "", "AMQP_MIRROR_LOG_LEVEL=loud", `environment AMQP_MIRROR_LOG_LEVEL: log.level: expected one of debug, info, warn, error, found "loud"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			RegisterFlags(fs)
			if tc.flag != "" {
				if err := fs.Parse([]string{tc.flag}); err != nil {
					t.Fatalf("parse %s: %v", tc.flag, err)
				}
			}
			if tc.env != "" {
				name, value, _ := strings.Cut(tc.env, "=")
				t.Setenv(name, value)
			}
			_, err := Load(writeConfig(t, validBackends), fs)
			if err == nil {
				t.Fatalf("Load succeeded, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got  %q\nwant %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "(string)") {
				t.Errorf("error %q calls text a string", err)
			}
		})
	}
}

func TestFileIntegerOutOfRange(t *testing.T) {
	_, err := Load(writeConfig(t, validBackends+"frame_max: 100\n"), nil)
	want := "frame_max: expected an integer from 4096 to 4294967295, found 100, below the minimum 4096"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want %q", err, want)
	}
}

// TestOneErrorPerKey checks that one wrong key is reported once, whatever
// other checks look at it.
func TestOneErrorPerKey(t *testing.T) {
	tests := []struct {
		name string
		body string
		path string
	}{
		{"backend without url", "backends: [{name: rabbit1}]\n", "backends[0].url"},
		{"backend with an empty url", "backends: [{name: rabbit1, url: \"\"}]\n", "backends[0].url"},
		{"backend url of a wrong type", "backends: [{name: rabbit1, url: 5}]\n", "backends[0].url"},
		{"backend url unparseable", "backends: [{name: rabbit1, url: \"amqp://[::1/\"}]\n", "backends[0].url"},
		{"backend without name", "backends: [{url: \"amqp://h/\"}]\n", "backends[0].name"},
		{"section of a wrong type", validBackends + "listen: 5\n", "listen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeConfig(t, tc.body), nil)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			n := 0
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				if fe, ok := e.(*FieldError); ok && fe.Path == tc.path {
					n++
				}
			}
			if n != 1 {
				t.Errorf("got %d errors for %s, want 1:\n%v", n, tc.path, err)
			}
		})
	}
}
