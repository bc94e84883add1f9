package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// startEncryptedCluster is startCluster with gossip encrypted by key.
func startEncryptedCluster(t *testing.T, size int, key string) []*testNode {
	t.Helper()
	cfg := newConfig(t, "rabbit1", size)
	cfg.GossipKey = key
	nodes := []*testNode{startNode(t, cfg)}
	for i := 2; i <= size; i++ {
		cfg := newConfig(t, fmt.Sprintf("rabbit%d", i), size, nodes[0].LocalMember().Gossip)
		cfg.GossipKey = key
		nodes = append(nodes, startNode(t, cfg))
	}
	waitMembers(t, nodes, names(nodes), nil)
	waitLeader(t, nodes)
	waitVoters(t, nodes, names(nodes))
	return nodes
}

func newKey(t *testing.T) string {
	t.Helper()
	k, err := NewGossipKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// outsiderCannotJoin starts a node named rogue with key (none for "") that
// joins nothing by itself, makes it join the cluster, and checks that the
// join fails and that the cluster's members and voters are unchanged.
func outsiderCannotJoin(t *testing.T, nodes []*testNode, key string) {
	t.Helper()
	cfg := newConfig(t, "rogue", 0)
	cfg.GossipKey = key
	rogue := startNode(t, cfg)
	if n, err := rogue.serf.Join([]string{nodes[0].LocalMember().Gossip}, true); err == nil {
		t.Fatalf("a proxy with the wrong gossip key joined %d members", n)
	}
	waitMembers(t, nodes, names(nodes), nil)
	waitVoters(t, nodes, names(nodes))
	if got := len(rogue.Members()); got != 1 {
		t.Fatalf("the rogue proxy sees %d members, want only itself", got)
	}
}

func TestGossipNeedsTheClusterKey(t *testing.T) {
	nodes := startEncryptedCluster(t, 3, newKey(t))
	for _, tc := range []struct {
		name, key string
	}{
		{"another key", newKey(t)},
		{"no key", ""},
	} {
		t.Run(tc.name, func(t *testing.T) { outsiderCannotJoin(t, nodes, tc.key) })
	}
}

func TestGossipKeyRotation(t *testing.T) {
	oldKey, newK := newKey(t), newKey(t)
	nodes := startEncryptedCluster(t, 3, oldKey)
	leader := waitLeader(t, nodes)

	for _, step := range []struct {
		op  KeyOperation
		key string
	}{{KeyInstall, newK}, {KeyUse, newK}, {KeyRemove, oldKey}} {
		keys, err := leader.Keyring(step.op, step.key)
		if err != nil {
			t.Fatalf("%s: %v (%v)", step.op, err, keys.Errors)
		}
		waitMembers(t, nodes, names(nodes), nil)
	}
	keys, err := nodes[1].Keyring(KeyList, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{Fingerprint(newK): 3}; !mapsEqual(keys.Keys, want) || !mapsEqual(keys.Primary, want) {
		t.Fatalf("keys after the rotation: %v, primary %v; want only the new key on all 3", keys.Keys, keys.Primary)
	}
	// The rotation is in every node's keyring file, for its next start.
	for _, n := range nodes {
		data, err := os.ReadFile(filepath.Join(n.cfg.DataDir, KeyringFileName))
		if err != nil {
			t.Fatal(err)
		}
		var stored []string
		if err := json.Unmarshal(data, &stored); err != nil || !slices.Equal(stored, []string{newK}) {
			t.Fatalf("%s's keyring file holds %d keys (err %v), want the new key alone", n.cfg.NodeName, len(stored), err)
		}
	}
	outsiderCannotJoin(t, nodes, oldKey)

	// A node with the new key joins.
	cfg := newConfig(t, "rabbit4", 0)
	cfg.GossipKey = newK
	late := startNode(t, cfg)
	if _, err := late.serf.Join([]string{nodes[0].LocalMember().Gossip}, true); err != nil {
		t.Fatalf("a proxy with the new key cannot join: %v", err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if got := len(nodes[0].Members()); got != 4 {
			return fmt.Errorf("%d members, want 4", got)
		}
		return nil
	})
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestKeyringFile(t *testing.T) {
	key := newKey(t)
	for _, tc := range []struct {
		name    string
		file    string // written first, 0600, unless empty
		perm    os.FileMode
		key     string
		want    int    // keys in the keyring; 0 for none
		wantErr string // part of the error
	}{
		{name: "no key, no file", key: "", want: 0},
		{name: "key, no file", key: key, want: 1},
		{name: "file wins over the key", file: `["` + key + `","` + newKey(t) + `"]`, perm: 0o600, key: newKey(t), want: 2},
		{name: "file without key", file: `["` + key + `"]`, perm: 0o600, want: 1},
		{name: "loose permissions", file: `["` + key + `"]`, perm: 0o644, wantErr: "too open"},
		{name: "not base64", key: "not a key!", wantErr: "not valid base64"},
		{name: "short key", key: "c2hvcnQ=", wantErr: "5 bytes long, expected 32"},
		{name: "bad file", file: `{"a":1}`, perm: 0o600, wantErr: "JSON list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "raft", KeyringFileName)
			if tc.file != "" {
				if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(tc.file), tc.perm); err != nil {
					t.Fatal(err)
				}
				os.Chmod(path, tc.perm) // past the umask
			}
			kr, err := loadKeyring(path, tc.key)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				if tc.key != "" && strings.Contains(err.Error(), tc.key) {
					t.Fatalf("the error shows the key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			if kr != nil {
				got = len(kr.GetKeys())
			}
			if got != tc.want {
				t.Fatalf("%d keys, want %d", got, tc.want)
			}
			if tc.want > 0 && tc.file == "" {
				fi, err := os.Stat(path)
				if err != nil || fi.Mode().Perm() != 0o600 {
					t.Fatalf("keyring file not written 0600: %v %v", fi, err)
				}
			}
		})
	}
}
