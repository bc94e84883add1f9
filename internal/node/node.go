// Package node composes and runs one amqp-mirror proxy: the config's
// policies, the metadata store (a single voter) or the sidecar cluster, the
// replication engine, the client-facing proxy, the admin API, config
// reloads and the graceful stop. Package main parses flags, handles
// signals and exits; everything it runs is here.
package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/admin"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/internal/version"
	"github.com/amqp-mirror/amqp-mirror/mirror/cluster"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// Options is what Run takes beside the config.
type Options struct {
	// Flags are the command line's, applied over the file again at each
	// reload; nil for none.
	Flags *pflag.FlagSet
	// Level is Logger's level, which a reload of log.level changes.
	Level  *slog.LevelVar
	Logger *slog.Logger
	// Ready, when set, receives the AMQP listener's address once it
	// accepts.
	Ready func(amqpAddr string)
	// NotifyReload, when set, is handed a channel on which every value
	// reloads the config file, and returns what stops that. Run calls it
	// once the node is built, before its listeners accept; main relays
	// SIGHUP there, so the signal keeps its default action until then.
	NotifyReload func(reload chan<- os.Signal) (stop func())
}

// Run runs the proxy cfg describes until ctx ends or a listener fails,
// then shuts down gracefully: clients get up to cfg.ShutdownTimeout to
// leave, then the engine, the metadata store (or cluster) and the backend
// watcher close, in that order.
func Run(ctx context.Context, cfg *config.Config, opts Options) error {
	logger := opts.Logger
	build := version.Read()
	logger.Info("amqp-mirror starting", append(build.LogAttrs(), "config", cfg.Path, "node", cfg.Node)...)
	for _, warning := range cfg.Warnings() {
		logger.Warn(warning, "file", cfg.Path)
	}
	store, err := config.OpenPolicyStore(cfg.StateDir, cfg.Policies, cfg.OperatorPolicies)
	if err != nil {
		return err
	}
	backends, err := loadBackends(cfg)
	if err != nil {
		return err
	}
	backend, err := backends.proxyHome()
	if err != nil {
		return err
	}
	// Before anything starts: a key file anyone may read stops serve at
	// once, with nothing to undo.
	adminTLS, err := adminTLSConfig(cfg.Listen.AdminTLS)
	if err != nil {
		return err
	}
	backendWatcher := controllink.NewWatcher(backends.watched(), controllink.WatcherOptions{Grace: cfg.FailoverGrace, Logger: logger})
	defer backendWatcher.Close()
	// Closed in reverse order after the proxy's shutdown: the engine (its
	// trimmers and syncs), then the metadata store, then the watcher whose
	// connections the engine used.
	mirroring, err := startMirroring(ctx, cfg, backends, store, backendWatcher, logger)
	if err != nil {
		return err
	}
	defer mirroring.close()
	srv, err := newServer(cfg, backend, mirroring, logger)
	if err != nil {
		return err
	}
	mirroring.countUnacked(srv.Unacked)
	mirroring.listUnrecorded(srv.UnrecordedQueues)
	mirroring.answerDelivered(srv.DeliveredBefore)
	mirroring.serveViews(srv)

	listeners, err := listen(cfg.Listen)
	if err != nil {
		return err
	}
	serveCtx, cancelServe := context.WithCancel(context.Background())
	defer cancelServe()
	stopBackground := runBackground(serveCtx, mirroring, srv, backendWatcher, logger)
	defer func() { cancelServe(); stopBackground() }()
	servers := &servers{errs: make(chan error, len(listeners)+1)}
	if cfg.Listen.Admin != "" {
		ready := newReadiness(srv, mirroring, backendWatcher, backend.Name)
		if err := startAdmin(serveCtx, cfg, adminTLS, store, srv, mirroring, backendWatcher, ready, servers, logger); err != nil {
			closeAll(listeners)
			return err
		}
	}

	watcher := config.NewWatcher(cfg, opts.Flags, store, logger, opts.Level)
	if cfg.Path != "" {
		if err := watcher.Start(serveCtx); err != nil {
			logger.Warn("not watching the config file for changes", "err", err)
		}
	}
	defer watcher.Close()
	reload := make(chan os.Signal, 1)
	if opts.NotifyReload != nil {
		defer opts.NotifyReload(reload)()
	}

	for _, l := range listeners {
		servers.start(func() error { return srv.Serve(l) })
		logger.Info("AMQP listening", "addr", l.Addr().String(), "backend", backend.Name, "backend_addr", backend.Addr, "version", build.Version)
	}
	if opts.Ready != nil {
		opts.Ready(listeners[0].Addr().String())
	}

	failure := servers.until(ctx, reload, func() {
		logger.Info("SIGHUP: reloading the config file", "path", cfg.Path)
		_ = watcher.Reload() // it logs its outcome, a refusal included
	})

	stopServing(cfg, srv, servers, cancelServe, logger)
	return failure
}

// runBackground starts what runs beside the servers until ctx ends:
// pause_minority in a sidecar cluster (a proxy cut off from most of its
// cluster stops serving until it sees a majority again), and with one
// backend the draining of the watcher's events (nothing acts on them
// then, and taking them keeps it probing; with several the engine takes
// them). The returned function waits for it to end.
func runBackground(ctx context.Context, m *mirroring, srv *proxy.Server, w *controllink.Watcher, logger *slog.Logger) (wait func()) {
	done := make(chan struct{})
	switch {
	case m.cluster != nil:
		go func() {
			defer close(done)
			cluster.PauseInMinority(ctx, m.cluster, pausing{srv, m.engine}, logger)
		}()
	case m.engine == nil:
		go func() {
			defer close(done)
			drain(ctx, w.Events())
		}()
	default:
		close(done)
	}
	return func() { <-done }
}

// stopServing gives the clients up to cfg.ShutdownTimeout to leave, then
// stops the servers and waits for them.
func stopServing(cfg *config.Config, srv *proxy.Server, servers *servers, cancelServe context.CancelFunc, logger *slog.Logger) {
	logger.Info("shutting down", "timeout", cfg.ShutdownTimeout, "connections", srv.Stats().ConnectionsOpen.Load())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Warn("shutdown timed out; remaining connections closed", "err", err)
	}
	cancelServe()
	servers.wait()
	logger.Info("stopped")
}

// newServer is the client-facing proxy: clients reach backend first, and
// the engine, when m has one, for their mirrored queues.
func newServer(cfg *config.Config, backend proxy.Backend, m *mirroring, logger *slog.Logger) (*proxy.Server, error) {
	return proxy.New(proxy.Options{
		Backend:          backend,
		Others:           m.others,
		Mirror:           m.mirror(),
		ClientNode:       cfg.Node,
		Logger:           logger,
		HandshakeTimeout: cfg.HandshakeTimeout,
		DialTimeout:      5 * time.Second,
		Heartbeat:        cfg.Heartbeat,
		FrameMax:         uint32(cfg.FrameMax),
		ChannelMax:       uint16(cfg.ChannelMax),
		CloseTimeout:     5 * time.Second,
	})
}

// listen opens the AMQP listener, and the AMQPS one when a certificate is
// configured. On an error none stays open.
func listen(cfg config.Listen) ([]net.Listener, error) {
	ln, err := net.Listen("tcp", cfg.AMQP)
	if err != nil {
		return nil, fmt.Errorf("listen.amqp: %w", err)
	}
	listeners := []net.Listener{ln}
	if cfg.TLS.Cert == "" {
		return listeners, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLS.Cert, cfg.TLS.Key)
	if err != nil {
		closeAll(listeners)
		return nil, fmt.Errorf("listen.tls: %w", err)
	}
	tlsLn, err := tls.Listen("tcp", cfg.AMQPS, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		closeAll(listeners)
		return nil, fmt.Errorf("listen.amqps: %w", err)
	}
	return append(listeners, tlsLn), nil
}

func closeAll(listeners []net.Listener) {
	for _, ln := range listeners {
		ln.Close()
	}
}

// drain takes events nobody acts on until ctx ends.
func drain(ctx context.Context, events <-chan controllink.Event) {
	for {
		select {
		case <-events:
		case <-ctx.Done():
			return
		}
	}
}

// startAdmin serves the admin API (ctl's commands, /metrics, the health
// endpoints and the status page) on listen.admin until ctx ends, with the token from
// the config or state_dir; over HTTPS when tlsConfig is not nil.
func startAdmin(ctx context.Context, cfg *config.Config, tlsConfig *tls.Config, store *config.PolicyStore, srv *proxy.Server, m *mirroring, w *controllink.Watcher, ready readiness, servers *servers, logger *slog.Logger) error {
	token, err := config.EnsureAdminToken(cfg)
	if err != nil {
		return err
	}
	adminLn, err := net.Listen("tcp", cfg.Listen.Admin)
	if err != nil {
		return fmt.Errorf("listen.admin: %w", err)
	}
	scheme := "http"
	if tlsConfig != nil {
		adminLn = tls.NewListener(adminLn, tlsConfig)
		scheme = "https"
	}
	adminOpts := []admin.Option{admin.WithReadiness(ready.check), admin.WithBackends(cfg.BackendNames()),
		admin.WithViews(newViews(cfg, ready.home, srv, m, w))}
	if m.engine != nil {
		adminOpts = append(adminOpts, admin.WithQueues(m.engine))
	}
	if m.cluster != nil {
		adminOpts = append(adminOpts, admin.WithKeyring(m.cluster))
	}
	adminSrv := admin.NewServer(store, token, logger, adminOpts...)
	registerMetrics(adminSrv.Registry(), cfg, version.Read(), srv, m, w)
	servers.start(func() error { return adminSrv.Serve(ctx, adminLn) })
	logger.Info("admin API listening", "addr", adminLn.Addr().String(), "scheme", scheme)
	return nil
}

// adminTLSConfig loads listen.admin_tls for the admin API's HTTPS; nil
// when it is not set. The key file is refused when group or others may
// read it (pki.LoadKeyPair). TLS 1.2 is the floor: older versions have
// known breaks, and every client of the admin API (ctl, curl, Prometheus)
// speaks 1.2.
func adminTLSConfig(t config.AdminTLS) (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	pair, err := pki.LoadKeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("listen.admin_tls: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// servers are the serving goroutines Run starts (the AMQP listeners, the
// admin API); each sends its end on errs.
type servers struct {
	errs    chan error
	running int
}

// start runs serve in a goroutine of its own; errs must have room for
// every server started.
func (s *servers) start(serve func() error) {
	s.running++
	go func() { s.errs <- serve() }()
}

// until returns when ctx ends (nil) or a server fails (its error),
// calling reload for each value on reloads meanwhile. A server that ends
// with proxy.ErrServerClosed, or nil, is not a failure.
func (s *servers) until(ctx context.Context, reloads <-chan os.Signal, reload func()) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-reloads:
			reload()
		case err := <-s.errs:
			s.running--
			if err != nil && !errors.Is(err, proxy.ErrServerClosed) {
				return err
			}
		}
	}
}

// wait returns once every server still running has ended.
func (s *servers) wait() {
	for ; s.running > 0; s.running-- {
		<-s.errs
	}
}
