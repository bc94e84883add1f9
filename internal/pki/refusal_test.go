package pki

import (
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// TestRefusalNamesTheAlert: a server that wants a client certificate and
// gets none refuses after the client's TLS 1.3 handshake has returned;
// the client's write that meets the reset is reported as the alert.
func TestRefusalNamesTheAlert(t *testing.T) {
	dir := t.TempDir()
	ca, caFile := newCA(t, dir, "ca")
	server := writeCert(t, ca, dir, "server", Request{CommonName: "server", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usage: Server, ValidFor: time.Hour})
	pair, err := LoadKeyPair(server.Cert, server.Key)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := LoadPool(caFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan struct{})
	go func() {
		defer close(refused)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		conn.(*tls.Conn).Handshake() // fails: no certificate; the alert goes out
		conn.Close()
	}()
	t.Cleanup(func() { ln.Close(); <-refused })

	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatalf("the client's side of the handshake: %v", err)
	}
	defer conn.Close()
	<-refused
	conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	for err == nil { // the first writes may go out before the reset comes back
		_, err = conn.Write([]byte{0})
	}
	got := Refusal(conn, err)
	if !strings.Contains(got.Error(), "the server refused the TLS connection: remote error: tls: certificate required") {
		t.Errorf("Refusal(%v) = %v, want the alert", err, got)
	}
}

func TestRefusalLeavesOtherErrors(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	defer client.Close()
	reset := errors.New("connection reset by peer")
	tests := []struct {
		name string
		conn net.Conn
		err  error
		want error
	}{
		{"no error", tls.Client(client, &tls.Config{}), nil, nil},
		{"not TLS", client, reset, reset},
	}
	for _, tc := range tests {
		if got := Refusal(tc.conn, tc.err); got != tc.want {
			t.Errorf("%s: Refusal = %v, want %v", tc.name, got, tc.want)
		}
	}
}
