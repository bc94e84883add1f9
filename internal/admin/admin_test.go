package admin

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

const testToken = "s3cret"

type fixture struct {
	store  *config.PolicyStore
	server *Server
	client *Client
	url    string
}

func newFixture(t *testing.T, opts ...Option) *fixture {
	t.Helper()
	d, err := config.ParseDefinition([]byte(`{"ha-mode":"all"}`))
	if err != nil {
		t.Fatal(err)
	}
	filePolicy, err := config.Policy{Name: "from-file", Pattern: "^file_", Definition: d}.Validated(false)
	if err != nil {
		t.Fatal(err)
	}
	store, err := config.OpenPolicyStore(t.TempDir(), []config.Policy{filePolicy}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(store, testToken, nil, opts...)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &fixture{store, srv, &Client{BaseURL: ts.URL, Token: testToken, HTTP: ts.Client()}, ts.URL}
}

func TestClientPolicies(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.client.SetPolicy(ctx, "/", "ha-two", "^queue_", "queues", 3, `{"ha-mode":"exactly","ha-params":2}`); err != nil {
		t.Fatal(err)
	}
	if err := f.client.SetPolicy(ctx, "prod", "ha-all", ".", "", 0, `{"ha-mode":"all"}`); err != nil {
		t.Fatal(err)
	}
	list, err := f.client.ListPolicies(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range list {
		got[p.Name] = p.Source + " " + p.ApplyTo.String() + " " + p.Definition.String()
	}
	want := map[string]string{
		"ha-two":    `runtime queues {"ha-mode":"exactly","ha-params":2}`,
		"from-file": `file all {"ha-mode":"all"}`,
	}
	if len(got) != len(want) || got["ha-two"] != want["ha-two"] || got["from-file"] != want["from-file"] {
		t.Errorf("ListPolicies(/): got %v, want %v", got, want)
	}
	if p := f.store.Snapshot().Match("prod", "x", config.KindQueue, false); p == nil || p.Name != "ha-all" {
		t.Errorf("policy in vhost prod not in the store: %v", p)
	}
	r, err := f.client.Explain(ctx, "/", "queue_1")
	if err != nil {
		t.Fatal(err)
	}
	if r.User.Winner != "ha-two" || r.Effective.HAParams.Count != 2 {
		t.Errorf("Explain: winner %q, effective %v", r.User.Winner, r.Effective)
	}
	if err := f.client.ClearPolicy(ctx, "/", "ha-two"); err != nil {
		t.Fatal(err)
	}
	if err := f.client.SetOperatorPolicy(ctx, "/", "cap", ".", "queues", 0, `{"max-length":100}`); err != nil {
		t.Fatal(err)
	}
	ops, err := f.client.ListOperatorPolicies(ctx, "")
	if err != nil || len(ops) != 1 || ops[0].Source != config.SourceOperatorRuntime {
		t.Errorf("ListOperatorPolicies: %v %v", ops, err)
	}
	if err := f.client.ClearOperatorPolicy(ctx, "/", "cap"); err != nil {
		t.Fatal(err)
	}
}

func TestClientErrors(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tests := []struct {
		name   string
		call   func() error
		status int
		want   string
	}{
		{"bad definition", func() error {
			return f.client.SetPolicy(ctx, "/", "p", ".", "", 0, `{"ha-mode":"exactly"}`)
		}, 400, "definition.ha-params: ha-mode \"exactly\" needs ha-params"},
		{"bad pattern", func() error { return f.client.SetPolicy(ctx, "/", "p", "(", "", 0, `{"ha-mode":"all"}`) }, 400, "pattern: expected a regular expression"},
		{"bad apply-to", func() error { return f.client.SetPolicy(ctx, "/", "p", ".", "streams", 0, `{"ha-mode":"all"}`) }, 400, "apply-to: expected one of queues, exchanges, all"},
		{"operator key", func() error {
			return f.client.SetOperatorPolicy(ctx, "/", "p", ".", "", 0, `{"ha-mode":"all","ha-promote-on-failure":"always"}`)
		}, 400, "ha-promote-on-failure: unknown key"},
		{"clear missing", func() error { return f.client.ClearPolicy(ctx, "/", "nope") }, 404, "policy not found"},
		{"clear file policy", func() error { return f.client.ClearPolicy(ctx, "/", "from-file") }, 409, "config file"},
		{"wrong token", func() error {
			c := *f.client
			c.Token = "wrong"
			_, err := c.ListPolicies(ctx, "/")
			return err
		}, 401, "missing or wrong admin token"},
		{"no token", func() error {
			c := *f.client
			c.Token = ""
			return c.SetPolicy(ctx, "/", "p", ".", "", 0, `{"ha-mode":"all"}`)
		}, 401, "missing or wrong admin token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var api *APIError
			if !errors.As(err, &api) {
				t.Fatalf("got %v, want an *APIError", err)
			}
			if api.Status != tc.status || !strings.Contains(api.Message, tc.want) {
				t.Errorf("got %d %q, want %d containing %q", api.Status, api.Message, tc.status, tc.want)
			}
		})
	}
	if err := f.client.SetPolicy(ctx, "/", "p", ".", "", 0, `{ha-mode: all}`); err == nil || !strings.Contains(err.Error(), "definition: expected a JSON object") {
		t.Errorf("invalid JSON: got %v", err)
	}
}

func TestRawRequests(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name, method, path, body string
		auth                     bool
		status                   int
		want                     string
	}{
		{"unknown field", "PUT", "/api/policies/%2F/p", `{"pattern":".","definition":{"ha-mode":"all"},"apply_to":"queues"}`, true, 400, "unknown field"},
		{"not json", "PUT", "/api/policies/%2F/p", `pattern=.`, true, 400, "request body"},
		{"no definition", "PUT", "/api/policies/%2F/p", `{"pattern":"."}`, true, 400, "definition: expected a JSON object"},
		{"explain without name", "GET", "/api/explain?vhost=%2F", "", true, 400, "name: expected"},
		{"unknown endpoint", "GET", "/api/bindings", "", true, 404, "no such endpoint"},
		{"queue endpoint, wrong method", "DELETE", "/api/queues/%2F/q/actions", "", true, 404, "no such endpoint"},
		{"anonymous change", "DELETE", "/api/policies/%2F/from-file", "", false, 401, "admin token"},
		{"metrics without auth", "GET", "/metrics", "", false, 200, `amqp_mirror_policies{kind="policy"} 1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, f.url+tc.path, strings.NewReader(tc.body))
			if tc.auth {
				req.Header.Set("Authorization", "Bearer "+testToken)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.want) {
				t.Errorf("got %d %s, want %d containing %q", resp.StatusCode, body, tc.status, tc.want)
			}
		})
	}
}

// scrape fetches h's /metrics as Prometheus would, in the text format.
func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type %q, want the Prometheus text format", ct)
	}
	return rec.Body.String()
}

func TestMetrics(t *testing.T) {
	r := NewRegistry()
	publishes := 42.0
	r.Gauge(`amqp_mirror_backend_up{backend="rabbit1"}`, "Backend reachable.", func() float64 { return 1 })
	r.Gauge(`amqp_mirror_backend_up{backend="rabbit2"}`, "Backend reachable.", func() float64 { return 0 })
	r.Counter("amqp_mirror_publishes_total", "Publishes.", func() float64 { return publishes })
	r.Gauge(`amqp_mirror_escaped{name="a\"b"}`, "Escaped label.", func() float64 { return 3 })
	got := scrape(t, r.Handler())
	for _, want := range []string{
		"# HELP amqp_mirror_backend_up Backend reachable.\n# TYPE amqp_mirror_backend_up gauge\n" +
			`amqp_mirror_backend_up{backend="rabbit1"} 1` + "\n" + `amqp_mirror_backend_up{backend="rabbit2"} 0` + "\n",
		"# HELP amqp_mirror_publishes_total Publishes.\n# TYPE amqp_mirror_publishes_total counter\namqp_mirror_publishes_total 42\n",
		`amqp_mirror_escaped{name="a\"b"} 3`,
		// The collectors Prometheus users expect beside the application's own.
		"# TYPE go_goroutines gauge",
		"# TYPE go_memstats_heap_alloc_bytes gauge",
		"# TYPE process_resident_memory_bytes gauge",
		"# TYPE process_open_fds gauge",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("scrape lacks %q; got:\n%s", want, got)
		}
	}
	// Values are read at scrape time, not copied at registration.
	publishes = 43
	if got := scrape(t, r.Handler()); !strings.Contains(got, "amqp_mirror_publishes_total 43\n") {
		t.Errorf("second scrape lacks amqp_mirror_publishes_total 43; got:\n%s", got)
	}

	bad := []struct{ name, series string }{
		{"leading digit", "1abc"},
		{"dash", "a-b"},
		{"unquoted label", `x{y=z}`},
		{"series registered twice", `amqp_mirror_backend_up{backend="rabbit1"}`},
		{"gauge name registered as a counter", "amqp_mirror_publishes_total"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("Gauge(%q) accepted, want a panic", tc.series)
				}
			}()
			r.Gauge(tc.series, "Backend reachable.", func() float64 { return 0 })
		})
	}
}

// TestServerMetricNames checks the names and labels the admin server
// itself exports, which dashboards depend on.
func TestServerMetricNames(t *testing.T) {
	f := newFixture(t)
	got := scrape(t, f.server.Handler())
	for _, want := range []string{
		"# TYPE amqp_mirror_policies gauge",
		`amqp_mirror_policies{kind="policy"} 1`,
		`amqp_mirror_policies{kind="operator_policy"} 0`,
		"# TYPE amqp_mirror_policy_changes_total counter",
		"amqp_mirror_policy_changes_total 0",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("scrape lacks %q; got:\n%s", want, got)
		}
	}
}

func TestServe(t *testing.T) {
	f := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.server.Serve(ctx, ln) }()
	c := &Client{BaseURL: "http://" + ln.Addr().String(), Token: testToken}
	if _, err := c.ListPolicies(context.Background(), "/"); err != nil {
		t.Errorf("ListPolicies over a real listener: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
}
