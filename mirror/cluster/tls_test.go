package cluster

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

const testIdentity = "member.amqp-mirror"

// testAuthority is a private CA that writes member certificates into a
// test's temporary directory.
type testAuthority struct {
	ca     *pki.CA
	caFile string
	dir    string
}

func newTestAuthority(t *testing.T, name string) *testAuthority {
	t.Helper()
	dir := t.TempDir()
	ca, keyPEM, err := pki.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := pki.WriteFiles(caFile, ca.CertPEM, filepath.Join(dir, "ca-key.pem"), keyPEM); err != nil {
		t.Fatal(err)
	}
	return &testAuthority{ca: ca, caFile: caFile, dir: dir}
}

// files issues a member certificate carrying the DNS names given.
func (a *testAuthority) files(t *testing.T, name string, dnsNames ...string) pki.Files {
	t.Helper()
	certPEM, keyPEM, err := a.ca.Issue(pki.Request{CommonName: name, DNSNames: dnsNames, Usage: pki.Member, ValidFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := pki.Files{CA: a.caFile, Cert: filepath.Join(a.dir, name+".pem"), Key: filepath.Join(a.dir, name+"-key.pem")}
	if err := pki.WriteFiles(f.Cert, certPEM, f.Key, keyPEM); err != nil {
		t.Fatal(err)
	}
	return f
}

// member is the mutual TLS of a member named name.
func (a *testAuthority) member(t *testing.T, name string) *MutualTLS {
	t.Helper()
	server, client, err := pki.Mutual(a.files(t, name, testIdentity), testIdentity)
	if err != nil {
		t.Fatal(err)
	}
	return &MutualTLS{Server: server, Client: client}
}

// startTLSCluster starts three nodes with raft under mutual TLS.
func startTLSCluster(t *testing.T, a *testAuthority) []*testNode {
	t.Helper()
	var nodes []*testNode
	for i := 1; i <= 3; i++ {
		var join []string
		if i > 1 {
			join = []string{nodes[0].LocalMember().Gossip}
		}
		cfg := newConfig(t, fmt.Sprintf("rabbit%d", i), 3, join...)
		cfg.RaftTLS = a.member(t, cfg.NodeName)
		nodes = append(nodes, startNode(t, cfg))
	}
	waitMembers(t, nodes, names(nodes), nil)
	waitLeader(t, nodes)
	waitVoters(t, nodes, names(nodes))
	return nodes
}

// TestRaftPortNeedsAMembersCertificate: a cluster whose raft port runs
// mutual TLS forms, replicates and forwards writes as a plaintext one
// does; a client that is not a member (plaintext, a certificate of the
// same authority without the members' identity, a self-signed one with
// it) sends a forwarded policy write to the leader's raft port and is
// cut off before the write is read. After each attempt a member's write
// reaches every node and the stranger's does not.
func TestRaftPortNeedsAMembersCertificate(t *testing.T) {
	authority := newTestAuthority(t, "cluster-ca")
	nodes := startTLSCluster(t, authority)
	leader := waitLeader(t, nodes)
	follower := without(nodes, leader)[0]

	// A write forwarded from a follower travels over the raft port too.
	changePolicies(t, follower, store.PolicyChange{Op: store.PolicySet, Policy: haPolicy(t, "member-0", "^member")})

	sameCA := authority.files(t, "stranger", "client.amqp-mirror")
	selfSigned := newTestAuthority(t, "rogue-ca")
	rogue := selfSigned.files(t, "rogue", testIdentity)
	trustCluster := func(f pki.Files) *tls.Config {
		pair, err := pki.LoadKeyPair(f.Cert, f.Key)
		if err != nil {
			t.Fatal(err)
		}
		// The client trusts the cluster's authority, so that only the
		// member's verdict on the client's certificate decides.
		return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: leader.cfg.RaftTLS.Client.RootCAs, ServerName: testIdentity, MinVersion: tls.VersionTLS13}
	}
	cases := []struct {
		name   string
		client *tls.Config // nil: plaintext
	}{
		{"plaintext", nil},
		{"same authority, another identity", trustCluster(sameCA)},
		{"another authority, the members' identity", trustCluster(rogue)},
		{"no certificate", &tls.Config{RootCAs: leader.cfg.RaftTLS.Client.RootCAs, ServerName: testIdentity, MinVersion: tls.VersionTLS13}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			policy := fmt.Sprintf("stranger-%d", i)
			if answer, err := forwardAsStranger(leader.LocalMember().Raft, tc.client, haPolicy(t, policy, "^stolen")); err == nil {
				t.Fatalf("the leader answered a stranger's forwarded write: %+v", answer)
			}
			member := fmt.Sprintf("member-%d", i+1)
			changePolicies(t, follower, store.PolicyChange{Op: store.PolicySet, Policy: haPolicy(t, member, "^member")})
			testutil.Eventually(t, 10*time.Second, func() error {
				for _, n := range nodes {
					got := policyNames(n.Store().Policies())
					if strings.Contains(got, policy) {
						t.Fatalf("%s holds the stranger's policy: %s", n.cfg.NodeName, got)
					}
					if !strings.Contains(got, member) {
						return fmt.Errorf("%s holds %s, not yet %s", n.cfg.NodeName, got, member)
					}
				}
				return nil
			})
		})
	}
	waitVoters(t, nodes, names(nodes))
}

// forwardAsStranger sends a forwarded policy write the way a member does
// and returns the leader's answer.
func forwardAsStranger(addr string, client *tls.Config, policy any) (forwardResponse, error) {
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return forwardResponse{}, err
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	conn := raw
	if client != nil {
		conn = tls.Client(raw, client)
	}
	w := bufio.NewWriter(conn)
	w.WriteByte(forwardByte)
	req := map[string]any{"op": "policy", "policy": map[string]any{"op": "set", "policy": policy}, "timeout": int64(5 * time.Second)}
	if err := json.NewEncoder(w).Encode(req); err != nil {
		return forwardResponse{}, err
	}
	if err := w.Flush(); err != nil {
		return forwardResponse{}, err
	}
	var resp forwardResponse
	err = json.NewDecoder(conn).Decode(&resp)
	return resp, err
}

// TestRaftTLSNeedsBothSides: a half-configured TLS is refused at start,
// before anything listens.
func TestRaftTLSNeedsBothSides(t *testing.T) {
	cfg := newConfig(t, "rabbit1", 1)
	cfg.RaftTLS = &MutualTLS{Client: &tls.Config{}, Server: &tls.Config{}}
	if _, err := Start(cfg); err == nil || !strings.Contains(err.Error(), "raft TLS") {
		t.Fatalf("expected raft TLS without client verification to be refused, got %v", err)
	}
}

// TestNoVoteWithoutAMembersCertificate: a process that gossips its way in
// (gossip here is not encrypted; with a key, one that holds the key) but
// whose raft port shows no member's certificate stays a member without a
// vote, whether its raft port runs TLS with another authority's
// certificate or no TLS at all; the three voters stay three.
func TestNoVoteWithoutAMembersCertificate(t *testing.T) {
	authority := newTestAuthority(t, "cluster-ca")
	nodes := startTLSCluster(t, authority)
	rogueAuthority := newTestAuthority(t, "rogue-ca")
	for _, tc := range []struct {
		name string
		tls  *MutualTLS
	}{
		{"another authority", rogueAuthority.member(t, "rogue-tls")},
		{"plaintext", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "rogue-" + strings.ReplaceAll(tc.name, " ", "-")
			cfg := newConfig(t, name, 0, nodes[0].LocalMember().Gossip)
			cfg.RaftTLS = tc.tls
			startNode(t, cfg)
			// Whichever node leads refuses it (the leader may change).
			testutil.Eventually(t, 20*time.Second, func() error {
				for _, n := range nodes {
					n.mu.Lock()
					_, refused := n.refusedVoters[name]
					n.mu.Unlock()
					if refused {
						return nil
					}
				}
				return fmt.Errorf("no leader has refused %s a vote yet", name)
			})
			waitVoters(t, nodes, names(nodes))
		})
	}
}
