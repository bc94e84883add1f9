package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/spf13/pflag"
)

// SlogLevel converts log.level for a slog.LevelVar.
func (l Log) SlogLevel() slog.Level {
	switch l.Level {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Diff lists the key paths whose values differ between two configs, in file
// order.
func Diff(old, next *Config) []string {
	var keys []string
	add := func(key string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			keys = append(keys, key)
		}
	}
	add("node", old.Node, next.Node)
	add("listen.amqp", old.Listen.AMQP, next.Listen.AMQP)
	add("listen.amqps", old.Listen.AMQPS, next.Listen.AMQPS)
	add("listen.admin", old.Listen.Admin, next.Listen.Admin)
	add("listen.tls", old.Listen.TLS, next.Listen.TLS)
	add("listen.admin_tls", old.Listen.AdminTLS, next.Listen.AdminTLS)
	add("backends", nonNilSlice(old.Backends), nonNilSlice(next.Backends))
	add("cluster.bind", old.Cluster.Bind, next.Cluster.Bind)
	add("cluster.join", strings.Join(old.Cluster.Join, ","), strings.Join(next.Cluster.Join, ","))
	add("cluster.advertise", old.Cluster.Advertise, next.Cluster.Advertise)
	add("cluster.raft_bind", old.Cluster.RaftBind, next.Cluster.RaftBind)
	add("cluster.bootstrap_expect", old.Cluster.BootstrapExpect, next.Cluster.BootstrapExpect)
	add("cluster.encrypt_file", old.Cluster.EncryptFile, next.Cluster.EncryptFile)
	add("cluster.tls", old.Cluster.TLS, next.Cluster.TLS)
	add("cluster.require_encryption", old.Cluster.RequireEncryption, next.Cluster.RequireEncryption)
	add("queue_master_locator", old.QueueMasterLocator, next.QueueMasterLocator)
	add("failover_grace", old.FailoverGrace, next.FailoverGrace)
	add("state_dir", old.StateDir, next.StateDir)
	add("admin_token", old.AdminToken, next.AdminToken)
	add("policies", policyJSON(old.Policies), policyJSON(next.Policies))
	add("operator_policies", policyJSON(old.OperatorPolicies), policyJSON(next.OperatorPolicies))
	add("log.level", old.Log.Level, next.Log.Level)
	add("log.format", old.Log.Format, next.Log.Format)
	add("metrics.per_queue", old.Metrics.PerQueue, next.Metrics.PerQueue)
	add("handshake_timeout", old.HandshakeTimeout, next.HandshakeTimeout)
	add("shutdown_timeout", old.ShutdownTimeout, next.ShutdownTimeout)
	add("heartbeat", old.Heartbeat, next.Heartbeat)
	add("frame_max", old.FrameMax, next.FrameMax)
	add("channel_max", old.ChannelMax, next.ChannelMax)
	return keys
}

func nonNilSlice[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func policyJSON(p []Policy) string {
	var b strings.Builder
	for _, x := range p {
		fmt.Fprintf(&b, "%s|%s|%s|%s|%d|%s;", x.VHost, x.Name, x.Pattern, x.ApplyTo, x.Priority, x.Definition)
	}
	return b.String()
}

// liveKeys are the keys a reload applies to the running proxy.
var liveKeys = map[string]bool{"policies": true, "operator_policies": true, "log.level": true}

// Watcher reloads the configuration file: parse, validate, diff, atomic
// swap. Policies, operator policies and log.level apply live; every other
// changed key is logged ("listen.amqp changed: restart required") and keeps
// its running value while the live part still applies. An invalid file is
// refused as a whole and the running configuration stays.
//
// Watch goroutines end on Close or when the context given to Start ends.
type Watcher struct {
	flags  *pflag.FlagSet
	store  *PolicyStore
	logger *slog.Logger
	level  *slog.LevelVar

	reload  sync.Mutex // serialises reloads
	current atomic.Pointer[Config]

	closeOnce sync.Once
	done      chan struct{}
	wg        sync.WaitGroup
}

// NewWatcher starts from cfg (as returned by Load with the same flags).
// store receives the file's policies on each reload; level, when not nil,
// follows log.level.
func NewWatcher(cfg *Config, flags *pflag.FlagSet, store *PolicyStore, logger *slog.Logger, level *slog.LevelVar) *Watcher {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{flags: flags, store: store, logger: logger, level: level, done: make(chan struct{})}
	w.current.Store(cfg)
	return w
}

// Current returns the running configuration.
func (w *Watcher) Current() *Config { return w.current.Load() }

// Reload re-reads the file. It returns an error only when the new file is
// refused as a whole (it is invalid); keys that need a restart are logged.
func (w *Watcher) Reload() error {
	w.reload.Lock()
	defer w.reload.Unlock()
	old := w.current.Load()
	next, err := Load(old.Path, w.flags)
	if err != nil {
		w.logger.Error("config reload refused; the running configuration stays", "file", old.Path, "error", err)
		return fmt.Errorf("reload refused: %w", err)
	}
	changed := Diff(old, next)
	if len(changed) == 0 {
		w.logger.Info("config reloaded: no changes", "file", old.Path)
		return nil
	}
	applied := *old
	var live []string
	for _, key := range changed {
		if !liveKeys[key] {
			w.logger.Warn(key+" changed: restart required", "file", old.Path, "key", key)
			continue
		}
		live = append(live, key)
		switch key {
		case "policies":
			applied.Policies = next.Policies
		case "operator_policies":
			applied.OperatorPolicies = next.OperatorPolicies
		case "log.level":
			applied.Log.Level = next.Log.Level
			if w.level != nil {
				w.level.Set(applied.Log.SlogLevel())
			}
		}
	}
	if w.store != nil {
		w.store.SetFilePolicies(applied.Policies, applied.OperatorPolicies)
	}
	w.current.Store(&applied)
	if len(live) > 0 {
		w.logger.Info("config reloaded", "file", old.Path, "applied", strings.Join(live, ","))
	}
	if slices.Contains(live, "policies") || slices.Contains(live, "operator_policies") {
		for _, warning := range applied.Warnings() {
			w.logger.Warn(warning, "file", old.Path)
		}
	}
	return nil
}

// debounce gathers the several write events of one save into one reload.
const debounce = 50 * time.Millisecond

// Start watches the file's directory (so that editors' rename-over saves are
// seen) and reloads after each change. It returns once the watch is set up.
func (w *Watcher) Start(ctx context.Context) error {
	path := w.current.Load().Path
	if path == "" {
		return errors.New("config watch: no file to watch")
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config watch: %w", err)
	}
	clean := filepath.Clean(path)
	if err := fw.Add(filepath.Dir(clean)); err != nil {
		fw.Close()
		return fmt.Errorf("config watch: %w", err)
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer fw.Close()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.done:
				return
			case ev, ok := <-fw.Events:
				if !ok {
					return
				}
				if filepath.Clean(ev.Name) == clean && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0 {
					timer.Reset(debounce)
				}
			case err, ok := <-fw.Errors:
				if !ok {
					return
				}
				w.logger.Error("config watch", "file", path, "error", err)
			case <-timer.C:
				_ = w.Reload() // Reload logs its own outcome
			}
		}
	}()
	return nil
}

// Close stops the watch goroutine and waits for it. It is idempotent.
func (w *Watcher) Close() error {
	w.closeOnce.Do(func() { close(w.done) })
	w.wg.Wait()
	return nil
}
