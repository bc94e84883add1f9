package integration

// Gossip encryption of the sidecar cluster: a proxy without the cluster's key cannot join,
// and the keys rotate on the live cluster through ctl keys.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// newGossipKey is a fresh key from `amqp-mirror keygen`.
func newGossipKey(t testing.TB) string {
	t.Helper()
	res := newCLI(t).run(t, nil, "keygen")
	if res.code != 0 {
		t.Fatalf("amqp-mirror keygen: exit %d: %s", res.code, res.stderr)
	}
	return strings.TrimSpace(res.stdout)
}

// gossipKeys is `ctl keys list --formatter json` of p.
type gossipKeys struct {
	Members int            `json:"members"`
	Keys    map[string]int `json:"keys"`
	Primary map[string]int `json:"primary"`
}

func listGossipKeys(t *testing.T, p *cliProxy) gossipKeys {
	t.Helper()
	res := p.ctl(t, "keys", "list", "--formatter", "json")
	if res.code != 0 {
		t.Fatalf("ctl keys list: exit %d: %s%s", res.code, res.stdout, res.stderr)
	}
	var keys gossipKeys
	if err := json.Unmarshal([]byte(res.stdout), &keys); err != nil {
		t.Fatalf("ctl keys list: %v in %q", err, res.stdout)
	}
	return keys
}

// outsiderRefused starts a fourth proxy, named rogue, whose gossip key is key (none for
// "") and which joins the sidecars, waits until it was refused once, and checks from every
// sidecar that the cluster still has its three members and that none made it a voter.
func outsiderRefused(t *testing.T, sidecars []*cliProxy, key string) {
	t.Helper()
	extra := fmt.Sprintf("node: rogue\ncluster:\n  bind: %s\n  raft_bind: %s\n  join: [%s]\n",
		cliFreeAddr(t), cliFreeAddr(t), sidecars[0].gossipAddr)
	if key != "" {
		extra += fmt.Sprintf("  encrypt: %q\n", key)
	}
	config := mirrorConfigYAML(t, filepath.Join(t.TempDir(), "state"), extra)
	config = strings.Replace(config, "backends:\n", "backends:\n  - name: rogue\n    url: \"amqp://guest:guest@127.0.0.1:1/\"\n", 1)
	path := filepath.Join(t.TempDir(), "amqp-mirror.yaml")
	cliWriteFile(t, path, config)
	rogue := startServeProcess(t, sidecars[0].binary, path)
	awaitCondition(t, 60*time.Second, func() error {
		if rogue.exited() {
			return fmt.Errorf("the rogue proxy exited with %v:\n%s", rogue.command.ProcessState, rogue.stderr)
		}
		if _, ok := rogue.record(map[string]string{"msg": "joining the cluster failed, retrying"}); !ok {
			return fmt.Errorf("the rogue proxy has not tried to join yet")
		}
		return nil
	})
	for i, p := range sidecars {
		if keys := listGossipKeys(t, p); keys.Members != len(sidecars) {
			t.Fatalf("sidecar %d counts %d members with the rogue proxy trying to join, want %d", i+1, keys.Members, len(sidecars))
		}
		if _, ok := p.record(map[string]string{"member": "rogue"}); ok {
			t.Fatalf("sidecar %d logged something of the rogue proxy as a member:\n%s", i+1, p.stderr)
		}
	}
}

func TestSidecarGossipNeedsTheKey(t *testing.T) {
	sidecars := startSidecars(t)
	for _, tc := range []struct{ name, key string }{
		{"another key", newGossipKey(t)},
		{"no key", ""},
	} {
		t.Run(tc.name, func(t *testing.T) { outsiderRefused(t, sidecars, tc.key) })
	}
}

// TestSidecarGossipKeyRotation rotates the key through ctl keys on the live cluster,
// publishing and consuming through every proxy between the steps, then checks that a
// proxy with only the old key can no longer join.
func TestSidecarGossipKeyRotation(t *testing.T) {
	sidecars := startSidecars(t)
	before := listGossipKeys(t, sidecars[0])
	if len(before.Keys) != 1 {
		t.Fatalf("the cluster starts with %d keys, want 1: %+v", len(before.Keys), before)
	}
	var oldFingerprint string
	for f := range before.Keys {
		oldFingerprint = f
	}
	oldKey := sidecarGossipKey(t, sidecars[0])
	newKey := newGossipKey(t)
	serving := func(step string) {
		t.Helper()
		for i, p := range sidecars {
			queue := fmt.Sprintf("keys-%s-%d", step, i)
			conn := dialProxy(t, p)
			ch, err := conn.Channel()
			if err != nil {
				t.Fatalf("after %s, proxy %d: %v", step, i+1, err)
			}
			if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
				t.Fatalf("after %s, proxy %d: %v", step, i+1, err)
			}
			if err := ch.Publish("", queue, false, false, amqp.Publishing{Body: []byte(step)}); err != nil {
				t.Fatalf("after %s, proxy %d: %v", step, i+1, err)
			}
			awaitCondition(t, 30*time.Second, func() error {
				if _, ok, err := ch.Get(queue, true); err != nil || !ok {
					return fmt.Errorf("after %s, proxy %d: get: %v, found %v", step, i+1, err, ok)
				}
				return nil
			})
			conn.Close()
		}
	}
	// The key reaches ctl on standard input, where ps does not show it.
	for _, step := range []struct{ op, key string }{{"install", newKey}, {"use", newKey}, {"remove", oldKey}} {
		res := sidecars[1].binary.runInput(t, step.key+"\n", nil, "ctl", "--admin", sidecars[1].adminAddr, "--token", sidecars[1].token, "keys", step.op, "-")
		if res.code != 0 {
			t.Fatalf("ctl keys %s: exit %d: %s%s", step.op, res.code, res.stdout, res.stderr)
		}
		if strings.Contains(res.stdout+res.stderr, step.key) {
			t.Fatalf("ctl keys %s printed the key", step.op)
		}
		serving(step.op)
	}
	after := listGossipKeys(t, sidecars[2])
	if len(after.Keys) != 1 || after.Keys[oldFingerprint] != 0 || after.Members != len(sidecars) {
		t.Fatalf("after the rotation the cluster holds %+v, want one new key on %d members", after, len(sidecars))
	}
	for f, n := range after.Primary {
		if n != len(sidecars) || f == oldFingerprint {
			t.Fatalf("after the rotation the primary keys are %v, want the new key on every member", after.Primary)
		}
	}
	outsiderRefused(t, sidecars, oldKey)
}

// sidecarGossipKey reads cluster.encrypt back from p's config file.
func sidecarGossipKey(t *testing.T, p *cliProxy) string {
	t.Helper()
	data, err := os.ReadFile(p.configPath)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "encrypt: \"")
	if !ok {
		t.Fatalf("no cluster.encrypt in %s", p.configPath)
	}
	key, _, _ := strings.Cut(rest, "\"")
	return key
}
