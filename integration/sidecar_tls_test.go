package integration

// Mutual TLS on the sidecar cluster's raft port: the port that carries raft, forwarded
// metadata writes and the messages between proxies accepts only a member's certificate.

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// forwardByte opens a connection of the raft port that carries a forwarded metadata
// write (mirror/cluster's wire format): the byte, then one JSON request.
const forwardByte = 0xF0

// TestSidecarRaftPortNeedsAMembersCertificate: three sidecars with raft under mutual TLS
// (the walkthrough and every other sidecar test run so too). A stranger sends each proxy's
// raft port the forwarded write a member sends to set a runtime policy: in plaintext,
// with a certificate of the cluster's own authority that lacks the members' identity (a
// client certificate from `amqp-mirror tls cert client`), with a self-signed certificate
// that names the identity, and with no certificate. Each is refused, each proxy logs the
// refusal, and after each attempt no proxy lists the stranger's policy and a mirrored
// queue keeps its master. The same write with a member's certificate is accepted, so
// what refused the strangers is their certificate, not the request.
func TestSidecarRaftPortNeedsAMembersCertificate(t *testing.T) {
	const queue = "tls_guarded"
	t.Cleanup(func() { removeLeftovers(t, queue) })
	proxies, keys := startSidecarsWithKeys(t)
	awaitCondition(t, 60*time.Second, func() error {
		if err := declareThrough(proxies[0], queue); err != nil {
			return err
		}
		_, err := queueStatus(t, proxies[0], queue)
		return err
	})
	setPolicy := proxies[0].ctl(t, "set_policy", "ha-guarded", "^tls_", `{"ha-mode":"all"}`)
	if setPolicy.code != 0 {
		t.Fatalf("set_policy: exit %d: %s", setPolicy.code, setPolicy.stderr)
	}
	awaitCondition(t, 60*time.Second, func() error {
		row, err := queueStatus(t, proxies[0], queue)
		if err == nil && len(row.Slaves) != 2 {
			err = fmt.Errorf("%s: want 2 slaves", row)
		}
		return err
	})
	before, _ := queueStatus(t, proxies[0], queue)

	authority, err := pki.LoadPool(filepath.Join(keys.tlsDir, pki.CAFileName))
	if err != nil {
		t.Fatal(err)
	}
	withCertificate := func(f pki.Files) *tls.Config {
		pair, err := pki.LoadKeyPair(f.Cert, f.Key)
		if err != nil {
			t.Fatal(err)
		}
		// The stranger trusts the cluster's authority, so that only the proxy's
		// verdict on the stranger's certificate decides.
		return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: authority, ServerName: config.DefaultClusterIdentity, MinVersion: tls.VersionTLS13}
	}
	if res := keys.binary.run(t, nil, "tls", "cert", "client", "stranger", "--dir", keys.tlsDir); res.code != 0 {
		t.Fatalf("tls cert client: exit %d: %s", res.code, res.stderr)
	}
	sameAuthority := pki.Files{Cert: filepath.Join(keys.tlsDir, "stranger.pem"), Key: filepath.Join(keys.tlsDir, "stranger-key.pem")}
	rogueDir := t.TempDir()
	for _, args := range [][]string{{"tls", "ca", "--dir", rogueDir}, {"tls", "cert", "member", "rogue", "--dir", rogueDir}} {
		if res := keys.binary.run(t, nil, args...); res.code != 0 {
			t.Fatalf("%s: exit %d: %s", strings.Join(args, " "), res.code, res.stderr)
		}
	}
	selfSigned := pki.Files{Cert: filepath.Join(rogueDir, "rogue.pem"), Key: filepath.Join(rogueDir, "rogue-key.pem")}

	strangers := []struct {
		name   string
		client *tls.Config // nil: plaintext
	}{
		{"plaintext", nil},
		{"the cluster's authority, another identity", withCertificate(sameAuthority)},
		{"another authority, the members' identity", withCertificate(selfSigned)},
		{"no certificate", &tls.Config{RootCAs: authority, ServerName: config.DefaultClusterIdentity, MinVersion: tls.VersionTLS13}},
	}
	for i, stranger := range strangers {
		t.Run(stranger.name, func(t *testing.T) {
			policy := fmt.Sprintf("stolen-%d", i)
			for _, p := range proxies {
				if answer, err := forwardPolicy(t, p.raftAddr, stranger.client, policy); err == nil {
					t.Fatalf("the raft port of %s answered a stranger's forwarded write: %s", p.configPath, answer)
				}
			}
			for n, p := range proxies {
				awaitCondition(t, 30*time.Second, func() error {
					if _, ok := p.record(map[string]string{"msg": "raft port: refused a connection that is not a member's mutual TLS"}); !ok {
						return fmt.Errorf("proxy %d logged no refusal", n+1)
					}
					return nil
				})
				if res := p.ctl(t, "list_policies"); res.code != 0 || strings.Contains(res.stdout, policy) {
					t.Fatalf("proxy %d: list_policies: exit %d, stdout:\n%s", n+1, res.code, res.stdout)
				}
				row, err := queueStatus(t, p, queue)
				if err != nil || row.Master != before.Master || !slices.Equal(row.Slaves, before.Slaves) {
					t.Fatalf("proxy %d lists %s (%v), want it as before: %s", n+1, row, err, before)
				}
			}
		})
	}

	// The control: the same write with a member's certificate is taken by the leader.
	member := withCertificate(keys.member(t, "rabbit1"))
	var accepted bool
	for _, p := range proxies {
		if _, err := forwardPolicy(t, p.raftAddr, member, "members-own"); err == nil {
			accepted = true
		}
	}
	if !accepted {
		t.Fatal("no proxy took the forwarded write from a member's certificate: the strangers' test proves nothing")
	}
	awaitCondition(t, 30*time.Second, func() error {
		for n, p := range proxies {
			if err := p.ctl(t, "list_policies").contains("members-own"); err != nil {
				return fmt.Errorf("proxy %d: %w", n+1, err)
			}
		}
		return nil
	})
	for _, policy := range []string{"members-own", "ha-guarded"} {
		proxies[0].ctl(t, "clear_policy", policy)
	}
	conn, err := amqp.Dial(proxies[0].url("guest", "guest"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deleteQueue(conn, queue)
}

// forwardPolicy sends addr the forwarded write that sets an ha-all policy named name,
// as a member forwards it to the leader, over client (nil: plaintext), and returns the
// answer. A proxy that is not the leader answers with an error; a refused connection
// has no answer.
func forwardPolicy(t *testing.T, addr string, client *tls.Config, name string) (string, error) {
	t.Helper()
	policy, err := config.Policy{Name: name, VHost: "/", Pattern: "^tls_", ApplyTo: config.ApplyQueues, Definition: config.Definition{HAMode: config.HAAll}}.Validated(false)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(20 * time.Second))
	conn := raw
	if client != nil {
		conn = tls.Client(raw, client)
	}
	w := bufio.NewWriter(conn)
	w.WriteByte(forwardByte)
	request := map[string]any{"op": "policy", "policy": store.PolicyChange{Op: store.PolicySet, Policy: &policy}, "timeout": int64(10 * time.Second)}
	if err := json.NewEncoder(w).Encode(request); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		return "", err
	}
	var answer struct {
		Error string `json:"error"`
		Kind  string `json:"kind"`
	}
	if err := json.NewDecoder(conn).Decode(&answer); err != nil {
		return "", err
	}
	if answer.Error != "" || answer.Kind != "" {
		return "", errors.New(answer.Kind + ": " + answer.Error)
	}
	return "ok", nil
}
