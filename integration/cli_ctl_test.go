package integration

// End-to-end tests of `amqp-mirror ctl` against a running serve: policy commands and
// where ctl's options may stand.

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

func TestCLICtlManagesPolicies(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	settings := newCLIConfig(t, rabbit)
	settings.Extra = `
policies:
  - {name: ha-file, pattern: "^file_", apply-to: queues, definition: {ha-mode: all}}
operator_policies:
  - {name: op-file, pattern: "^file_", definition: {message-ttl: 60000}}
`
	p := cli.serveConfig(t, settings)
	closedPort := cliFreeAddr(t)
	// The same admin address, but a state_dir the proxy never used: no token there.
	otherState := newCLIConfig(t, rabbit)
	otherState.Admin = p.adminAddr
	otherStatePath := writeCLIConfig(t, otherState)

	const twoCopies = `{"ha-mode":"exactly","ha-params":2}`
	// The steps run in order against one proxy: each sees what the earlier ones did.
	steps := []struct {
		name     string
		args     []string // after "ctl --config FILE"; a later --config, --admin or --token wins
		wantCode int
		wantOut  []string
		wantErr  []string
		notOut   []string
	}{
		{
			name:    "set_policy",
			args:    []string{"set_policy", "--priority", "1", "--apply-to", "queues", "ha-two", `^q\.`, twoCopies},
			wantOut: []string{`Setting policy "ha-two" for pattern "^q\\." to "{\"ha-mode\":\"exactly\",\"ha-params\":2}" with priority "1" for vhost "/"`},
		},
		{
			name: "list_policies shows the runtime policy next to the file's",
			args: []string{"list_policies"},
			wantOut: []string{
				"vhost\tname\tpattern\tapply-to\tdefinition\tpriority\tsource\n",
				"/\tha-two\t^q\\.\tqueues\t" + twoCopies + "\t1\truntime\n",
				"/\tha-file\t^file_\tqueues\t{\"ha-mode\":\"all\"}\t0\tfile\n",
			},
		},
		{
			name: "list_policies --explain a queue the runtime policy matches",
			args: []string{"list_policies", "--explain", "q.orders"},
			wantOut: []string{
				`queue "q.orders" in vhost "/"`,
				"* ha-two\tpriority 1\truntime\tmatches; highest priority (1)",
				`ha-file	priority 0	file	pattern "^file_" does not match "q.orders"`,
				"applies: policy ha-two, operator policy (none)",
				`effective definition: {"ha-mode":"exactly","ha-params":2,`,
			},
		},
		{
			name:    "list_policies --explain a queue the file policy matches",
			args:    []string{"list_policies", "--explain", "file_invoices"},
			wantOut: []string{"* ha-file\tpriority 0\tfile\tmatches", "applies: policy ha-file, operator policy op-file", `"message-ttl":60000`},
		},
		{
			name:    "set_policy -p sets it in another vhost",
			args:    []string{"set_policy", "-p", "/staging", "ha-staging", ".*", `{"ha-mode":"all"}`},
			wantOut: []string{`for vhost "/staging"`},
		},
		{
			name:    "list_policies -p lists only that vhost",
			args:    []string{"list_policies", "-p", "/staging"},
			wantOut: []string{`Listing policies for vhost "/staging"`, "/staging\tha-staging\t.*\tall\t{\"ha-mode\":\"all\"}\t0\truntime\n"},
			notOut:  []string{"ha-two", "ha-file"},
		},
		{
			name:    "-p before the command, as rabbitmqctl takes it",
			args:    []string{"-p", "/staging", "list_policies"},
			wantOut: []string{"/staging\tha-staging\t"},
			notOut:  []string{"ha-two"},
		},
		{
			name:   "list_policies without -p lists the default vhost",
			args:   []string{"list_policies"},
			notOut: []string{"ha-staging"},
		},
		{
			name:     "clear_policy looks in the default vhost without -p",
			args:     []string{"clear_policy", "ha-staging"},
			wantCode: 65,
			wantErr:  []string{`policy not found: "ha-staging" in vhost "/"`},
		},
		{
			name:    "clear_policy -p",
			args:    []string{"clear_policy", "-p", "/staging", "ha-staging"},
			wantOut: []string{`Clearing policy "ha-staging" on vhost "/staging"`},
		},
		{
			name:     "clear_policy refuses a file policy",
			args:     []string{"clear_policy", "ha-file"},
			wantCode: 65,
			wantErr:  []string{`policy is defined in the config file: "ha-file" in vhost "/"; change the config file and reload`},
		},
		{
			name: "set_operator_policy",
			args: []string{"set_operator_policy", "--apply-to", "queues", "op-cap", `^q\.`, `{"ha-mode":"exactly","ha-params":3,"max-length":1000}`},
		},
		{
			name: "list_operator_policies",
			args: []string{"list_operator_policies"},
			wantOut: []string{
				"/\top-cap\t^q\\.\tqueues\t{\"ha-mode\":\"exactly\",\"ha-params\":3,\"max-length\":1000}\t0\toperator-runtime\n",
				"/\top-file\t^file_\tall\t{\"message-ttl\":60000}\t0\toperator-file\n",
			},
		},
		{
			name:    "--explain merges the operator policy",
			args:    []string{"list_policies", "--explain", "q.orders"},
			wantOut: []string{"applies: policy ha-two, operator policy op-cap", `"ha-params":3`, `"max-length":1000`},
		},
		{
			name: "clear_operator_policy",
			args: []string{"clear_operator_policy", "op-cap"},
		},
		{
			name:   "the operator policy is gone",
			args:   []string{"list_operator_policies"},
			notOut: []string{"op-cap"},
		},
		{
			name:     "clear_operator_policy of an unknown policy",
			args:     []string{"clear_operator_policy", "op-cap"},
			wantCode: 65,
			wantErr:  []string{`policy not found: "op-cap" in vhost "/"`},
		},
		{
			name:     "invalid JSON",
			args:     []string{"set_policy", "p-bad", "^x", `{"ha-mode":`},
			wantCode: 65,
			wantErr:  []string{`definition: expected a JSON object such as '{"ha-mode":"all"}', found "{\"ha-mode\":"`},
		},
		{
			name:     "ha-params missing for exactly",
			args:     []string{"set_policy", "p-bad", "^x", `{"ha-mode":"exactly"}`},
			wantCode: 65,
			wantErr:  []string{`definition.ha-params: ha-mode "exactly" needs ha-params`},
		},
		{
			name:     "unknown definition key",
			args:     []string{"set_policy", "p-bad", "^x", `{"ha-mode":"all","ha-mood":"all"}`},
			wantCode: 65,
			wantErr:  []string{"definition.ha-mood: unknown key; expected one of the policy definition keys"},
		},
		{
			name:     "bad regex",
			args:     []string{"set_policy", "p-bad", "^(x", `{"ha-mode":"all"}`},
			wantCode: 65,
			wantErr:  []string{`pattern: expected a regular expression, found "^(x"`},
		},
		{
			name:     "bad apply-to",
			args:     []string{"set_policy", "--apply-to", "topics", "p-bad", "^x", `{"ha-mode":"all"}`},
			wantCode: 65,
			wantErr:  []string{`apply-to: expected one of queues, exchanges, all, found "topics"`},
		},
		{
			name:     "a key operator policies do not take",
			args:     []string{"set_operator_policy", "op-bad", "^x", `{"alternate-exchange":"ae"}`},
			wantCode: 65,
			wantErr:  []string{"definition.alternate-exchange: unknown key; expected one of the operator policy definition keys"},
		},
		{
			name:    "refused policies were not stored",
			args:    []string{"list_policies"},
			wantOut: []string{"ha-two", "ha-file"},
			notOut:  []string{"p-bad"},
		},
		{
			name:     "missing arguments",
			args:     []string{"set_policy", "p-bad", "^x"},
			wantCode: 64,
			wantErr:  []string{"expected 3 argument(s), found 2", "Usage: amqp-mirror ctl set_policy"},
		},
		{
			name:     "unknown command",
			args:     []string{"set_polcy"},
			wantCode: 64,
			wantErr:  []string{`unknown command "set_polcy"`},
		},
		{
			name:     "wrong token",
			args:     []string{"--token", "not-the-token", "list_policies"},
			wantCode: 77,
			wantErr:  []string{"missing or wrong admin token"},
		},
		{
			name:     "no token in the state_dir of --config",
			args:     []string{"--config", otherStatePath, "list_policies"},
			wantCode: 77,
			wantErr:  []string{"admin token:", config.AdminTokenFile},
		},
		{
			name:     "admin API unreachable",
			args:     []string{"--admin", closedPort, "list_policies"},
			wantCode: 69,
			wantErr:  []string{"connection refused"},
		},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			r := cli.run(t, nil, append([]string{"ctl", "--config", p.configPath}, step.args...)...)
			r.check(t, step.wantCode, step.wantOut, step.wantErr, step.notOut)
		})
	}

	// Runtime policies live in state_dir: a restarted proxy still has them.
	run := func(args ...string) cliResult {
		return cli.run(t, nil, append([]string{"ctl", "--config", p.configPath}, args...)...)
	}
	run("set_operator_policy", "op-keep", "^keep", `{"max-length":10}`).check(t, 0, nil, nil, nil)
	if code, _ := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code after SIGTERM: got %d, want 0\n%s", code, p.stderr)
	}
	cli.serve(t, p.configPath, nil)
	run("list_policies").check(t, 0, []string{
		"/\tha-two\t^q\\.\tqueues\t" + twoCopies + "\t1\truntime\n",
		"/\tha-file\t^file_\tqueues\t{\"ha-mode\":\"all\"}\t0\tfile\n",
	}, nil, nil)
	run("list_operator_policies").check(t, 0, []string{"/\top-keep\t^keep\tall\t{\"max-length\":10}\t0\toperator-runtime\n"}, nil, nil)
}

func TestCLICtlOptionsAfterTheCommand(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	settings := newCLIConfig(t, rabbit)
	settings.Extra = `
policies:
  - {name: ha-file, pattern: "^file_", apply-to: queues, definition: {ha-mode: all}}
`
	p := cli.serveConfig(t, settings)
	path := p.configPath
	steps := []struct {
		name    string
		args    []string // after "ctl"
		wantOut []string
	}{
		{"--config after the command", []string{"list_policies", "--config", path},
			[]string{"vhost\tname\tpattern\tapply-to\tdefinition\tpriority\tsource\n", "/\tha-file\t^file_\tqueues\t{\"ha-mode\":\"all\"}\t0\tfile\n"}},
		{"set_policy with --config and --priority after its arguments", []string{"set_policy", "ha-two", "^q", `{"ha-mode":"exactly","ha-params":2}`, "--config", path, "--priority", "2"},
			[]string{`Setting policy "ha-two" for pattern "^q"`, `with priority "2"`}},
		{"--admin, --token and -p after the command", []string{"list_policies", "--admin", p.adminAddr, "--token", p.token, "-p", "/"},
			[]string{"/\tha-two\t^q\tall\t{\"ha-mode\":\"exactly\",\"ha-params\":2}\t2\truntime\n"}},
		{"options on both sides", []string{"-p", "/", "list_policies", "--config", path, "-q"},
			[]string{"/\tha-file\t"}},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			cli.run(t, nil, append([]string{"ctl"}, step.args...)...).check(t, 0, step.wantOut, nil, nil)
		})
	}

	t.Run("--formatter json", func(t *testing.T) {
		for _, args := range [][]string{
			{"ctl", "list_policies", "--config", path, "--formatter", "json"},
			{"ctl", "--formatter=json", "--config", path, "list_policies"},
		} {
			r := cli.run(t, nil, args...)
			r.check(t, 0, nil, nil, nil)
			var rows []map[string]any
			if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
				t.Fatalf("%s: stdout is not a JSON array: %v\n%s", strings.Join(args, " "), err, r.stdout)
			}
			byName := map[string]map[string]any{}
			for _, row := range rows {
				byName[fmt.Sprint(row["name"])] = row
			}
			file, runtime := byName["ha-file"], byName["ha-two"]
			if len(rows) != 2 || file == nil || runtime == nil {
				t.Fatalf("got %v, want ha-file and ha-two", rows)
			}
			checks := []struct {
				name      string
				got, want any
			}{
				{"vhost", file["vhost"], "/"},
				{"pattern", file["pattern"], "^file_"},
				{"apply-to", file["apply-to"], "queues"},
				{"definition", fmt.Sprint(file["definition"]), "map[ha-mode:all]"},
				{"priority", runtime["priority"], 2.0},
				{"file source", file["source"], "file"},
				{"runtime source", runtime["source"], "runtime"},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s: %s: got %v, want %v", strings.Join(args, " "), c.name, c.got, c.want)
				}
			}
		}
		r := cli.run(t, nil, "ctl", "list_policies", "--explain", "file_1", "--config", path, "--formatter", "json")
		r.check(t, 0, nil, nil, nil)
		var report struct {
			Policy struct {
				Winner string `json:"winner"`
			} `json:"policy"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &report); err != nil || report.Policy.Winner != "ha-file" {
			t.Errorf("--explain --formatter json: got %v %q, want the winner ha-file", err, r.stdout)
		}
		cli.run(t, nil, "ctl", "list_policies", "--config", path, "--formatter", "xml").check(t, 64, nil, []string{"--formatter: expected table or json"}, nil)
	})
}
