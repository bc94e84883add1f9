package integration

// End-to-end tests of reloading the config file (SIGHUP and file edits) under serve.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

func TestCLIReloadAppliesPolicyChanges(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	const added = `
policies:
  - {name: ha-added, pattern: "^added_", apply-to: queues, definition: {ha-mode: exactly, ha-params: 2}}
`
	cases := []struct {
		name string
		// symlinked puts the config file in another directory behind a symlink, where
		// the watch of the link's directory does not see edits: only SIGHUP reloads.
		symlinked bool
		edit      func(t *testing.T, path, content string)
		sighup    bool
		wantLog   map[string]string
	}{
		{
			name:    "file watch: edited in place",
			edit:    func(t *testing.T, path, content string) { cliWriteFile(t, path, content) },
			wantLog: map[string]string{"msg": "config reloaded", "applied": "policies"},
		},
		{
			name: "file watch: replaced by rename, as editors save",
			edit: func(t *testing.T, path, content string) {
				temporary := path + ".swp"
				cliWriteFile(t, temporary, content)
				if err := os.Rename(temporary, path); err != nil {
					t.Fatal(err)
				}
			},
			wantLog: map[string]string{"msg": "config reloaded", "applied": "policies"},
		},
		{
			name:      "SIGHUP",
			symlinked: true,
			edit:      func(t *testing.T, path, content string) { cliWriteFile(t, path, content) },
			sighup:    true,
			wantLog:   map[string]string{"msg": "SIGHUP: reloading the config file"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			settings := newCLIConfig(t, rabbit)
			path := filepath.Join(t.TempDir(), "amqp-mirror.yaml")
			target := path
			if tc.symlinked {
				target = filepath.Join(t.TempDir(), "real.yaml")
				if err := os.Symlink(target, path); err != nil {
					t.Fatal(err)
				}
			}
			cliWriteFile(t, target, settings.yaml())
			p := cli.serve(t, path, nil)
			client := newCLIClient(t, p)

			tc.edit(t, target, settings.yaml()+added)
			if tc.sighup {
				p.signal(t, syscall.SIGHUP)
			}
			testutil.Eventually(t, 5*time.Second, func() error {
				return p.ctl(t, "list_policies").contains("/\tha-added\t^added_\tqueues\t{\"ha-mode\":\"exactly\",\"ha-params\":2}\t0\tfile\n")
			})
			p.requireRecord(t, tc.wantLog)
			client.requireUsable(t)
		})
	}
}

func TestCLIReloadRefusesWhatItCannotApply(t *testing.T) {
	cli := newCLI(t)
	rabbit := node(t, "rabbit1")
	settings := newCLIConfig(t, rabbit)
	settings.Extra = `
policies:
  - {name: ha-old, pattern: "^old_", definition: {ha-mode: all}}
`
	p := cli.serveConfig(t, settings)
	oldAddr := p.amqpAddr
	client := newCLIClient(t, p)
	oldPolicy := "/\tha-old\t^old_\tall\t{\"ha-mode\":\"all\"}\t0\tfile\n"

	refused := map[string]string{"msg": "config reload refused; the running configuration stays", "file": p.configPath}
	// Each step rewrites the file, sends SIGHUP if asked, and waits for the log lines.
	steps := []struct {
		name     string
		content  func() string
		sighup   bool
		wantLogs []map[string]string
		// wantError are fragments of the last wanted line's error attribute.
		wantError []string
		wantOut   []string // in list_policies
		notOut    []string
	}{
		{
			name:      "unknown key: refused, old policies stay",
			content:   func() string { return settings.yaml() + "listen_amqp: 127.0.0.1:1\n" },
			wantLogs:  []map[string]string{refused},
			wantError: []string{"config file " + p.configPath + ": listen_amqp: unknown key; expected one of the top-level keys"},
			wantOut:   []string{oldPolicy},
		},
		{
			name: "unknown key inside a policy, on SIGHUP: refused, old policies stay",
			content: func() string {
				return strings.Replace(settings.yaml(), "ha-mode: all", "ha-mode: all, ha-mood: all", 1)
			},
			sighup:    true,
			wantLogs:  []map[string]string{{"msg": "SIGHUP: reloading the config file"}, refused},
			wantError: []string{"config file " + p.configPath + ": policies[0].definition.ha-mood: unknown key"},
			wantOut:   []string{oldPolicy},
		},
		{
			name: "listen.amqp changed: restart required, the policy part applies",
			content: func() string {
				moved := settings
				moved.AMQP = cliFreeAddr(t)
				moved.Extra = strings.Replace(settings.Extra, "ha-old", "ha-new", 1)
				return moved.yaml()
			},
			wantLogs: []map[string]string{
				{"msg": "listen.amqp changed: restart required", "key": "listen.amqp", "file": p.configPath},
				{"msg": "config reloaded", "applied": "policies"},
			},
			wantOut: []string{"/\tha-new\t^old_\t"},
			notOut:  []string{"ha-old"},
		},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			mark := p.stderr.Len()
			cliWriteFile(t, p.configPath, step.content())
			if step.sighup {
				p.signal(t, syscall.SIGHUP)
			}
			var record cliRecord
			for _, want := range step.wantLogs {
				record = p.awaitRecordAfter(t, mark, step.name, want)
			}
			for _, fragment := range step.wantError {
				if got := record.text("error"); !strings.Contains(got, fragment) {
					t.Errorf("log line %q: got error %q, want it to contain %q", record.text("msg"), got, fragment)
				}
			}
			// ctl --config cannot read an invalid file; --admin and --token can.
			p.ctl(t, "list_policies").check(t, 0, step.wantOut, nil, step.notOut)
			client.requireUsable(t)
		})
	}
	// The listener stays where it was until a restart.
	conn, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@%s/", oldAddr))
	if err != nil {
		t.Fatalf("dial the old listen.amqp %s after the refused change: %v", oldAddr, err)
	}
	conn.Close()
}
