package node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// dashboardPath is the Grafana dashboard shipped beside the deployment
// files.
const dashboardPath = "../../deploy/grafana/amqp-mirror.json"

// dashboard is the part of Grafana's dashboard JSON model the test reads.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Type    string `json:"type"`
		GridPos *struct {
			H, W, X, Y int
		} `json:"gridPos"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestGrafanaDashboard loads deploy/grafana/amqp-mirror.json: it is a
// Grafana dashboard with a Prometheus data source variable, and every
// metric its queries name is one a running sidecar proxy with several
// backends serves at /metrics (a _bucket, _sum or _count only of a
// histogram).
func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: want both", d.Title, d.UID)
	}
	var queries []string // every PromQL expression of the dashboard
	hasDatasource := false
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" && strings.Contains(string(v.Query), "prometheus") {
			hasDatasource = true
		}
		if v.Type == "query" {
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: query %s is not {\"query\": ...}: %v", v.Name, v.Query, err)
			}
			queries = append(queries, q.Query)
		}
	}
	if !hasDatasource {
		t.Error("no variable named datasource of type datasource for prometheus")
	}
	if len(d.Panels) == 0 {
		t.Fatal("no panels")
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		name := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		switch {
		case p.Title == "" || p.Type == "":
			t.Errorf("%s: want a title and a type", name)
		case ids[p.ID]:
			t.Errorf("%s: id used twice", name)
		case p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24:
			t.Errorf("%s: gridPos %+v, want a width and height within the 24 columns", name, p.GridPos)
		case p.Datasource.UID != "${datasource}":
			t.Errorf("%s: data source %q, want the variable ${datasource}", name, p.Datasource.UID)
		case len(p.Targets) == 0:
			t.Errorf("%s: no targets", name)
		}
		ids[p.ID] = true
		for _, target := range p.Targets {
			if target.Expr == "" || target.RefID == "" {
				t.Errorf("%s: target %+v without expr or refId", name, target)
			}
			queries = append(queries, target.Expr)
		}
	}

	served := scrapeRunningNode(t)
	for _, q := range queries {
		for _, name := range metricNames(q) {
			if err := servedAs(served, name); err != nil {
				t.Errorf("query %q: %v", q, err)
			}
		}
	}
}

var promName = regexp.MustCompile(`\b(?:amqp_mirror|go|process)_[a-zA-Z0-9_]+\b`)

// metricNames are the metric names a PromQL expression names.
func metricNames(expr string) []string { return promName.FindAllString(expr, -1) }

// servedAs reports whether name is served: a metric of its own, or a
// histogram's _bucket, _sum or _count.
func servedAs(served map[string]string, name string) error {
	if _, ok := served[name]; ok {
		return nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if kind := served[base]; kind != "histogram" {
			return fmt.Errorf("%s: %s is not a histogram /metrics serves (type %q)", name, base, kind)
		}
		return nil
	}
	return fmt.Errorf("%s is not served at /metrics", name)
}

// scrapeRunningNode runs a sidecar proxy alone in its cluster, with two
// backends that are down, and returns the metrics its /metrics serves:
// name → type.
func scrapeRunningNode(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	ports := closedPorts(t, 5)
	admin := ports[0]
	yaml := fmt.Sprintf(`node: rabbit1
listen: {amqp: 127.0.0.1:5672, admin: %q}
state_dir: %s
shutdown_timeout: 2s
backends:
  - {name: rabbit1, url: "amqp://guest:guest@%s/"}
  - {name: rabbit2, url: "amqp://guest:guest@%s/"}
cluster: {bind: %q, raft_bind: %q, bootstrap_expect: 1}
`, admin, filepath.Join(dir, "state"), ports[1], ports[2], ports[3], ports[4])
	path := filepath.Join(dir, "amqp-mirror.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen.AMQP = "127.0.0.1:0"
	logs := &syncBuffer{}
	ready := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, Options{
			Level:  new(slog.LevelVar),
			Logger: slog.New(slog.NewTextHandler(logs, nil)),
			Ready:  func(addr string) { ready <- addr },
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of ctx ending")
		}
	})
	select {
	case <-ready:
	case err := <-done:
		done <- err // for the cleanup, which waits for Run to return
		t.Fatalf("Run returned before it was ready: %v\n%s", err, logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("Run not ready within 60s:\n%s", logs.String())
	}
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	served := map[string]string{}
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		// # TYPE name kind
		if fields := strings.Fields(lines.Text()); len(fields) == 4 && fields[0] == "#" && fields[1] == "TYPE" {
			served[fields[2]] = fields[3]
		}
	}
	if err := lines.Err(); err != nil {
		t.Fatal(err)
	}
	return served
}
