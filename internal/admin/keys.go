package admin

// The gossip keyring: GET /api/keys lists the keys the cluster's members
// hold; POST /api/keys {"operation": "install"|"use"|"remove", "key": K}
// changes them on every live member, as serf's `keys` command does. The
// key travels in the body, never in a URL that a log could keep.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"

	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
)

// Keyring is the sidecar cluster's gossip keyring (cluster.Cluster).
type Keyring interface {
	Keyring(op cluster.KeyOperation, key string) (cluster.Keys, error)
}

// WithKeyring serves /api/keys from k. Without it (a proxy alone) the
// endpoint answers 409.
func WithKeyring(k Keyring) Option { return func(s *Server) { s.keyring = k } }

// KeyRequest is the body of POST /api/keys.
type KeyRequest struct {
	Operation cluster.KeyOperation `json:"operation"`
	Key       string               `json:"key"`
}

func (s *Server) keys(w http.ResponseWriter, r *http.Request) {
	if s.keyring == nil {
		writeError(w, http.StatusConflict, "no sidecar cluster: the keyring encrypts the gossip of cluster.bind")
		return
	}
	req := KeyRequest{Operation: cluster.KeyList}
	if r.Method == http.MethodPost {
		dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.Operation == cluster.KeyList {
			writeError(w, http.StatusBadRequest, `request body: expected {"operation": "install", "use" or "remove", "key": a base64 key}`)
			return
		}
	}
	keys, err := s.keyring.Keyring(req.Operation, req.Key)
	switch {
	case errors.Is(err, cluster.ErrNotEncrypted):
		writeError(w, http.StatusConflict, err.Error())
	case err != nil && keys.Members == 0:
		writeError(w, http.StatusBadRequest, err.Error())
	case err != nil:
		writeJSON(w, http.StatusBadGateway, keysFailed{Error: err.Error(), Keys: keys})
	default:
		s.logger.Info("gossip keyring", "operation", req.Operation, "members", keys.Members)
		writeJSON(w, http.StatusOK, keys)
	}
}

// keysFailed answers an operation that some members failed: which ones,
// and what the others hold.
type keysFailed struct {
	Error string `json:"error"`
	cluster.Keys
}

// Keys lists the gossip keys of the cluster's members.
func (c *Client) Keys(ctx context.Context) (cluster.Keys, error) {
	var out cluster.Keys
	err := c.do(ctx, http.MethodGet, "/api/keys", nil, &out)
	return out, err
}

// ChangeKeys installs, uses or removes a gossip key on every member.
func (c *Client) ChangeKeys(ctx context.Context, op cluster.KeyOperation, key string) (cluster.Keys, error) {
	var out cluster.Keys
	err := c.do(ctx, http.MethodPost, "/api/keys", KeyRequest{Operation: op, Key: key}, &out)
	return out, err
}

var keysCommand = command{
	usage: "keys list | keys install|use|remove KEY|-",
	brief: "lists or rotates the sidecar cluster's gossip encryption keys",
	summary: `Manages the gossip keyring on every live proxy of the cluster, as serf's keys command does.
Rotate a key: install the new one (amqp-mirror keygen), use it (every proxy encrypts with it),
then remove the old one. KEY "-" reads the key from standard input, so that ps does not show it.
A proxy started later with only a removed key can no longer join.`,
	args:     1,
	moreArgs: true,
	check: func(a []string) error {
		switch {
		case a[0] == string(cluster.KeyList) && len(a) == 1:
			return nil
		case a[0] == string(cluster.KeyInstall) || a[0] == string(cluster.KeyUse) || a[0] == string(cluster.KeyRemove):
			if len(a) != 2 {
				return fmt.Errorf("keys %s: expected one KEY (or - to read it from standard input)", a[0])
			}
			return nil
		}
		return fmt.Errorf("keys: expected list, install KEY, use KEY or remove KEY, found %q", strings.Join(a, " "))
	},
	run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
		if a[0] == string(cluster.KeyList) {
			o.say("Listing the gossip keys of the cluster's members ...")
			keys, err := c.Keys(ctx)
			if err != nil {
				return err
			}
			return o.printKeys(keys)
		}
		key := a[1]
		if key == "-" {
			b, err := io.ReadAll(io.LimitReader(os.Stdin, 4096))
			if err != nil {
				return fmt.Errorf("reading the key from standard input: %w", err)
			}
			key = strings.TrimSpace(string(b))
		}
		o.say("Running keys %s on every member ...", a[0])
		keys, err := c.ChangeKeys(ctx, cluster.KeyOperation(a[0]), key)
		if err != nil {
			return err
		}
		return o.printKeys(keys)
	},
}

// printKeys prints each key's fingerprint with the members holding it and
// the members encrypting with it.
func (o *ctlOptions) printKeys(k cluster.Keys) error {
	if o.formatter == formatJSON {
		return o.json(k)
	}
	keys := make([]string, 0, len(k.Keys))
	for key := range k.Keys {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	fmt.Fprintln(o.stdout, "fingerprint\tmembers\tprimary")
	for _, key := range keys {
		fmt.Fprintf(o.stdout, "%s\t%d/%d\t%d\n", key, k.Keys[key], k.Members, k.Primary[key])
	}
	return nil
}
