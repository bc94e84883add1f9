package config

import (
	"net/url"
	"strings"
)

// BackendTLS is how the proxy's TLS client meets an amqps:// backend, on
// the clients' links and on the proxy's own connections alike. Brokers
// often run with a private authority and ask for a client certificate
// (RabbitMQ's ssl_options.verify = verify_peer with fail_if_no_peer_cert),
// which the system's roots and an anonymous client cannot satisfy.
type BackendTLS struct {
	// CA is a PEM file of the authorities that sign the broker's
	// certificate; "" trusts the system's roots.
	CA string
	// Cert and Key are the client certificate and its key (PEM), presented
	// when the broker asks for one; both or neither.
	Cert, Key string
	// ServerName is the name the broker's certificate must carry; "" is
	// the URL's host.
	ServerName string
}

// IsZero reports whether no backend tls key is set.
func (t BackendTLS) IsZero() bool { return t == BackendTLS{} }

// backendTLSKeys are the keys of backends[].tls, in the order problems
// are reported.
var backendTLSKeys = []string{"ca", "cert", "key", "server_name"}

// set returns the keys of t that hold a value, in backendTLSKeys order.
func (t BackendTLS) set() []string {
	var keys []string
	for i, value := range []string{t.CA, t.Cert, t.Key, t.ServerName} {
		if value != "" {
			keys = append(keys, backendTLSKeys[i])
		}
	}
	return keys
}

// decodeBackendTLS reads the tls mapping of a backend at path
// (backends[1].tls). An empty string leaves a key unset, as in
// listen.tls, so that a template can list every key.
func decodeBackendTLS(p *problems, path string, v any) BackendTLS {
	m, ok := v.(map[string]any)
	if !ok {
		p.add(path, "expected a mapping with keys %v, found %s", backendTLSKeys, describe(v))
		return BackendTLS{}
	}
	p.unknownKeys(path, m, backendTLSKeys, "backend tls")
	var t BackendTLS
	for _, f := range []struct {
		key, want string
		ptr       *string
	}{
		{"ca", "a PEM file of CA certificates", &t.CA},
		{"cert", "a PEM certificate file", &t.Cert},
		{"key", "a PEM key file", &t.Key},
		{"server_name", "a host name or IP address", &t.ServerName},
	} {
		raw, ok := m[f.key]
		if !ok {
			continue
		}
		s, ok := raw.(string)
		if !ok {
			p.add(join(path, f.key), "expected %s, found %s", f.want, describe(raw))
			continue
		}
		*f.ptr = s
	}
	if strings.ContainsAny(t.ServerName, " /:@") {
		p.add(join(path, "server_name"), "expected a host name or IP address without port or scheme, found %q", t.ServerName)
	}
	return t
}

// checkBackendTLS validates a backend's tls keys against its URL: they
// apply only to amqps:// (on amqp:// they would be silently ignored,
// leaving the operator believing the link is protected), and a client
// certificate needs its key and the key its certificate.
func checkBackendTLS(p *problems, path string, b Backend) {
	t := b.TLS
	if t.IsZero() {
		return
	}
	tlsPath := join(path, "tls")
	if u, err := url.Parse(b.URL); err == nil && u.Scheme != "amqps" && checkBackendURL(b.URL) == "" {
		for _, key := range t.set() {
			p.add(join(tlsPath, key), "expected %s to be an amqps:// URL for a TLS setting, found scheme %q", join(path, "url"), u.Scheme)
		}
		return
	}
	switch {
	case t.Cert != "" && t.Key == "":
		p.add(join(tlsPath, "key"), "expected the key file of %s, found none", join(tlsPath, "cert"))
	case t.Key != "" && t.Cert == "":
		p.add(join(tlsPath, "cert"), "expected the certificate file that goes with %s, found none", join(tlsPath, "key"))
	}
}

// resolve makes t's relative file names relative to dir, the config
// file's directory.
func (t *BackendTLS) resolve(dir string) {
	for _, p := range []*string{&t.CA, &t.Cert, &t.Key} {
		*p = resolvePath(dir, *p)
	}
}
