package cluster

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/serf"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// Gossip encryption: memberlist's keyring (AES-GCM with a 32-byte key)
// seals every gossip packet and stream, and a proxy without one of the
// keys can neither join nor be gossiped about. The keyring lives in a file
// in the state directory, the primary key first, as serf writes it when a
// key is installed, used or removed: after the first start the file, not
// the configured key, is the truth, so a rotation survives restarts.

// KeyringFileName is the keyring's file inside the cluster's DataDir.
const KeyringFileName = "keyring.json"

// gossipKeySize is AES-256's key size, the only one the keys may have.
const gossipKeySize = 32

// NewGossipKey returns a fresh random key, base64-encoded as the
// configuration and `ctl keys` take it.
func NewGossipKey() (string, error) {
	key := make([]byte, gossipKeySize)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("reading random bytes: %w", err)
	}
	return base64.StdEncoding.EncodeToString(key), nil
}

// DecodeGossipKey decodes a base64 key and checks its size. Its error
// never contains the key.
func DecodeGossipKey(s string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, errors.New("the key is not valid base64 (amqp-mirror keygen prints one)")
	}
	if len(key) != gossipKeySize {
		return nil, fmt.Errorf("the key is %d bytes long, expected %d (amqp-mirror keygen prints one)", len(key), gossipKeySize)
	}
	return key, nil
}

// loadKeyring returns the keyring for gossip: the one in path when the
// file exists, else a new one holding key, written to path. With no key
// and no file, gossip is not encrypted and loadKeyring returns nil.
func loadKeyring(path, key string) (*memberlist.Keyring, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if key == "" {
			return nil, nil
		}
		raw, err := DecodeGossipKey(key)
		if err != nil {
			return nil, fmt.Errorf("cluster.encrypt: %w", err)
		}
		if err := writeKeyring(path, []string{key}); err != nil {
			return nil, err
		}
		return memberlist.NewKeyring(nil, raw)
	case err != nil:
		return nil, fmt.Errorf("reading the gossip keyring: %w", err)
	}
	if err := config.CheckPrivate(path); err != nil {
		return nil, err
	}
	var encoded []string
	if err := json.Unmarshal(data, &encoded); err != nil || len(encoded) == 0 {
		return nil, fmt.Errorf("gossip keyring %s: expected a JSON list of base64 keys, primary first", path)
	}
	keys := make([][]byte, len(encoded))
	for i, s := range encoded {
		if keys[i], err = DecodeGossipKey(s); err != nil {
			return nil, fmt.Errorf("gossip keyring %s, key %d: %w", path, i+1, err)
		}
	}
	return memberlist.NewKeyring(keys, keys[0])
}

// writeKeyring writes keys as serf's keyring file does, readable by the
// owner only.
func writeKeyring(path string, keys []string) error {
	data, err := json.Marshal(keys)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("writing the gossip keyring: %w", err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing the gossip keyring: %w", err)
	}
	return nil
}

// Fingerprint names a base64 key without showing it: the first 8 hex
// digits of the SHA-256 of its bytes (echo KEY | base64 -d | sha256sum).
func Fingerprint(key string) string {
	raw, err := base64.StdEncoding.DecodeString(key)
	if err != nil {
		return "invalid"
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:4])
}

func fingerprints(counts map[string]int) map[string]int {
	out := make(map[string]int, len(counts))
	for key, n := range counts {
		out[Fingerprint(key)] += n
	}
	return out
}

// Keys is the cluster's view of the gossip keys: each key's fingerprint
// (never the key) with how many members hold it, how many encrypt with
// it, and the members that did not answer.
type Keys struct {
	Members int            `json:"members"`
	Keys    map[string]int `json:"keys"`
	Primary map[string]int `json:"primary"`
	Errors  []string       `json:"errors,omitempty"`
}

// KeyOperation is one of the keyring operations of `ctl keys`.
type KeyOperation string

// The keyring operations, as serf's `keys` command has them.
const (
	KeyList    KeyOperation = "list"
	KeyInstall KeyOperation = "install"
	KeyUse     KeyOperation = "use"
	KeyRemove  KeyOperation = "remove"
)

// ErrNotEncrypted is the answer of Keyring on a cluster whose gossip is
// not encrypted: there is no keyring to change.
var ErrNotEncrypted = errors.New("gossip is not encrypted on this proxy (set cluster.encrypt)")

// Keyring runs a keyring operation on every live member, as serf's
// KeyManager does: install a key everywhere, make it the primary, remove
// one, or list them. key is unused for KeyList. An operation that some
// members failed returns the answers with an error naming them.
func (c *Cluster) Keyring(op KeyOperation, key string) (Keys, error) {
	if !c.encrypted {
		return Keys{}, ErrNotEncrypted
	}
	if op != KeyList {
		if _, err := DecodeGossipKey(key); err != nil {
			return Keys{}, err
		}
	}
	km := c.serf.KeyManager()
	var (
		resp *serf.KeyResponse
		err  error
	)
	switch op {
	case KeyList:
		resp, err = km.ListKeys()
	case KeyInstall:
		resp, err = km.InstallKey(key)
	case KeyUse:
		resp, err = km.UseKey(key)
	case KeyRemove:
		resp, err = km.RemoveKey(key)
	default:
		return Keys{}, fmt.Errorf("unknown keyring operation %q: expected list, install, use or remove", op)
	}
	if resp == nil {
		return Keys{}, fmt.Errorf("keyring %s: %w", op, err)
	}
	out := Keys{Members: resp.NumNodes, Keys: fingerprints(resp.Keys), Primary: fingerprints(resp.PrimaryKeys)}
	for node, msg := range resp.Messages {
		out.Errors = append(out.Errors, node+": "+msg)
	}
	sort.Strings(out.Errors)
	if err != nil {
		return out, fmt.Errorf("keyring %s: %d of %d members failed: %w", op, resp.NumErr, resp.NumNodes, err)
	}
	return out, nil
}
