package pki

import (
	"crypto/tls"
	"errors"
	"fmt"
)

// Files names the PEM files of one TLS endpoint: the authority it trusts
// and its own certificate and key.
type Files struct {
	CA, Cert, Key string
}

// Mutual returns the two sides of mutual TLS between peers that share an
// authority and an identity: every peer's certificate must be signed by
// f.CA and name identity (a DNS name in its subject alternative names),
// so that another certificate of the same authority is refused. server
// serves a listener, client dials one; both present f.Cert.
func Mutual(f Files, identity string) (server, client *tls.Config, err error) {
	if identity == "" {
		return nil, nil, errors.New("mutual TLS needs an identity to check")
	}
	pair, err := LoadKeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, nil, err
	}
	if err := pair.Leaf.VerifyHostname(identity); err != nil {
		return nil, nil, fmt.Errorf("%s does not name %s, the identity every member's certificate must carry", f.Cert, identity)
	}
	pool, err := LoadPool(f.CA)
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS13,
		// The chain is verified by then; what remains is the identity,
		// which a client's certificate is not checked for otherwise.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the peer sent no certificate")
			}
			if err := cs.PeerCertificates[0].VerifyHostname(identity); err != nil {
				return fmt.Errorf("the peer's certificate does not name %s: %w", identity, err)
			}
			return nil
		},
	}
	client = &tls.Config{
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ServerName:   identity,
		MinVersion:   tls.VersionTLS13,
	}
	return server, client, nil
}
