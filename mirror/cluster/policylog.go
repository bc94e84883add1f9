package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// PolicyWriter records a change of the runtime policies in the metadata
// log: the store.Store itself for a proxy alone, the Cluster (which
// forwards it to the leader) in a sidecar cluster. Both return once this
// proxy has applied the change.
type PolicyWriter interface {
	ChangePolicies(ctx context.Context, change store.PolicyChange) (store.PolicyResult, error)
}

var (
	_ PolicyWriter = (*Cluster)(nil)
	_ PolicyWriter = (*store.Store)(nil)
)

// policyLogTimeout bounds one runtime policy change (ctl set_policy and
// friends): a proxy that cannot reach a majority answers with an error
// within it instead of waiting for one.
const policyLogTimeout = 5 * time.Second

// PolicyLog keeps the runtime policies (set_policy, set_operator_policy
// and their clears) in the metadata log, so that every proxy of a cluster
// has the same ones, changed in the log's order, and a proxy alone keeps
// them across restarts in its single-voter log. It is the PolicyStore's
// config.PolicyLog; its goroutine hands the log's policies to the
// PolicyStore whenever the log changes, until Close. Policies of the
// config file stay each proxy's own.
type PolicyLog struct {
	writer   PolicyWriter
	store    *store.Store
	policies *config.PolicyStore
	log      *slog.Logger

	// importMu serialises the import with changes made through this
	// proxy, so that none of them can reach the log before it.
	importMu sync.Mutex
	// pending are state_dir's runtime policies while they are still to be
	// imported; nil once the log has runtime policies.
	pending *store.RuntimePolicies

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

var _ config.PolicyLog = (*PolicyLog)(nil)

// StartPolicyLog moves the runtime policies of policies into the log
// (metadata, written through writer). When the log has never recorded any,
// those policies loaded from state_dir are imported once: at once when
// the log has a leader (always for a proxy alone), else in the background
// until it has, and in any case before a change made through this proxy.
// Whichever proxy's import or change reaches the log first wins; a later
// import is refused.
func StartPolicyLog(writer PolicyWriter, metadata *store.Store, policies *config.PolicyStore, logger *slog.Logger) *PolicyLog {
	l := &PolicyLog{writer: writer, store: metadata, policies: policies, log: logger.With("component", "runtime-policies"), done: make(chan struct{})}
	if filePolicies, fileOperator := policies.Runtime(); len(filePolicies)+len(fileOperator) > 0 {
		l.pending = &store.RuntimePolicies{Policies: filePolicies, OperatorPolicies: fileOperator}
	}
	policies.UseLog(l)
	changes, unsubscribe := metadata.Changes()
	l.sync()
	first, cancelFirst := context.WithTimeout(context.Background(), time.Second)
	l.importPending(first)
	cancelFirst()
	var ctx context.Context
	ctx, l.cancel = context.WithCancel(context.Background())
	go l.follow(ctx, changes, unsubscribe)
	return l
}

// follow hands the log's policies to the PolicyStore at every change of
// the log, and retries a pending import every second, until ctx ends.
func (l *PolicyLog) follow(ctx context.Context, changes <-chan struct{}, unsubscribe func()) {
	defer close(l.done)
	defer unsubscribe()
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-changes:
			if !ok {
				return
			}
			l.sync()
		case <-retry.C:
			attempt, cancelAttempt := context.WithTimeout(ctx, policyLogTimeout)
			l.importPending(attempt)
			cancelAttempt()
		}
	}
}

// Close stops following the log and returns once the goroutine has ended.
func (l *PolicyLog) Close() {
	l.closeOnce.Do(func() {
		l.cancel()
		<-l.done
	})
}

// importPending writes the runtime policies loaded from state_dir to the
// log if it has none yet, and then renames the file. An error leaves them
// pending.
func (l *PolicyLog) importPending(ctx context.Context) error {
	l.importMu.Lock()
	defer l.importMu.Unlock()
	if l.pending == nil {
		return nil
	}
	imported := false
	if l.store.Policies().Index == 0 {
		res, err := l.writer.ChangePolicies(ctx, store.PolicyChange{Op: store.PolicyImport, Import: l.pending})
		if err != nil {
			l.log.Debug("cannot import state_dir's runtime policies into the log yet; retrying", "err", err)
			return fmt.Errorf("importing state_dir's runtime policies into the log: %w", err)
		}
		imported = res.Changed
	}
	if imported {
		l.log.Info("runtime policies imported from state_dir into the metadata log", "policies", len(l.pending.Policies), "operator_policies", len(l.pending.OperatorPolicies))
	} else {
		l.log.Info("the metadata log already has runtime policies; state_dir's are not imported")
	}
	l.pending = nil
	l.sync()
	// Renamed, so that a restart cannot show the file's policies, stale
	// by then, while the log is read.
	if retired, err := l.policies.RetireFile(); err != nil {
		l.log.Warn("cannot rename the runtime policies file, which the log replaces", "err", err)
	} else if retired != "" {
		l.log.Info("runtime policies file renamed; the metadata log holds them now", "file", retired)
	}
	return nil
}

// sync hands the log's runtime policies to the PolicyStore. A log that has
// never recorded any leaves the store as it is (state_dir's until the
// import).
func (l *PolicyLog) sync() {
	rp := l.store.Policies()
	if rp.Index == 0 {
		return
	}
	if err := l.policies.SetRuntime(rp.Index, rp.Policies, rp.OperatorPolicies); err != nil {
		l.log.Warn("some runtime policies of the log cannot be applied here", "err", err)
	}
}

// policyRetry is how long a change waits before it tries again when the
// log had no leader.
const policyRetry = 100 * time.Millisecond

// whileNoLeader runs attempt, and again after policyRetry while it fails
// because the log has no leader, until ctx ends: an election (a leader
// lost, a loaded host) lasts about a second, and a ctl command during one
// should wait for it rather than fail. A proxy on a minority side fails
// when ctx ends.
func whileNoLeader(ctx context.Context, attempt func() error) error {
	for {
		err := attempt()
		if err == nil || !errors.Is(err, store.ErrNotLeader) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(policyRetry):
		}
	}
}

// SetPolicy records a runtime policy in the log.
func (l *PolicyLog) SetPolicy(p config.Policy, operator bool) error {
	return l.change(store.PolicyChange{Op: store.PolicySet, Policy: &p, Operator: operator})
}

// ClearPolicy removes a runtime policy from the log.
func (l *PolicyLog) ClearPolicy(vhost, name string, operator bool) error {
	return l.change(store.PolicyChange{Op: store.PolicyClear, VHost: vhost, Name: name, Operator: operator})
}

// change imports state_dir's policies first, then records c. A change the
// log refused without committing is tried again; one that may have
// committed (ErrLeadershipLost is also ErrNotLeader) is one that a second
// attempt repeats harmlessly for a set, and for a clear finds the policy
// already gone (ErrPolicyNotFound, as for a clear made twice).
func (l *PolicyLog) change(c store.PolicyChange) error {
	ctx, cancel := context.WithTimeout(context.Background(), policyLogTimeout)
	defer cancel()
	err := whileNoLeader(ctx, func() error { return l.importPending(ctx) })
	if err == nil {
		err = whileNoLeader(ctx, func() error {
			_, err := l.writer.ChangePolicies(ctx, c)
			return err
		})
	}
	if err != nil {
		switch {
		case errors.Is(err, store.ErrNotLeader):
			return fmt.Errorf("%w: runtime policies live in the proxies' replicated log, and this proxy cannot reach a majority of the proxies; nothing was changed (%v)", config.ErrNoMajority, err)
		case errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("%w: no answer from the proxies' replicated log within %v; the change may or may not be made, list the policies to see (%v)", config.ErrNoMajority, policyLogTimeout, err)
		}
		return err
	}
	// The writer returns once this proxy applied the change: the store
	// shows it before the ctl command returns.
	l.sync()
	return nil
}
