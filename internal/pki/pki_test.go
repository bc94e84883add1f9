package pki

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCert issues a certificate of ca and writes it into dir as
// name.pem and name-key.pem.
func writeCert(t *testing.T, ca *CA, dir, name string, req Request) Files {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	f := Files{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}
	if err := WriteFiles(f.Cert, certPEM, f.Key, keyPEM); err != nil {
		t.Fatal(err)
	}
	return f
}

func newCA(t *testing.T, dir, name string) (*CA, string) {
	t.Helper()
	ca, keyPEM, err := NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, name+".pem")
	if err := WriteFiles(caFile, ca.CertPEM, filepath.Join(dir, name+"-key.pem"), keyPEM); err != nil {
		t.Fatal(err)
	}
	return ca, caFile
}

// TestMutualChecksTheIdentity runs a real TLS handshake for each kind of
// client a member's port meets: only a certificate of the cluster's
// authority that names the identity gets through.
func TestMutualChecksTheIdentity(t *testing.T) {
	dir := t.TempDir()
	const identity = "member.amqp-mirror"
	ca, caFile := newCA(t, dir, "ca")
	other, otherFile := newCA(t, dir, "other-ca")
	member := writeCert(t, ca, dir, "member", Request{CommonName: "node1", DNSNames: []string{identity}, Usage: Member, ValidFor: time.Hour})
	member.CA = caFile
	stranger := writeCert(t, ca, dir, "stranger", Request{CommonName: "stranger", DNSNames: []string{"client.amqp-mirror"}, Usage: Member, ValidFor: time.Hour})
	stranger.CA = caFile
	foreign := writeCert(t, other, dir, "foreign", Request{CommonName: "foreign", DNSNames: []string{identity}, Usage: Member, ValidFor: time.Hour})
	foreign.CA = otherFile

	server, client, err := Mutual(member, identity)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				io.Copy(conn, io.LimitReader(conn, 1))
			}()
		}
	}()

	strangerClient := loadClient(t, stranger, identity)
	// A certificate of another authority fails the member's own check
	// for the client; so the client below trusts the cluster's CA.
	foreignClient := loadClient(t, foreign, identity)
	foreignClient.RootCAs = client.RootCAs
	cases := []struct {
		name   string
		config *tls.Config // nil: plaintext
		ok     bool
	}{
		{"member", client, true},
		{"same CA, other identity", strangerClient, false},
		{"other CA", foreignClient, false},
		{"no certificate", &tls.Config{RootCAs: client.RootCAs, ServerName: identity, MinVersion: tls.VersionTLS13}, false},
		{"plaintext", nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := roundTrip(ln.Addr().String(), tc.config)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatal("a byte made the round trip")
			}
		})
	}
}

func loadClient(t *testing.T, f Files, identity string) *tls.Config {
	t.Helper()
	_, client, err := Mutual(f, identity)
	if err != nil && !strings.Contains(err.Error(), "does not name") {
		t.Fatal(err)
	}
	if client != nil {
		return client
	}
	pair, err := LoadKeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := LoadPool(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: identity, MinVersion: tls.VersionTLS13}
}

// roundTrip sends one byte (a plaintext client an AMQP header) and reads
// one back: with TLS 1.3 a client's
// certificate is checked after the client's handshake returns, so only
// the echo shows whether the server accepted it.
func roundTrip(addr string, config *tls.Config) error {
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(5 * time.Second))
	conn, hello := raw, []byte("AMQP\x00\x00\x09\x01")
	if config != nil {
		conn, hello = tls.Client(raw, config), []byte{1}
	}
	if _, err := conn.Write(hello); err != nil {
		return err
	}
	_, err = io.ReadFull(conn, make([]byte, 1))
	return err
}

func TestMutualRefusesItsOwnCertificateWithoutTheIdentity(t *testing.T) {
	dir := t.TempDir()
	ca, caFile := newCA(t, dir, "ca")
	f := writeCert(t, ca, dir, "member", Request{CommonName: "node1", DNSNames: []string{"localhost"}, Usage: Member, ValidFor: time.Hour})
	f.CA = caFile
	_, _, err := Mutual(f, "member.amqp-mirror")
	if err == nil || !strings.Contains(err.Error(), "member.amqp-mirror") {
		t.Fatalf("expected an error naming the identity, got %v", err)
	}
}

func TestLoadKeyPairRefusesALooseKey(t *testing.T) {
	dir := t.TempDir()
	ca, _ := newCA(t, dir, "ca")
	f := writeCert(t, ca, dir, "server", Request{CommonName: "admin", DNSNames: []string{"localhost"}, Usage: Server, ValidFor: time.Hour})
	if err := os.Chmod(f.Key, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadKeyPair(f.Cert, f.Key)
	if err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("expected a loose key to be refused, got %v", err)
	}
}

func TestWriteFilesRefusesToOverwrite(t *testing.T) {
	dir := t.TempDir()
	_, caFile := newCA(t, dir, "ca")
	before, _ := os.ReadFile(caFile)
	ca2, keyPEM, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteFiles(caFile, ca2.CertPEM, filepath.Join(dir, "ca-key.pem"), keyPEM); err == nil {
		t.Fatal("overwrote an authority")
	}
	after, _ := os.ReadFile(caFile)
	if string(before) != string(after) {
		t.Fatal("the authority's certificate changed")
	}
}

func TestLoadCA(t *testing.T) {
	dir := t.TempDir()
	ca, caFile := newCA(t, dir, "ca")
	loaded, err := LoadCA(caFile, filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(ca.Cert) {
		t.Fatal("loaded another certificate")
	}
	f := writeCert(t, loaded, dir, "leaf", Request{CommonName: "leaf", DNSNames: []string{"x"}, Usage: Client, ValidFor: time.Hour})
	if _, err := LoadCA(f.Cert, f.Key); err == nil || !strings.Contains(err.Error(), "not a certificate authority") {
		t.Fatalf("a leaf was taken for an authority: %v", err)
	}
}
