package node

import (
	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/admin"
	"github.com/amqp-mirror/amqp-mirror/internal/version"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// The admin registry is what every part registers its metrics into.
var (
	_ proxy.Metrics   = (*admin.Registry)(nil)
	_ engine.Metrics  = (*admin.Registry)(nil)
	_ cluster.Metrics = (*admin.Registry)(nil)
)

// registerMetrics registers the node's metrics into r: the build, the
// client-facing proxy, the backends as the watcher sees them and, when
// they run, the engine (several backends) and the sidecar cluster.
func registerMetrics(r admin.Metrics, cfg *config.Config, build version.Info, srv *proxy.Server, m *mirroring, w *controllink.Watcher) {
	registerBuildInfo(r, build)
	srv.RegisterMetrics(r)
	registerBackendMetrics(r, cfg, w)
	if m.engine != nil {
		m.engine.RegisterMetrics(r, cfg.Metrics.PerQueue)
	}
	if m.cluster != nil {
		m.cluster.RegisterMetrics(r)
	}
}

// registerBuildInfo publishes the running build as labels of a constant
// 1, the Prometheus convention that lets a query join it to any series.
func registerBuildInfo(r admin.Metrics, build version.Info) {
	r.GaugeFamily("amqp_mirror_build_info", "The running build: version, Go version and VCS revision, as labels; the value is 1.",
		[]string{"version", "goversion", "revision"}, func(emit func(float64, ...string)) {
			emit(1, build.Version, build.GoVersion, build.Revision)
		})
}
