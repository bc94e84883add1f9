package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/admin"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// backends are the configured backends, each with its TLS client
// configuration built once at start. One configuration per backend serves
// every connection to it: the clients' links (proxy.Backend) and the
// proxy's own connections (controllink.Backend: the watcher, and through
// the engine its trimmers and syncs), so that no path to a broker trusts
// other authorities or presents another certificate than the config says.
type backends struct {
	list []config.Backend
	home int           // index of the backend clients go to first
	tls  []*tls.Config // by index; nil for amqp://
}

// loadBackends reads every backend's TLS files. A file that cannot be
// used is an error naming the backend and the key that names the file.
func loadBackends(cfg *config.Config) (*backends, error) {
	bs := &backends{list: cfg.Backends, tls: make([]*tls.Config, len(cfg.Backends))}
	for i, b := range cfg.Backends {
		if b.Name == cfg.Node {
			bs.home = i
		}
		c, err := backendTLS(i, b)
		if err != nil {
			return nil, err
		}
		bs.tls[i] = c
	}
	return bs, nil
}

// backendTLS is the TLS client configuration of backends[i]: nil for an
// amqp:// URL; for amqps:// the authorities of tls.ca (the system's roots
// without it), the client certificate of tls.cert and tls.key, and
// tls.server_name or the URL's host as the name the broker's certificate
// must carry.
//
// ServerName is always set: amqp091-go fills in an empty one by writing
// into the tls.Config it is given, and this one is shared by goroutines.
func backendTLS(i int, b config.Backend) (*tls.Config, error) {
	u, err := url.Parse(b.URL)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		return nil, fmt.Errorf("backend %s: cannot parse %s", b.Name, config.RedactURL(b.URL))
	}
	if u.Scheme != "amqps" {
		return nil, nil
	}
	key := func(name string) string { return fmt.Sprintf("backend %s: backends[%d].tls.%s", b.Name, i, name) }
	c := &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	if b.TLS.ServerName != "" {
		c.ServerName = b.TLS.ServerName
	}
	if b.TLS.CA != "" {
		pool, err := pki.LoadPool(b.TLS.CA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key("ca"), err)
		}
		c.RootCAs = pool
	}
	if b.TLS.Cert == "" {
		return c, nil
	}
	pair, err := pki.LoadKeyPair(b.TLS.Cert, b.TLS.Key)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key(keyPairKey(b.TLS, err)), err)
	}
	if !clientUsage(pair.Leaf) {
		return nil, fmt.Errorf("%s: %s is not a client certificate: its extended key usage lacks clientAuth, so the broker would refuse it", key("cert"), b.TLS.Cert)
	}
	c.Certificates = []tls.Certificate{pair}
	return c, nil
}

// keyPairKey names the key of the file a pki.LoadKeyPair error is about:
// a file that cannot be read is one of them, loose permissions are the
// key's; a certificate and key that do not match are both.
func keyPairKey(t config.BackendTLS, err error) string {
	var pathErr *fs.PathError
	switch {
	case errors.As(err, &pathErr) && pathErr.Path == t.Cert:
		return "cert"
	case errors.As(err, &pathErr) && pathErr.Path == t.Key, config.CheckPrivate(t.Key) != nil:
		return "key"
	}
	return "cert and tls.key"
}

// clientUsage reports whether a certificate may authenticate a TLS
// client: it names no extended key usage at all, or clientAuth, or any.
func clientUsage(cert *x509.Certificate) bool {
	if len(cert.ExtKeyUsage) == 0 && len(cert.UnknownExtKeyUsage) == 0 {
		return true
	}
	for _, usage := range cert.ExtKeyUsage {
		if usage == x509.ExtKeyUsageClientAuth || usage == x509.ExtKeyUsageAny {
			return true
		}
	}
	return false
}

// proxyHome is the backend client connections go to: the node this proxy
// sits beside, or the first backend.
func (bs *backends) proxyHome() (proxy.Backend, error) { return bs.proxyBackend(bs.home) }

// proxyOthers are the backends other than the home one, in config order.
func (bs *backends) proxyOthers() ([]proxy.Backend, error) {
	var out []proxy.Backend
	for i := range bs.list {
		if i == bs.home {
			continue
		}
		b, err := bs.proxyBackend(i)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// proxyBackend is where the proxy dials backends[i] for its clients.
func (bs *backends) proxyBackend(i int) (proxy.Backend, error) {
	b := bs.list[i]
	u, err := url.Parse(b.URL)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		return proxy.Backend{}, fmt.Errorf("backend %s: cannot parse %s", b.Name, config.RedactURL(b.URL))
	}
	backend := proxy.Backend{Name: b.Name, Addr: u.Host, TLS: bs.tls[i]}
	port := "5672"
	if u.Scheme == "amqps" {
		port = "5671"
	}
	if u.Port() == "" {
		backend.Addr = net.JoinHostPort(u.Hostname(), port)
	}
	return backend, nil
}

// watched is every configured backend, reached with the proxy's own
// account in its URL.
func (bs *backends) watched() []controllink.Backend {
	out := make([]controllink.Backend, 0, len(bs.list))
	for i, b := range bs.list {
		out = append(out, controllink.Backend{Name: b.Name, URL: b.URL, TLS: bs.tls[i]})
	}
	return out
}

// registerBackendMetrics publishes what the backend watcher knows.
func registerBackendMetrics(m admin.Metrics, cfg *config.Config, w *controllink.Watcher) {
	for _, b := range cfg.Backends {
		labels := fmt.Sprintf("{backend=%q}", b.Name)
		m.Gauge("amqp_mirror_backend_up"+labels, "1 while the proxy's own connection to the backend is open and the broker answers its probes.",
			func() float64 {
				if w.State(b.Name) == controllink.Up {
					return 1
				}
				return 0
			})
		m.Gauge("amqp_mirror_backend_vhosts_refused"+labels, "Vhosts in which the backend refuses the proxy's own account (the vhost is missing there, or the account lacks permissions): nothing of those vhosts is mirrored there.",
			func() float64 { return float64(len(w.RefusedVHosts(b.Name))) })
		m.Counter("amqp_mirror_backend_down_total"+labels, "Times the backend was found down: connection refused or reset, clean shutdown, or no answer within failover_grace.",
			func() float64 { return float64(w.Downs(b.Name)) })
	}
}
