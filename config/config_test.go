package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

const validBackends = `
backends:
  - name: rabbit1
    url: amqp://mirror:secret@127.0.0.1:5681/
  - name: rabbit2
    url: amqps://mirror:secret@127.0.0.1:5682/
`

// writeConfig writes body to a fresh file and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "amqp-mirror.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func policy(def string) string {
	return validBackends + `
policies:
  - name: p0
    pattern: "^a"
    definition: {ha-mode: all}
  - name: p1
    pattern: "^b"
    definition: ` + def + "\n"
}

func TestLoadExample(t *testing.T) {
	c, err := Load("testdata/example.yaml", nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"node", c.Node, "rabbit1"},
		{"backends", len(c.Backends), 2},
		{"policy mode", c.Policies[0].Definition.HAMode, HAExactly},
		{"policy params", c.Policies[0].Definition.HAParams.Count, 2},
		{"policy sync", c.Policies[0].Definition.SyncMode, SyncAutomatic},
		{"policy apply-to", c.Policies[0].ApplyTo, ApplyQueues},
		{"policy source", c.Policies[0].Source, SourceFile},
		{"failover_grace", c.FailoverGrace, 2 * time.Second},
		{"heartbeat", c.Heartbeat, 60 * time.Second},
		{"frame_max", c.FrameMax, 131072},
		{"locator", c.QueueMasterLocator, LocatorMinMasters},
	}
	for _, tc := range checks {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestLoadDefaults(t *testing.T) {
	path := writeConfig(t, validBackends)
	c, err := Load(path, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	d := Default()
	// A relative state_dir is relative to the file, so serve and ctl agree
	// on it whatever their working directories.
	wantStateDir := filepath.Join(filepath.Dir(path), "state")
	if c.Listen != d.Listen || c.HandshakeTimeout != 10*time.Second || c.ShutdownTimeout != 30*time.Second ||
		c.ChannelMax != 2047 || c.Log != (Log{"info", "text"}) || c.StateDir != wantStateDir {
		t.Errorf("got %+v, want the defaults %+v", c, d)
	}
	if _, err := Load("", nil); err == nil || !strings.Contains(err.Error(), "backends: at least one backend is required") {
		t.Errorf("Load(\"\") error = %v, want the backends requirement", err)
	}
}

func TestLoadValidation(t *testing.T) {
	tests := []struct {
		name string
		body string
		path string // key path the error must name
		want string // expectation the error must state
	}{
		{"unknown top-level key", validBackends + "listen_amqp: x\n", "listen_amqp", "unknown key"},
		{"unknown nested key", validBackends + "listen: {amqp: 0.0.0.0:1, port: 5}\n", "listen.port", "unknown key"},
		{"unknown tls key", validBackends + "listen: {tls: {cert: a, key: b, ca: c}}\n", "listen.tls.ca", "unknown key"},
		{"section of wrong type", validBackends + "listen: 5672\n", "listen", "expected a mapping"},
		{"wrong type duration", validBackends + "failover_grace: 2\n", "failover_grace", "expected a positive duration"},
		{"bad duration", validBackends + "failover_grace: soon\n", "failover_grace", "found \"soon\""},
		{"wrong type int", validBackends + "frame_max: big\n", "frame_max", "expected an integer from 4096"},
		{"frame_max too small", validBackends + "frame_max: 1024\n", "frame_max", "found 1024"},
		{"channel_max range", validBackends + "channel_max: 70000\n", "channel_max", "from 1 to 65535"},
		{"heartbeat fraction", validBackends + "heartbeat: 1500ms\n", "heartbeat", "whole seconds"},
		{"log level", validBackends + "log: {level: verbose}\n", "log.level", "one of debug, info, warn, error"},
		{"log format", validBackends + "log: {format: xml}\n", "log.format", "one of text, json"},
		{"metrics per_queue type", validBackends + "metrics: {per_queue: yes please}\n", "metrics.per_queue", "expected true or false"},
		{"metrics unknown key", validBackends + "metrics: {per_vhost: true}\n", "metrics.per_vhost", "unknown key"},
		{"locator", validBackends + "queue_master_locator: nearest\n", "queue_master_locator", "one of min-masters, client-local, random"},
		{"listen address", validBackends + "listen: {amqp: localhost}\n", "listen.amqp", "host:port"},
		{"cluster join type", validBackends + "cluster: {join: 7946}\n", "cluster.join", "a list of host:port"},
		{"cluster join address", validBackends + "node: rabbit1\ncluster: {bind: 127.0.0.1:7946, join: [node2]}\n", "cluster.join[0]", "expected an address host:port such as 10.0.0.2:7946, found \"node2\""},
		{"cluster join without bind", validBackends + "cluster: {join: [127.0.0.1:7946]}\n", "cluster.join", "expected cluster.bind to be set too"},
		{"cluster without node", validBackends + "cluster: {bind: 127.0.0.1:7946}\n", "node", "when cluster.bind is set"},
		{"cluster bind unspecified", validBackends + "node: rabbit1\ncluster: {bind: 0.0.0.0:7946}\n", "cluster.advertise", "since cluster.bind 0.0.0.0:7946 is not one"},
		{"cluster advertise not an IP", validBackends + "node: rabbit1\ncluster: {bind: 0.0.0.0:7946, advertise: \"proxy1:7946\"}\n", "cluster.advertise", "found \"proxy1:7946\""},
		{"cluster raft_bind port", validBackends + "node: rabbit1\ncluster: {bind: 127.0.0.1:7946, raft_bind: 127.0.0.1:0}\n", "cluster.raft_bind", "port from 1 to 65535"},
		{"cluster raft_bind same as bind", validBackends + "node: rabbit1\ncluster: {bind: 127.0.0.1:7946, raft_bind: 127.0.0.1:7946}\n", "cluster.raft_bind", "other than cluster.bind"},
		{"cluster raft port derived", validBackends + "node: rabbit1\ncluster: {bind: 127.0.0.1:65535}\n", "cluster.raft_bind", "port + 1 (65536) is no port"},
		{"cluster bootstrap_expect", validBackends + "node: rabbit1\ncluster: {bind: 127.0.0.1:7946, bootstrap_expect: -1}\n", "cluster.bootstrap_expect", "expected an integer from 0 to 99, found -1"},
		{"cluster unknown key", validBackends + "cluster: {bootstrap: 3}\n", "cluster.bootstrap", "unknown key"},
		{"no backends", "node: x\n", "backends", "at least one backend is required"},
		{"backends not a list", "backends: rabbit1\n", "backends", "expected a list"},
		{"duplicate backend", validBackends + "  - {name: rabbit1, url: \"amqp://h:1/\"}\n", "backends[2].name", "unique backend name, found \"rabbit1\" again"},
		{"backend url scheme", "backends: [{name: a, url: \"http://h:1/\"}]\n", "backends[0].url", "expected an amqp:// or amqps:// URL, found scheme \"http\""},
		{"backend url host", "backends: [{name: a, url: \"amqp:///\"}]\n", "backends[0].url", "with a host"},
		{"backend unknown key", "backends: [{name: a, url: \"amqp://h/\", weight: 2}]\n", "backends[0].weight", "unknown key"},
		{"backend missing name", "backends: [{url: \"amqp://h/\"}]\n", "backends[0].name", "non-empty string"},
		{"node not a backend", validBackends + "node: rabbit9\n", "node", "expected the name of a backend (rabbit1, rabbit2), found \"rabbit9\""},
		{"tls half", validBackends + "listen: {tls: {cert: a.pem}}\n", "listen.tls", "both cert and key"},
		{"amqps without tls", validBackends + "listen: {amqps: 0.0.0.0:5671}\n", "listen.amqps", "listen.tls.cert"},
		{"admin_tls cert only", validBackends + "listen: {admin_tls: {cert: admin.pem}}\n", "listen.admin_tls", "expected both cert and key (or neither), found only cert: set listen.admin_tls.key too"},
		{"admin_tls key only", validBackends + "listen: {admin_tls: {key: admin.key}}\n", "listen.admin_tls", "found only key: set listen.admin_tls.cert too"},
		{"admin_tls ca alone", validBackends + "listen: {admin_tls: {ca: ca.pem}}\n", "listen.admin_tls.ca", "expected listen.admin_tls.cert and listen.admin_tls.key to be set too"},
		{"admin_tls without admin", validBackends + "listen: {admin: \"\", admin_tls: {cert: a.pem, key: a.key}}\n", "listen.admin_tls", "expected listen.admin to be set"},
		{"admin_tls unknown key", validBackends + "listen: {admin_tls: {cert: a.pem, key: a.key, identity: x}}\n", "listen.admin_tls.identity", "unknown key"},
		{"admin_tls not a mapping", validBackends + "listen: {admin_tls: on}\n", "listen.admin_tls", "expected a mapping with keys [ca cert key]"},
		{"admin_tls cert type", validBackends + "listen: {admin_tls: {cert: 5, key: a.key}}\n", "listen.admin_tls.cert", "expected a non-empty string, found 5"},
		{"bad pattern", validBackends + "policies: [{name: p, pattern: \"([\", definition: {ha-mode: all}}]\n", "policies[0].pattern", "expected a regular expression"},
		{"duplicate policy", validBackends + "policies: [{name: p, pattern: a, definition: {ha-mode: all}}, {name: p, pattern: b, definition: {ha-mode: all}}]\n", "policies[1].name", "unique policy name in vhost \"/\""},
		{"unknown policy key", validBackends + "policies: [{name: p, pattern: a, applyto: queues, definition: {ha-mode: all}}]\n", "policies[0].applyto", "unknown key"},
		{"apply-to", validBackends + "policies: [{name: p, pattern: a, apply-to: streams, definition: {ha-mode: all}}]\n", "policies[0].apply-to", "one of queues, exchanges, all"},
		{"priority type", validBackends + "policies: [{name: p, pattern: a, priority: high, definition: {ha-mode: all}}]\n", "policies[0].priority", "expected an integer"},
		{"missing definition", validBackends + "policies: [{name: p, pattern: a}]\n", "policies[0].definition", "found none"},
		{"exactly without params", policy("{ha-mode: exactly}"), "policies[1].definition.ha-params", "needs ha-params, a positive integer"},
		{"exactly with zero", policy("{ha-mode: exactly, ha-params: 0}"), "policies[1].definition.ha-params", "positive integer, found 0"},
		{"exactly with string", policy("{ha-mode: exactly, ha-params: two}"), "policies[1].definition.ha-params", "found \"two\" (string)"},
		{"exactly with float", policy("{ha-mode: exactly, ha-params: 2.5}"), "policies[1].definition.ha-params", "found 2.5"},
		{"all with params", policy("{ha-mode: all, ha-params: 2}"), "policies[1].definition.ha-params", "does not take ha-params"},
		{"nodes empty", policy("{ha-mode: nodes, ha-params: []}"), "policies[1].definition.ha-params", "found an empty list"},
		{"nodes not a list", policy("{ha-mode: nodes, ha-params: rabbit1}"), "policies[1].definition.ha-params", "list of backend names"},
		{"nodes non-string", policy("{ha-mode: nodes, ha-params: [rabbit1, 2]}"), "policies[1].definition.ha-params[1]", "backend name"},
		{"unknown ha-mode", policy("{ha-mode: some}"), "policies[1].definition.ha-mode", "one of exactly, all, nodes"},
		{"sync mode", policy("{ha-mode: all, ha-sync-mode: eager}"), "policies[1].definition.ha-sync-mode", "one of manual, automatic"},
		{"batch size", policy("{ha-mode: all, ha-sync-batch-size: 0}"), "policies[1].definition.ha-sync-batch-size", "greater than 0"},
		{"promote", policy("{ha-mode: all, ha-promote-on-failure: never}"), "policies[1].definition.ha-promote-on-failure", "one of always, when-synced"},
		{"ha key without mode", policy("{ha-params: 2}"), "policies[1].definition.ha-params", "ha-mode must be specified"},
		{"unknown ha key", policy("{ha-mode: all, ha-sync: automatic}"), "policies[1].definition.ha-sync", "unknown key"},
		{"unknown definition key", policy("{max-lenght: 5}"), "policies[1].definition.max-lenght", "unknown key"},
		{"bad max-length", policy("{max-length: -1}"), "policies[1].definition.max-length", "an integer >= 0"},
		{"bad queue-master-locator", policy("{queue-master-locator: nearest}"), "policies[1].definition.queue-master-locator", "min-masters"},
		{"operator key not allowed", validBackends + "operator_policies: [{name: o, pattern: a, definition: {ha-promote-on-failure: always}}]\n", "operator_policies[0].definition.ha-promote-on-failure", "unknown key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.body)
			_, err := Load(path, nil)
			if err == nil {
				t.Fatalf("Load succeeded, want an error at %s", tc.path)
			}
			msg := err.Error()
			for _, want := range []string{"config file " + path, tc.path + ": ", tc.want} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q\ndoes not contain %q", msg, want)
				}
			}
		})
	}
}

func TestLoadValidDefinitions(t *testing.T) {
	for _, def := range []string{
		"{ha-mode: nodes, ha-params: [rabbit1, rabbit2], ha-promote-on-shutdown: always}",
		"{ha-mode: exactly, ha-params: 3, ha-sync-batch-size: 100, queue-master-locator: client-local}",
		"{max-length: 10, message-ttl: 0, dead-letter-exchange: dlx, expires: 1000, queue-mode: lazy, overflow: reject-publish}",
	} {
		if _, err := Load(writeConfig(t, policy(def)), nil); err != nil {
			t.Errorf("definition %s: %v", def, err)
		}
	}
}

func TestLoadReportsAllErrors(t *testing.T) {
	body := `
node: rabbit9
frame_max: 10
bogus: 1
backends:
  - {name: a, url: "http://h/"}
  - {name: a, url: "amqp://h/"}
policies:
  - {name: p, pattern: "(", definition: {ha-mode: exactly}}
  - {name: q, pattern: x, definition: {ha-mode: nodes, ha-params: [], ha-sync-mode: later}}
`
	path := writeConfig(t, body)
	_, err := Load(path, nil)
	if err == nil {
		t.Fatal("Load succeeded, want errors")
	}
	var fes []*FieldError
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		if errors.As(e, &fe) {
			fes = append(fes, fe)
		}
	}
	wantPaths := []string{"bogus", "frame_max", "policies[0].pattern", "policies[0].definition.ha-params",
		"policies[1].definition.ha-params", "policies[1].definition.ha-sync-mode", "backends[0].url", "backends[1].name", "node"}
	got := map[string]bool{}
	for _, fe := range fes {
		got[fe.Path] = true
		if fe.Source != "config file "+path {
			t.Errorf("error %v: source %q, want the file", fe, fe.Source)
		}
	}
	for _, p := range wantPaths {
		if !got[p] {
			t.Errorf("no error for %s in:\n%v", p, err)
		}
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	path := writeConfig(t, validBackends+"listen: {amqp: 0.0.0.0:5672}\nfailover_grace: 2s\nnode: rabbit1\ncluster: {bind: 127.0.0.1:7946}\n")
	t.Setenv("AMQP_MIRROR_LISTEN_AMQP", "127.0.0.1:6000")
	t.Setenv("AMQP_MIRROR_FAILOVER_GRACE", "7s")
	t.Setenv("AMQP_MIRROR_CLUSTER_JOIN", "a:1, b:2")
	t.Setenv("AMQP_MIRROR_FRAME_MAX", "8192")
	c, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen.amqp", c.Listen.AMQP, "127.0.0.1:6000"},
		{"failover_grace", c.FailoverGrace, 7 * time.Second},
		{"cluster.join", strings.Join(c.Cluster.Join, ","), "a:1,b:2"},
		{"frame_max", c.FrameMax, 8192},
	}
	for _, tc := range checks {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	t.Setenv("AMQP_MIRROR_HEARTBEAT", "often")
	_, err = Load(path, nil)
	if err == nil || !strings.Contains(err.Error(), "environment AMQP_MIRROR_HEARTBEAT: heartbeat: expected") {
		t.Errorf("bad env value: got %v, want an error naming the variable", err)
	}
}

func TestFlagOverrides(t *testing.T) {
	path := writeConfig(t, validBackends+"failover_grace: 2s\nlog: {level: warn}\nnode: rabbit1\ncluster: {bind: 127.0.0.1:7946}\n")
	t.Setenv("AMQP_MIRROR_FAILOVER_GRACE", "7s")
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse([]string{"--failover_grace=9s", "--listen.amqp", "127.0.0.1:7000", "--cluster.join", "x:1,y:2"}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path, fs)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"flag beats env and file", c.FailoverGrace, 9 * time.Second},
		{"flag beats default", c.Listen.AMQP, "127.0.0.1:7000"},
		{"unchanged flag keeps file", c.Log.Level, "warn"},
		{"slice flag", strings.Join(c.Cluster.Join, ","), "x:1,y:2"},
	}
	for _, tc := range checks {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	fs2 := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	RegisterFlags(fs2)
	_ = fs2.Parse([]string{"--frame_max=100"})
	if _, err := Load(path, fs2); err == nil || !strings.Contains(err.Error(), "flag --frame_max: frame_max: expected an integer from 4096") {
		t.Errorf("bad flag: got %v", err)
	}
}

// TestAdminTLSKeys loads listen.admin_tls from each source: the file's
// relative paths are the file's, as listen.tls's are, while the
// environment's and the flags' stay the working directory's.
func TestAdminTLSKeys(t *testing.T) {
	tests := []struct {
		name     string
		body     string            // after validBackends
		env      map[string]string // variable → value
		flags    []string
		want     func(dir string) AdminTLS
		wantHTTP bool // Enabled() is false
	}{
		{
			name:     "unset: plain HTTP",
			want:     func(string) AdminTLS { return AdminTLS{} },
			wantHTTP: true,
		},
		{
			name: "relative paths in the file are the file's",
			body: "listen: {admin_tls: {cert: tls/admin.pem, key: tls/admin.key, ca: tls/ca.pem}}\n",
			want: func(dir string) AdminTLS {
				return AdminTLS{Cert: filepath.Join(dir, "tls/admin.pem"), Key: filepath.Join(dir, "tls/admin.key"), CA: filepath.Join(dir, "tls/ca.pem")}
			},
		},
		{
			name: "absolute paths stay",
			body: "listen: {admin_tls: {cert: /etc/amqp-mirror/admin.pem, key: /etc/amqp-mirror/admin.key}}\n",
			want: func(string) AdminTLS {
				return AdminTLS{Cert: "/etc/amqp-mirror/admin.pem", Key: "/etc/amqp-mirror/admin.key"}
			},
		},
		{
			name: "environment",
			env:  map[string]string{"AMQP_MIRROR_LISTEN_ADMIN_TLS_CERT": "a.pem", "AMQP_MIRROR_LISTEN_ADMIN_TLS_KEY": "a.key"},
			want: func(string) AdminTLS { return AdminTLS{Cert: "a.pem", Key: "a.key"} },
		},
		{
			name:  "flags beat the file",
			body:  "listen: {admin_tls: {cert: file.pem, key: file.key}}\n",
			flags: []string{"--listen.admin_tls.cert", "flag.pem", "--listen.admin_tls.ca=ca.pem"},
			want: func(dir string) AdminTLS {
				return AdminTLS{Cert: "flag.pem", Key: filepath.Join(dir, "file.key"), CA: "ca.pem"}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for name, value := range tc.env {
				t.Setenv(name, value)
			}
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			RegisterFlags(fs)
			if err := fs.Parse(tc.flags); err != nil {
				t.Fatal(err)
			}
			path := writeConfig(t, validBackends+tc.body)
			c, err := Load(path, fs)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got, want := c.Listen.AdminTLS, tc.want(filepath.Dir(path)); got != want {
				t.Errorf("listen.admin_tls: got %+v, want %+v", got, want)
			}
			if got := c.Listen.AdminTLS.Enabled(); got == tc.wantHTTP {
				t.Errorf("Enabled() = %v, want %v", got, !tc.wantHTTP)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	for key, want := range map[string]string{
		"listen.amqp":         "AMQP_MIRROR_LISTEN_AMQP",
		"failover_grace":      "AMQP_MIRROR_FAILOVER_GRACE",
		"listen.tls.cert":     "AMQP_MIRROR_LISTEN_TLS_CERT",
		"listen.admin_tls.ca": "AMQP_MIRROR_LISTEN_ADMIN_TLS_CA",
	} {
		if got := EnvName(key); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestEnumStringsNeverPanic(t *testing.T) {
	for _, s := range []string{HAMode(99).String(), SyncMode(-1).String(), PromoteMode(7).String(), Locator(9).String(), ApplyTo(9).String(), Kind(5).String()} {
		if !strings.HasPrefix(s, "unknown(") {
			t.Errorf("got %q, want unknown(N)", s)
		}
	}
}

func TestClusterRaftAddresses(t *testing.T) {
	tests := []struct {
		name                    string
		cluster                 Cluster
		wantBind, wantAdvertise string
	}{
		{"derived from bind", Cluster{Bind: "127.0.0.1:7946"}, "127.0.0.1:7947", "127.0.0.1:7947"},
		{"advertise host", Cluster{Bind: "0.0.0.0:7946", Advertise: "10.0.0.1:8000"}, "0.0.0.0:7947", "10.0.0.1:7947"},
		{"raft_bind set", Cluster{Bind: "127.0.0.1:7946", RaftBind: "127.0.0.1:9000"}, "127.0.0.1:9000", "127.0.0.1:9000"},
		{"nothing to dial", Cluster{Bind: "0.0.0.0:7946"}, "0.0.0.0:7947", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bind, advertise := tc.cluster.RaftAddresses()
			if bind != tc.wantBind || advertise != tc.wantAdvertise {
				t.Errorf("RaftAddresses() = %q, %q; want %q, %q", bind, advertise, tc.wantBind, tc.wantAdvertise)
			}
		})
	}
}
