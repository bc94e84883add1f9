package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func ctl(t *testing.T, c *Client, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = RunCtl(context.Background(), args, c, &out, &errOut)
	return code, out.String(), errOut.String()
}

// ctlCase is one run of ctl against a fixture's client: the exit code,
// the whole stdout, and a part of stderr.
type ctlCase struct {
	name       string
	client     *Client
	args       []string
	code       int
	wantStdout string
	wantStderr string
}

// runCtlCases runs each case as a subtest and checks that none of
// notShown (secrets) appears in its output.
func runCtlCases(t *testing.T, cases []ctlCase, notShown ...string) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := ctl(t, tc.client, tc.args...)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if out != tc.wantStdout {
				t.Errorf("stdout:\ngot  %q\nwant %q", out, tc.wantStdout)
			}
			if !strings.Contains(errOut, tc.wantStderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.wantStderr, errOut)
			}
			for _, secret := range notShown {
				if strings.Contains(out+errOut, secret) {
					t.Errorf("the output shows a secret:\n%s%s", out, errOut)
				}
			}
		})
	}
}

func TestRunCtl(t *testing.T) {
	f := newFixture(t)
	steps := []struct {
		name       string
		args       []string
		code       int
		stdout     []string
		stderr     string
		afterCheck func(t *testing.T)
	}{
		{"set_policy", []string{"set_policy", "-p", "/", "--priority", "2", "--apply-to", "queues", "ha-two", "^queue_", `{"ha-mode":"exactly","ha-params":2}`}, 0,
			[]string{`Setting policy "ha-two" for pattern "^queue_" to "{\"ha-mode\":\"exactly\",\"ha-params\":2}" with priority "2" for vhost "/" ...`}, "", nil},
		{"set_policy flags after arguments", []string{"set_policy", "ha-all", "^all_", `{"ha-mode":"all","ha-sync-mode":"automatic"}`, "--priority", "1"}, 0, nil, "", nil},
		{"list_policies", []string{"list_policies"}, 0, []string{
			"Listing policies for vhost \"/\" ...",
			"vhost\tname\tpattern\tapply-to\tdefinition\tpriority\tsource",
			"/\tha-two\t^queue_\tqueues\t{\"ha-mode\":\"exactly\",\"ha-params\":2}\t2\truntime",
			"/\tha-all\t^all_\tall\t{\"ha-mode\":\"all\",\"ha-sync-mode\":\"automatic\"}\t1\truntime",
			"/\tfrom-file\t^file_\tall\t{\"ha-mode\":\"all\"}\t0\tfile",
		}, "", nil},
		{"list_policies --explain", []string{"list_policies", "--explain", "queue_1"}, 0, []string{
			"* ha-two\tpriority 2", "applies: policy ha-two, operator policy (none)",
		}, "", nil},
		{"override a file policy", []string{"set_policy", "from-file", "^file_", `{"ha-mode":"exactly","ha-params":3}`}, 0, nil, "", nil},
		{"list shows the override", []string{"list_policies", "-q"}, 0, []string{"\t0\truntime (overrides file)"}, "", nil},
		{"clear_policy", []string{"clear_policy", "ha-two"}, 0, []string{`Clearing policy "ha-two" on vhost "/" ...`}, "", nil},
		{"clear_policy missing", []string{"clear_policy", "ha-two"}, ExitDataErr, nil, "policy not found", nil},
		{"set_operator_policy", []string{"set_operator_policy", "--apply-to", "queues", "cap", ".", `{"max-length":10,"ha-mode":"exactly","ha-params":3}`}, 0, nil, "", nil},
		{"list_operator_policies", []string{"list_operator_policies"}, 0, []string{"/\tcap\t.\tqueues\t{\"ha-mode\":\"exactly\",\"ha-params\":3,\"max-length\":10}\t0\toperator-runtime"}, "", nil},
		{"clear_operator_policy", []string{"clear_operator_policy", "cap"}, 0, nil, "", nil},
		{"bad definition", []string{"set_policy", "x", ".", `{"ha-mode":"nodes","ha-params":[]}`}, ExitDataErr, nil, "definition.ha-params: ha-mode \"nodes\" takes a non-empty list", nil},
		{"invalid JSON", []string{"set_policy", "x", ".", `{ha-mode:all}`}, ExitDataErr, nil, "definition: expected a JSON object", nil},
		{"missing argument", []string{"set_policy", "x", "."}, ExitUsage, nil, "expected 3 argument(s), found 2", nil},
		{"unknown flag", []string{"clear_policy", "--priority", "1", "x"}, ExitUsage, nil, "unknown flag: --priority", nil},
		{"unknown command", []string{"list_bindings"}, ExitUsage, nil, "unknown command \"list_bindings\"", nil},
		{"help", []string{"help"}, 0, []string{"  set_operator_policy     sets an operator policy", "  list_policies           lists the policies of a vhost", "--formatter string"}, "", nil},
		{"list_policies --formatter json", []string{"list_policies", "--formatter", "json"}, 0, []string{
			`[{"vhost":"/","name":"ha-all","pattern":"^all_","apply-to":"all","definition":{"ha-mode":"all","ha-sync-mode":"automatic"},"priority":1,"source":"runtime","overrides_file":false},`,
		}, "", nil},
		{"--formatter before the command", []string{"--formatter=json", "-p", "/", "list_operator_policies"}, 0, []string{"[]\n"}, "", nil},
		{"--explain --formatter json", []string{"list_policies", "--explain", "all_1", "--formatter", "json"}, 0, []string{`"winner":"ha-all"`}, "", nil},
		{"unknown formatter", []string{"list_policies", "--formatter", "csv"}, ExitUsage, nil, "--formatter: expected table or json", nil},
		{"formatter on a command that lists nothing", []string{"set_policy", "--formatter", "json", "fmt", "^fmt", `{"ha-mode":"all"}`}, 0, nil, "", nil},
		{"clear it", []string{"clear_policy", "fmt"}, 0, nil, "", nil},
		{"help command", []string{"help", "clear_policy"}, 0, []string{"Usage: amqp-mirror ctl clear_policy [-p VHOST] NAME"}, "", nil},
		{"--help", []string{"set_policy", "--help"}, 0, []string{"--apply-to string", "--priority int", "ha-params"}, "", nil},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			code, out, errOut := ctl(t, f.client, s.args...)
			if code != s.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, s.code, errOut)
			}
			for _, want := range s.stdout {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}
			if s.stderr != "" && !strings.Contains(errOut, s.stderr) {
				t.Errorf("stderr lacks %q:\n%s", s.stderr, errOut)
			}
		})
	}
}

// TestRunCtlErrors: what goes wrong between ctl and the admin API is said
// in words, with the exit code rabbitmqctl would give, never as a raw
// transport error or another server's page.
func TestRunCtlErrors(t *testing.T) {
	f := newFixture(t)
	bad := *f.client
	bad.Token = "nope"
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "<html><body>RabbitMQ Management</body></html>")
	}))
	t.Cleanup(page.Close)
	down := &Client{BaseURL: closedURL(t), Token: testToken}
	runCtlCases(t, []ctlCase{
		{name: "wrong token", client: &bad, args: []string{"list_policies", "-q"}, code: ExitNoPerm,
			wantStderr: "admin token"},
		{name: "nothing listening", client: down, args: []string{"list_policies", "-q"}, code: ExitUnavailable,
			wantStderr: "nothing listens at " + down.BaseURL + " (connection refused): is amqp-mirror serve running there?"},
		{name: "another HTTP server", client: &Client{BaseURL: page.URL, Token: testToken}, args: []string{"list_policies", "-q"}, code: ExitUnavailable,
			wantStderr: "is not amqp-mirror's admin API (it answered HTTP 404 with text/html"},
		{name: "help of an unknown command", client: f.client, args: []string{"help", "nosuchcmd"}, code: ExitUsage,
			wantStderr: `unknown command "nosuchcmd"`},
	}, "<html>")
}

// closedURL is the URL of an address nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// TestCtlJSONIsOnlyJSON checks that --formatter json prints one JSON
// document and nothing else, so programs can read it.
func TestCtlJSONIsOnlyJSON(t *testing.T) {
	f := newFixture(t)
	code, out, errOut := ctl(t, f.client, "list_policies", "--formatter", "json")
	if code != 0 {
		t.Fatalf("exit code %d, stderr %q", code, errOut)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("stdout is not a JSON array: %v\n%s", err, out)
	}
	if len(rows) != 1 || rows[0]["name"] != "from-file" || rows[0]["source"] != "file" {
		t.Errorf("got %v, want the one file policy", rows)
	}
	if def, ok := rows[0]["definition"].(map[string]any); !ok || def["ha-mode"] != "all" {
		t.Errorf("definition: got %#v, want the object {\"ha-mode\":\"all\"}", rows[0]["definition"])
	}
	// A command with nothing to list prints no banner either.
	for _, args := range [][]string{
		{"set_policy", "--formatter", "json", "p", "^p", `{"ha-mode":"all"}`},
		{"--formatter=json", "clear_policy", "p"},
	} {
		if code, out, errOut := ctl(t, f.client, args...); code != 0 || out != "" {
			t.Errorf("%v: got exit code %d, stdout %q (stderr %q), want 0 and nothing", args, code, out, errOut)
		}
	}
}

func TestSplitCommand(t *testing.T) {
	tests := []struct {
		args     []string
		wantName string
		wantRest []string
	}{
		{[]string{"list_policies"}, "list_policies", []string{}},
		{[]string{"--config", "f.yaml", "list_policies"}, "list_policies", []string{"--config", "f.yaml"}},
		{[]string{"list_policies", "--config", "f.yaml"}, "list_policies", []string{"--config", "f.yaml"}},
		{[]string{"-p", "/x", "-q", "set_policy", "n", "p", "{}"}, "set_policy", []string{"-p", "/x", "-q", "n", "p", "{}"}},
		{[]string{"--admin=h:1", "--token", "t", "clear_policy", "n"}, "clear_policy", []string{"--admin=h:1", "--token", "t", "n"}},
		{[]string{"--token-file", "/run/token", "list_queues"}, "list_queues", []string{"--token-file", "/run/token"}},
		{[]string{"--priority", "2", "set_policy"}, "set_policy", []string{"--priority", "2"}},
		{[]string{"--formatter", "json", "--", "list_policies"}, "list_policies", []string{"--formatter", "json"}},
		{[]string{"--config", "f.yaml"}, "", []string{"--config", "f.yaml"}},
		{[]string{"--help"}, "", []string{"--help"}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			name, rest := splitCommand(tc.args)
			if name != tc.wantName || strings.Join(rest, " ") != strings.Join(tc.wantRest, " ") {
				t.Errorf("got %q %q, want %q %q", name, rest, tc.wantName, tc.wantRest)
			}
		})
	}
}

// TestMainConnectionFlags checks that the connection flags work after the
// command as well as before it, each resolving the same admin API.
func TestMainConnectionFlags(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "amqp-mirror.yaml")
	admin := strings.TrimPrefix(f.url, "http://")
	body := "listen: {admin: \"" + admin + "\"}\nadmin_token: " + testToken + "\nbackends: [{name: a, url: \"amqp://h/\"}]\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) string { return "" }
	tests := []struct {
		name string
		args []string
		code int
	}{
		{"--config before", []string{"--config", path, "list_policies"}, 0},
		{"--config after", []string{"list_policies", "--config", path}, 0},
		{"--admin and --token after", []string{"list_policies", "--admin", admin, "--token", testToken}, 0},
		{"-p and --formatter after --config after", []string{"list_policies", "--config", path, "-p", "/", "--formatter", "json"}, 0},
		{"wrong token after", []string{"list_policies", "--admin", admin, "--token", "nope"}, ExitNoPerm},
		{"missing config file", []string{"list_policies", "--config", filepath.Join(dir, "none.yaml")}, ExitUsage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := Main(tc.args, noEnv, &out, &errOut); code != tc.code {
				t.Errorf("exit code: got %d, want %d; stderr %q", code, tc.code, errOut.String())
			}
			if tc.code == 0 && !strings.Contains(out.String(), "from-file") {
				t.Errorf("stdout lacks the file policy:\n%s", out.String())
			}
		})
	}
}

// TestCtlSetPolicyWarnsOfUnknownNodes: ha-mode nodes naming a backend the
// proxy does not have is accepted, as RabbitMQ accepts an unknown node,
// and ctl prints the server's warning on stderr.
func TestCtlSetPolicyWarnsOfUnknownNodes(t *testing.T) {
	f := newFixture(t, WithBackends([]string{"rabbit1", "rabbit2", "rabbit3"}))
	tests := []struct {
		name        string
		definition  string
		wantWarning string // "" for none
	}{
		{"backend names", `{"ha-mode":"nodes","ha-params":["rabbit1","rabbit2"]}`, ""},
		{"an Erlang node name", `{"ha-mode":"nodes","ha-params":["rabbit1","rabbit@r9"]}`, `warning: policy "pinned" in vhost "/": ha-params names "rabbit@r9", not a backend`},
		{"exactly", `{"ha-mode":"exactly","ha-params":2}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := ctl(t, f.client, "set_policy", "pinned", "^q", tc.definition)
			if code != ExitOK {
				t.Fatalf("exit code: got %d, want %d (stderr %q)", code, ExitOK, errOut)
			}
			if tc.wantWarning == "" && errOut != "" {
				t.Errorf("stderr: got %q, want nothing", errOut)
			}
			if tc.wantWarning != "" && !strings.HasPrefix(errOut, tc.wantWarning) {
				t.Errorf("stderr: got %q, want it to start with %q", errOut, tc.wantWarning)
			}
		})
	}
}
