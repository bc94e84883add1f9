package admin

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/amqp-mirror/amqp-mirror/internal/pki"
)

// trustedCA is the authority ctl trusts for the admin API's HTTPS, and
// where it was named (for errors); file "" means the system's roots.
type trustedCA struct {
	file, source string
}

// httpClient is an HTTP client that verifies the admin API's certificate
// against the authority, with TLS 1.2 at least, as serve offers.
func (ca trustedCA) httpClient() (*http.Client, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca.file != "" {
		pool, err := pki.LoadPool(ca.file)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ca.source, err)
		}
		tlsConfig.RootCAs = pool
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsConfig
	return &http.Client{Transport: transport}, nil
}

// transportError is a failure to talk to the admin API at all, in words
// that say what to change; the cause stays in the chain.
type transportError struct {
	message string
	cause   error
}

func (e *transportError) Error() string { return e.message }
func (e *transportError) Unwrap() error { return e.cause }

// explainTransport rewrites the errors of HTTPS gone wrong, which
// net/http reports as a URL followed by crypto/x509's terse words, into
// what an operator acts on: which certificate is not trusted and which
// flag fixes it. Other errors are returned as they are.
func explainTransport(err error, baseURL string) error {
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	var api *APIError
	var other *NotAdminAPIError
	var timeout net.Error
	explained := func(format string, args ...any) error {
		return &transportError{message: fmt.Sprintf(format, args...), cause: err}
	}
	switch {
	case errors.As(err, &unknown):
		signer := "an authority ctl does not trust"
		if unknown.Cert != nil && unknown.Cert.Issuer.CommonName != "" {
			signer = fmt.Sprintf("%q, an authority ctl does not trust", unknown.Cert.Issuer.CommonName)
		}
		return explained("the admin API's certificate at %s is not trusted: it is signed by %s; name that authority's certificate with --admin-ca FILE (or listen.admin_tls.ca in --config)", baseURL, signer)
	case errors.As(err, &hostname):
		return explained("the admin API's certificate at %s is not valid for %s: it names %s; reach the admin API by one of those names with --admin, or issue its certificate for this address", baseURL, hostname.Host, certificateNames(hostname.Certificate))
	case errors.As(err, &invalid):
		return explained("the admin API's certificate at %s is not valid: %v", baseURL, invalid)
	case errors.As(err, &record), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return explained("the admin API at %s does not speak HTTPS: use http:// in --admin, or set listen.admin_tls on the proxy", baseURL)
	case errors.As(err, &api) && api.Status == http.StatusBadRequest && strings.Contains(api.Message, "HTTP request to an HTTPS server"):
		return explained("the admin API at %s serves HTTPS only: use https:// in --admin with --admin-ca FILE, or --config with the proxy's file (listen.admin_tls)", baseURL)
	case errors.As(err, &other):
		return explained("the server at %s is not amqp-mirror's admin API (it answered %v); check --admin, or listen.admin in the proxy's file given with --config (the default is 127.0.0.1:15680; RabbitMQ's management plugin listens on 15672)", baseURL, other)
	case errors.Is(err, syscall.ECONNREFUSED):
		return explained("nothing listens at %s (connection refused): is amqp-mirror serve running there? ctl takes the address from --admin, else listen.admin of --config, else 127.0.0.1:15680", baseURL)
	case errors.As(err, &timeout) && timeout.Timeout():
		return explained("no answer from %s within --timeout: the address may be filtered, or the proxy overloaded; check --admin and the proxy's log", baseURL)
	}
	return err
}

// certificateNames lists the names a certificate is valid for.
func certificateNames(cert *x509.Certificate) string {
	if cert == nil {
		return "no name"
	}
	var names []string
	names = append(names, cert.DNSNames...)
	for _, ip := range cert.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		return "no name (no subject alternative names)"
	}
	return strings.Join(names, ", ")
}
