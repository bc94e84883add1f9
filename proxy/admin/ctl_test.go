package admin

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func runCtl(t *testing.T, c *Client, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = RunCtl(context.Background(), args, c, &out, &errOut)
	return code, out.String(), errOut.String()
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
		{"unknown command", []string{"list_queues"}, ExitUsage, nil, "unknown command \"list_queues\"", nil},
		{"help", []string{"help"}, 0, []string{"set_operator_policy [-p VHOST]", "list_policies [-p VHOST] [--explain QUEUE]"}, "", nil},
		{"help command", []string{"help", "clear_policy"}, 0, []string{"Usage: amqp-mirror ctl clear_policy [-p VHOST] NAME"}, "", nil},
		{"--help", []string{"set_policy", "--help"}, 0, []string{"--apply-to string", "--priority int", "ha-params"}, "", nil},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			code, out, errOut := runCtl(t, f.client, s.args...)
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

func TestRunCtlErrors(t *testing.T) {
	f := newFixture(t)
	bad := *f.client
	bad.Token = "nope"
	if code, _, errOut := runCtl(t, &bad, "list_policies"); code != ExitNoPerm || !strings.Contains(errOut, "admin token") {
		t.Errorf("wrong token: code %d, stderr %q", code, errOut)
	}
	down := &Client{BaseURL: "http://127.0.0.1:1", Token: testToken}
	if code, _, _ := runCtl(t, down, "list_policies"); code != ExitUnavailable {
		t.Errorf("unreachable server: code %d, want %d", code, ExitUnavailable)
	}
}
