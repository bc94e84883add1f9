package admin

import (
	"strings"
	"sync"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
)

// fakeKeyring records the operations asked of it and answers one key on
// three members.
type fakeKeyring struct {
	mu  sync.Mutex
	ops []string
}

func (k *fakeKeyring) Keyring(op cluster.KeyOperation, key string) (cluster.Keys, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if op != cluster.KeyList {
		if _, err := cluster.DecodeGossipKey(key); err != nil {
			return cluster.Keys{}, err
		}
	}
	k.ops = append(k.ops, string(op)+" "+cluster.Fingerprint(key))
	return cluster.Keys{Members: 3, Keys: map[string]int{"0a1b2c3d": 3}, Primary: map[string]int{"0a1b2c3d": 3}}, nil
}

func TestCtlKeys(t *testing.T) {
	key, err := cluster.NewGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	keyring := &fakeKeyring{}
	on := newFixture(t, WithKeyring(keyring))
	off := newFixture(t)
	table := "fingerprint\tmembers\tprimary\n0a1b2c3d\t3/3\t3\n"
	tests := []ctlCase{
		{"list", on.client, []string{"keys", "list", "-q"}, 0, table, ""},
		{"install", on.client, []string{"keys", "install", key}, 0, "Running keys install on every member ...\n" + table, ""},
		{"use", on.client, []string{"keys", "use", "-q", key}, 0, table, ""},
		{"remove", on.client, []string{"keys", "remove", "-q", key}, 0, table, ""},
		{"json", on.client, []string{"keys", "list", "--formatter", "json"}, 0,
			`{"members":3,"keys":{"0a1b2c3d":3},"primary":{"0a1b2c3d":3}}` + "\n", ""},
		{"bad key", on.client, []string{"keys", "install", "-q", "bm90IGEga2V5"}, ExitDataErr, "", "the key is 9 bytes long, expected 32"},
		{"no key", on.client, []string{"keys", "install"}, ExitUsage, "", "keys install: expected one KEY"},
		{"unknown operation", on.client, []string{"keys", "rotate"}, ExitUsage, "", `expected list, install KEY, use KEY or remove KEY, found "rotate"`},
		{"no cluster", off.client, []string{"keys", "list", "-q"}, ExitDataErr, "", "no sidecar cluster"},
	}
	runCtlCases(t, tests, key)
	want := []string{"list " + cluster.Fingerprint(""), "install " + cluster.Fingerprint(key), "use " + cluster.Fingerprint(key), "remove " + cluster.Fingerprint(key), "list " + cluster.Fingerprint("")}
	if got := strings.Join(keyring.ops, ","); got != strings.Join(want, ",") {
		t.Errorf("operations: got %s, want %s", got, strings.Join(want, ","))
	}
}
