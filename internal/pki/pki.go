// Package pki issues and loads the certificates amqp-mirror's TLS uses: a
// private certificate authority, member certificates for the sidecar
// cluster's raft port, server certificates for the admin API, and client
// certificates for backends that ask for one. It also builds the tls.Config
// values that verify them, so that every TLS endpoint of the product reads
// its files and checks their permissions the same way.
//
// Keys are ECDSA P-256; certificates are PEM, keys PKCS #8 PEM, written
// with mode 0600 as ssh expects of a private key.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// CA is a certificate authority that can issue certificates.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     crypto.Signer
}

// NewCA creates a self-signed authority named commonName.
func NewCA(commonName string, validFor time.Duration) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return &CA{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), key: key}, keyPEM, nil
}

// LoadCA reads an authority's certificate and key, refusing a key file
// that group or others may read.
func LoadCA(certFile, keyFile string) (*CA, error) {
	pair, err := LoadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	cert := pair.Leaf
	if !cert.IsCA {
		return nil, fmt.Errorf("%s: not a certificate authority (basic constraints say CA:FALSE)", certFile)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: the key cannot sign", keyFile)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, CertPEM: certPEM, key: signer}, nil
}

// Usage says what a certificate may be used for.
type Usage int

const (
	// Server is a TLS server's certificate (the admin API).
	Server Usage = 1 << iota
	// Client is a TLS client's certificate (a backend's client certificate).
	Client
	// Member is both: a proxy of the sidecar cluster serves its raft port
	// and dials the others' with the same certificate.
	Member = Server | Client
)

// Request describes a certificate to issue.
type Request struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	Usage      Usage
	ValidFor   time.Duration
}

// Issue signs a new key's certificate and returns both in PEM.
func (ca *CA) Issue(req Request) (certPEM, keyPEM []byte, err error) {
	if req.Usage == 0 {
		return nil, nil, errors.New("issuing a certificate: no usage given")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating a key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName},
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(req.ValidFor),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if req.Usage&Server != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if req.Usage&Client != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing %s: %w", req.CommonName, err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), keyPEM, nil
}

// WriteFiles writes a certificate (0644) and its key (0600). It refuses
// to overwrite either, so that a second run cannot replace a cluster's
// authority by accident.
func WriteFiles(certFile string, certPEM []byte, keyFile string, keyPEM []byte) error {
	if err := writeNew(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeNew(certFile, certPEM, 0o644); err != nil {
		os.Remove(keyFile)
		return err
	}
	return nil
}

func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// LoadKeyPair reads a certificate and its key, refusing a key file that
// group or others may read. The result's Leaf is set.
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	if err := config.CheckPrivate(keyFile); err != nil {
		return tls.Certificate{}, err
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		// tls's errors name neither file.
		return tls.Certificate{}, fmt.Errorf("%s and %s: %w", certFile, keyFile, err)
	}
	return pair, nil
}

// LoadPool reads a file of PEM certificates, the authorities to trust.
func LoadPool(caFile string) (*x509.CertPool, error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s: no PEM certificate found", caFile)
	}
	return pool, nil
}

func serialNumber() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("drawing a serial number: %w", err)
	}
	return serial, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding the key: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}
