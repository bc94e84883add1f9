package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// This file holds the two kinds of state the log keeps beside the queues'
// metadata: runtime policies (ctl set_policy and friends), so that every
// proxy of a cluster applies the same policies in the same order, and the
// tombstones of deleted queues, so that a copy a broker kept while it was
// down is recognised as deleted, not adopted as a new queue.

// RuntimePolicies are the policies set at run time (ctl set_policy,
// set_operator_policy), as the log holds them. Policies in the config file
// are not here: they are each proxy's own.
type RuntimePolicies struct {
	Policies         []config.Policy `json:"policies,omitempty"`
	OperatorPolicies []config.Policy `json:"operator_policies,omitempty"`
	// Index is the log index of the last change; 0 while the log has
	// recorded none, which is when a proxy may import the runtime policies
	// it kept in state_dir before they moved into the log (PolicyImport).
	Index uint64 `json:"index"`
}

// Clone returns a copy whose slices the caller may keep.
func (r RuntimePolicies) Clone() RuntimePolicies {
	r.Policies = slices.Clone(r.Policies)
	r.OperatorPolicies = slices.Clone(r.OperatorPolicies)
	return r
}

// PolicyOp says what a PolicyChange does.
type PolicyOp string

const (
	// PolicySet adds a runtime policy or replaces the one of the same vhost
	// and name.
	PolicySet PolicyOp = "set"
	// PolicyClear removes a runtime policy; config.ErrPolicyNotFound when
	// the log has none of that vhost and name.
	PolicyClear PolicyOp = "clear"
	// PolicyImport sets every runtime policy at once, only if the log has
	// never recorded any (RuntimePolicies.Index 0): the one-time migration
	// of a state_dir's policies file. Otherwise it changes nothing.
	PolicyImport PolicyOp = "import"
)

// PolicyChange is one change of the runtime policies. The proxy that
// proposes it has validated the policies (config.Policy.Validated); every
// proxy validates them again when it takes them into its PolicyStore.
type PolicyChange struct {
	Op       PolicyOp `json:"op"`
	Operator bool     `json:"operator,omitempty"`
	// Policy is the policy to set (PolicySet).
	Policy *config.Policy `json:"policy,omitempty"`
	// VHost and Name name the policy to clear (PolicyClear).
	VHost string `json:"vhost,omitempty"`
	Name  string `json:"name,omitempty"`
	// Import are the policies to import (PolicyImport).
	Import *RuntimePolicies `json:"import,omitempty"`
}

// PolicyResult is what the log answered to a PolicyChange.
type PolicyResult struct {
	// Index is the log index of the entry; a proxy that wants to read its
	// own write waits until it has applied it (Store.WaitApplied).
	Index uint64 `json:"index"`
	// Changed is false for an import the log refused because it already
	// held runtime policies.
	Changed bool `json:"changed"`
}

// apply applies one change at log index; errors leave r as it was.
func (r *RuntimePolicies) apply(c PolicyChange, index uint64) (PolicyResult, error) {
	list := &r.Policies
	if c.Operator {
		list = &r.OperatorPolicies
	}
	switch c.Op {
	case PolicySet:
		if c.Policy == nil {
			return PolicyResult{}, fmt.Errorf("set_policy without a policy")
		}
		p := bare(*c.Policy)
		next := slices.DeleteFunc(slices.Clone(*list), func(q config.Policy) bool { return q.VHost == p.VHost && q.Name == p.Name })
		*list = append(next, p)
	case PolicyClear:
		vhost := c.VHost
		if vhost == "" {
			vhost = "/"
		}
		next := slices.DeleteFunc(slices.Clone(*list), func(q config.Policy) bool { return q.VHost == vhost && q.Name == c.Name })
		if len(next) == len(*list) {
			return PolicyResult{}, fmt.Errorf("%w: %q in vhost %q", config.ErrPolicyNotFound, c.Name, vhost)
		}
		*list = next
	case PolicyImport:
		if c.Import == nil {
			return PolicyResult{}, fmt.Errorf("policy import without policies")
		}
		if r.Index != 0 {
			return PolicyResult{Index: index}, nil
		}
		r.Policies, r.OperatorPolicies = bareAll(c.Import.Policies), bareAll(c.Import.OperatorPolicies)
	default:
		return PolicyResult{}, fmt.Errorf("unknown policy operation %q", c.Op)
	}
	r.Index = index
	return PolicyResult{Index: index, Changed: true}, nil
}

// bare strips what depends on the proxy showing a policy (its source, and
// whether it hides a policy of that proxy's file).
func bare(p config.Policy) config.Policy {
	p.Source, p.OverridesFile = "", false
	return p
}

func bareAll(in []config.Policy) []config.Policy {
	out := make([]config.Policy, 0, len(in))
	for _, p := range in {
		out = append(out, bare(p))
	}
	return out
}

// MaxTombstones bounds the tombstones the log keeps: past it, the oldest
// is forgotten, and a copy of that queue found later on a broker that was
// down since is adopted as a new queue again (as before tombstones).
const MaxTombstones = 10000

// Tombstone records a queue deleted through the proxies (or forgotten
// because its master deleted itself). A broker that was down at the time
// still has its copy; the engine deletes such a copy when it finds it
// instead of adopting it. Declaring the queue again removes the tombstone.
type Tombstone struct {
	ID mirror.QueueID `json:"id"`
	// Epoch is the deleted queue's last epoch.
	Epoch uint64 `json:"epoch"`
	// Backends held a copy when the queue was deleted, master first.
	Backends []string `json:"backends,omitempty"`
	// Index is the log index of the delete, At when the leader appended
	// it (the same on every proxy).
	Index uint64    `json:"index"`
	At    time.Time `json:"at"`
}

// bury records the tombstone of a deleted queue; call with mu held.
func (f *metaFSM) bury(m mirror.QueueMeta, entry *raft.Log) {
	f.tombstones[m.ID] = Tombstone{ID: m.ID, Epoch: m.Epoch, Backends: m.Backends(), Index: entry.Index, At: entry.AppendedAt}
	if len(f.tombstones) <= MaxTombstones {
		return
	}
	var oldest Tombstone
	for _, t := range f.tombstones {
		if oldest.Index == 0 || t.Index < oldest.Index {
			oldest = t
		}
	}
	delete(f.tombstones, oldest.ID)
}

func (f *metaFSM) tombstone(id mirror.QueueID) (Tombstone, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	t, ok := f.tombstones[id]
	t.Backends = slices.Clone(t.Backends)
	return t, ok
}

func (f *metaFSM) listTombstones() []Tombstone {
	f.mu.RLock()
	out := make([]Tombstone, 0, len(f.tombstones))
	for _, t := range f.tombstones {
		t.Backends = slices.Clone(t.Backends)
		out = append(out, t)
	}
	f.mu.RUnlock()
	slices.SortFunc(out, func(a, b Tombstone) int { return compareNames(a.ID.VHost, a.ID.Name, b.ID.VHost, b.ID.Name) })
	return out
}

func (f *metaFSM) runtimePolicies() RuntimePolicies {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.policies.Clone()
}

// Tombstone returns the tombstone of a deleted queue, if the log keeps
// one.
func (s *Store) Tombstone(id mirror.QueueID) (Tombstone, bool) { return s.fsm.tombstone(id) }

// Tombstones returns every tombstone, sorted by vhost and name.
func (s *Store) Tombstones() []Tombstone { return s.fsm.listTombstones() }

// OpenedAt is the index of the last log entry this proxy's state held when
// the store opened (that of its latest snapshot): the entries after it it
// learns from the leader. Tombstones newer than it include every delete
// made while this proxy was down, whose copies its node's broker may still
// hold.
func (s *Store) OpenedAt() uint64 { return s.openedAt }

// Policies returns the runtime policies as this proxy's copy of the log
// holds them.
func (s *Store) Policies() RuntimePolicies { return s.fsm.runtimePolicies() }

// ChangePolicies records a change of the runtime policies. Only the leader
// can (others get ErrNotLeader: the sidecar cluster forwards it). The
// result's Index is the entry's; errors of the change itself (clearing a
// policy the log does not have) wrap config.ErrPolicyNotFound.
func (s *Store) ChangePolicies(ctx context.Context, c PolicyChange) (PolicyResult, error) {
	res, err := s.apply(ctx, command{Op: opPolicy, Policy: &c})
	if err != nil {
		return PolicyResult{}, fmt.Errorf("recording a runtime policy change (%s): %w", c.Op, err)
	}
	return res.policy, nil
}

// WaitApplied waits until this proxy has applied the log up to index, so
// that its reads show a write committed through another proxy.
func (s *Store) WaitApplied(ctx context.Context, index uint64) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for s.fsm.appliedIndex() < index {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for log entry %d (applied %d): %w", index, s.fsm.appliedIndex(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}
