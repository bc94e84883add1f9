package node

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/admin"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// proxyBackend is the backend client connections go to: the node this proxy
// sits beside, or the first backend.
func proxyBackend(cfg *config.Config) (proxy.Backend, error) {
	b := cfg.Backends[0]
	for _, candidate := range cfg.Backends {
		if candidate.Name == cfg.Node {
			b = candidate
		}
	}
	return backendAddress(b)
}

// backendAddress is where the proxy dials a backend for its clients.
func backendAddress(b config.Backend) (proxy.Backend, error) {
	u, err := url.Parse(b.URL)
	if err != nil {
		// url.Error quotes the whole URL, password included.
		return proxy.Backend{}, fmt.Errorf("backend %s: cannot parse %s", b.Name, config.RedactURL(b.URL))
	}
	backend := proxy.Backend{Name: b.Name, Addr: u.Host}
	port := "5672"
	if u.Scheme == "amqps" {
		port = "5671"
		backend.TLS = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	}
	if u.Port() == "" {
		backend.Addr = net.JoinHostPort(u.Hostname(), port)
	}
	return backend, nil
}

// watchedBackends is every configured backend, reached with the proxy's own
// account in its URL.
func watchedBackends(cfg *config.Config) []controllink.Backend {
	out := make([]controllink.Backend, 0, len(cfg.Backends))
	for _, b := range cfg.Backends {
		wb := controllink.Backend{Name: b.Name, URL: b.URL}
		if u, err := url.Parse(b.URL); err == nil && u.Scheme == "amqps" {
			wb.TLS = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
		}
		out = append(out, wb)
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
