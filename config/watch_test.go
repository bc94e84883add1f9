package config

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// eventually polls check until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncBuffer is a log sink safe for the watch goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const watchBase = validBackends + "listen: {amqp: 127.0.0.1:5672}\nlog: {level: info}\n"

func policyBody(mode string) string {
	return watchBase + "policies: [{name: ha, pattern: \"^q\", definition: {ha-mode: " + mode + "}}]\n"
}

type watchFixture struct {
	path  string
	store *PolicyStore
	w     *Watcher
	logs  *syncBuffer
	level *slog.LevelVar
}

func newWatchFixture(t *testing.T, body string) *watchFixture {
	t.Helper()
	path := writeConfig(t, body)
	cfg, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := OpenPolicyStore("", cfg.Policies, cfg.OperatorPolicies)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	level := &slog.LevelVar{}
	w := NewWatcher(cfg, nil, store, slog.New(slog.NewTextHandler(logs, nil)), level)
	t.Cleanup(func() { w.Close() })
	return &watchFixture{path, store, w, logs, level}
}

func (f *watchFixture) write(t *testing.T, body string) {
	t.Helper()
	if err := os.WriteFile(f.path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *watchFixture) mode() HAMode {
	p := f.store.Snapshot().Match("/", "q1", KindQueue, false)
	if p == nil {
		return HANone
	}
	return p.Definition.HAMode
}

func TestReloadAppliesPolicies(t *testing.T) {
	f := newWatchFixture(t, policyBody("all"))
	f.write(t, strings.Replace(policyBody("exactly, ha-params: 2"), "level: info", "level: debug", 1))
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := f.mode(); got != HAExactly {
		t.Errorf("policy after reload: got %v, want exactly", got)
	}
	if got := f.level.Level(); got != slog.LevelDebug {
		t.Errorf("log level after reload: got %v, want debug", got)
	}
	if got := f.w.Current().Log.Level; got != "debug" {
		t.Errorf("Current().Log.Level: got %q", got)
	}
}

func TestReloadRefusesInvalidFile(t *testing.T) {
	f := newWatchFixture(t, policyBody("all"))
	before := f.w.Current()
	f.write(t, policyBody("exactly")) // ha-params missing
	err := f.w.Reload()
	if err == nil || !strings.Contains(err.Error(), "policies[0].definition.ha-params") {
		t.Fatalf("Reload: got %v, want a refusal naming the key", err)
	}
	if f.w.Current() != before || f.mode() != HAAll {
		t.Errorf("running config changed after a refused reload")
	}
	if !strings.Contains(f.logs.String(), "config reload refused") {
		t.Errorf("log lacks the refusal:\n%s", f.logs)
	}
}

func TestReloadRestartRequiredKeys(t *testing.T) {
	f := newWatchFixture(t, policyBody("all"))
	body := strings.Replace(policyBody("exactly, ha-params: 3"), "127.0.0.1:5672", "127.0.0.1:5999", 1)
	f.write(t, body+"frame_max: 8192\n")
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	cur := f.w.Current()
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen.amqp kept", cur.Listen.AMQP, "127.0.0.1:5672"},
		{"frame_max kept", cur.FrameMax, 131072},
		{"policy applied", f.mode(), HAExactly},
	}
	for _, tc := range checks {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	for _, want := range []string{"listen.amqp changed: restart required", "frame_max changed: restart required"} {
		if !strings.Contains(f.logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, f.logs)
		}
	}
}

func TestWatchFileEdit(t *testing.T) {
	f := newWatchFixture(t, policyBody("all"))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := f.w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.write(t, policyBody("exactly, ha-params: 2"))
	eventually(t, 5*time.Second, func() error {
		if got := f.mode(); got != HAExactly {
			return fmt.Errorf("policy mode %v, want exactly", got)
		}
		return nil
	})
	// An editor's atomic save: write elsewhere, rename over the file.
	tmp := f.path + ".new"
	if err := os.WriteFile(tmp, []byte(policyBody("nodes, ha-params: [rabbit1]")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		if got := f.mode(); got != HANodes {
			return fmt.Errorf("policy mode %v, want nodes", got)
		}
		return nil
	})
	cancel()
	f.w.Close()
}

func TestDiff(t *testing.T) {
	a := Default()
	b := Default()
	b.Listen.AMQP = "x:1"
	b.Listen.AdminTLS = AdminTLS{Cert: "admin.pem", Key: "admin.key"}
	b.Backends = []Backend{{Name: "r", URL: "amqp://h/"}}
	b.Log.Level = "debug"
	got := strings.Join(Diff(a, b), ",")
	if want := "listen.amqp,listen.admin_tls,backends,log.level"; got != want {
		t.Errorf("Diff: got %q, want %q", got, want)
	}
	// A backend's TLS files are read once at start: a change needs a restart.
	before, after := *b, *b
	before.Backends = []Backend{{Name: "r", URL: "amqps://h/"}}
	after.Backends = []Backend{{Name: "r", URL: "amqps://h/", TLS: BackendTLS{CA: "/new-ca.pem"}}}
	if got := strings.Join(Diff(&before, &after), ","); got != "backends" {
		t.Errorf("Diff after a backend's tls.ca changed: got %q, want %q", got, "backends")
	}
}
