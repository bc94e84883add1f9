package pki

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// Refusal is err, a failed write on a TLS client connection, or the alert
// the server sent before it closed, when there is one. Under TLS 1.3 a
// server checks the client's certificate (or its absence: RabbitMQ's
// fail_if_no_peer_cert) after the client's side of the handshake has
// returned, sends its alert and closes, and the client's first write then
// meets the reset and says only "connection reset by peer".
//
// It reads from conn, so it is for a connection that failed: whatever it
// reads is lost. A tls.Conn keeps a read error, so a reader blocked on
// conn meanwhile returns the same alert.
func Refusal(conn net.Conn, err error) error {
	tlsConn, ok := conn.(*tls.Conn)
	if err == nil || !ok {
		return err
	}
	// The alert, when sent, came before the reset: it is read at once.
	tlsConn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, readErr := tlsConn.Read(make([]byte, 1))
	if opErr, ok := errors.AsType[*net.OpError](readErr); ok && opErr.Op == "remote error" {
		return fmt.Errorf("the server refused the TLS connection: %w", readErr)
	}
	return err
}
