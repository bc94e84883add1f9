package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
)

// Errors of PolicyStore's operations, for errors.Is.
var (
	ErrPolicyNotFound = errors.New("policy not found")
	ErrFilePolicy     = errors.New("policy is defined in the config file")
	// ErrNoMajority: the runtime policies live in the proxies' replicated
	// log (PolicyLog) and this proxy cannot commit to it now (it is on a
	// minority side of a partition, or an election is under way).
	ErrNoMajority = errors.New("no majority of the proxies reachable")
)

// PoliciesFile is the name of the runtime policy file inside state_dir.
const PoliciesFile = "policies.json"

// PolicyStore holds the file policies and the runtime ones (set_policy and
// friends, persisted in state_dir/policies.json across restarts, or, once
// UseLog is called, kept in the proxies' replicated metadata log).
//
// A runtime policy with the same vhost and name as a file policy overrides
// it, as a second rabbitmqctl set_policy overwrites the first; the listing
// marks it (OverridesFile) and clearing it brings the file policy back.
// Clearing a policy that only the file defines is refused (ErrFilePolicy):
// the file is the place to change it, and a reload would bring it back.
//
// Writers are serialised by one mutex; readers call Snapshot, an atomic
// load of an immutable value, and never lock.
type PolicyStore struct {
	path string // "" keeps runtime policies in memory only
	// log, once set (UseLog), records runtime policy changes instead of
	// the file; they come back through SetRuntime.
	log atomic.Pointer[policyLogBox]

	mu sync.Mutex // guards the fields below and the file at path
	// The policies of the file and the runtime ones (set_policy), user and
	// operator.
	file, fileOperator       []Policy
	runtime, runtimeOperator []Policy
	version                  uint64
	subs                     map[uint64]chan *Snapshot
	nextSub                  uint64
	// logIndex is the log index of the runtime policies SetRuntime took
	// last, so that an older state never replaces a newer one.
	logIndex uint64

	snap atomic.Pointer[Snapshot]
}

// PolicyLog records runtime policy changes in a replicated log (the
// proxies' metadata log, package mirror) instead of state_dir, so that
// every proxy of a sidecar cluster has the same runtime policies, changed
// in the same order. Each method returns once the change is committed and
// SetRuntime has given this store the log's policies with it; a log that
// cannot commit (no majority reachable) returns an error and changes
// nothing.
type PolicyLog interface {
	// SetPolicy records p, validated, as a runtime policy (operator: an
	// operator policy), replacing one of the same vhost and name.
	SetPolicy(p Policy, operator bool) error
	// ClearPolicy removes a runtime policy, or returns an error wrapping
	// ErrPolicyNotFound when the log has none of that vhost and name.
	ClearPolicy(vhost, name string, operator bool) error
}

// policyLogBox holds a PolicyLog for the atomic pointer.
type policyLogBox struct{ log PolicyLog }

// Snapshot is an immutable view of the effective policies. Callers must not
// modify its slices.
type Snapshot struct {
	Version          uint64
	Policies         []Policy // file and runtime, sorted by vhost, priority (desc), name
	OperatorPolicies []Policy
}

type persisted struct {
	Version          int      `json:"version"`
	Policies         []Policy `json:"policies"`
	OperatorPolicies []Policy `json:"operator_policies"`
}

// OpenPolicyStore loads the runtime policies from stateDir (creating the
// directory when missing) and combines them with the file's policies,
// which Load has already validated. stateDir "" keeps runtime policies in
// memory.
func OpenPolicyStore(stateDir string, filePolicies, fileOperatorPolicies []Policy) (*PolicyStore, error) {
	s := &PolicyStore{subs: map[uint64]chan *Snapshot{}}
	if stateDir != "" {
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return nil, fmt.Errorf("state_dir: %w", err)
		}
		s.path = filepath.Join(stateDir, PoliciesFile)
		if err := s.load(); err != nil {
			return nil, err
		}
	}
	s.file = withSource(filePolicies, SourceFile)
	s.fileOperator = withSource(fileOperatorPolicies, SourceOperatorFile)
	s.publishLocked(false)
	return s, nil
}

func withSource(in []Policy, source string) []Policy {
	out := make([]Policy, 0, len(in))
	for _, p := range in {
		p.Source = source
		p.OverridesFile = false
		out = append(out, p)
	}
	return out
}

func (s *PolicyStore) load() error {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var f persisted
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("%s: %w", s.path, err)
	}
	var errs []error
	check := func(list []Policy, operator bool, key, source string) []Policy {
		var out []Policy
		for i, p := range list {
			v, err := p.Validated(operator)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %s[%d]: %w", s.path, key, i, err))
				continue
			}
			v.Source = source
			out = append(out, v)
		}
		return out
	}
	s.runtime = check(f.Policies, false, "policies", SourceRuntime)
	s.runtimeOperator = check(f.OperatorPolicies, true, "operator_policies", SourceOperatorRuntime)
	return errors.Join(errs...)
}

// Snapshot returns the current policies without locking.
func (s *PolicyStore) Snapshot() *Snapshot { return s.snap.Load() }

// SetPolicy validates p as set_policy would and stores it as a runtime
// policy, replacing one of the same vhost and name. It returns the stored
// policy.
func (s *PolicyStore) SetPolicy(p Policy) (Policy, error) { return s.set(p, false) }

// SetOperatorPolicy is SetPolicy for operator policies.
func (s *PolicyStore) SetOperatorPolicy(p Policy) (Policy, error) { return s.set(p, true) }

// ClearPolicy removes a runtime policy.
func (s *PolicyStore) ClearPolicy(vhost, name string) error { return s.clear(vhost, name, false) }

// ClearOperatorPolicy removes a runtime operator policy.
func (s *PolicyStore) ClearOperatorPolicy(vhost, name string) error {
	return s.clear(vhost, name, true)
}

// UseLog makes log the place of the runtime policies from now on: set and
// clear go to it, the policies file in state_dir is no longer written, and
// the runtime policies are those SetRuntime gives. Until the first
// SetRuntime the store keeps showing the ones it loaded from state_dir
// (Runtime), which the caller imports into the log when it has none.
func (s *PolicyStore) UseLog(log PolicyLog) { s.log.Store(&policyLogBox{log: log}) }

// Runtime returns the runtime policies and runtime operator policies this
// store holds now (from state_dir before UseLog and the first SetRuntime).
func (s *PolicyStore) Runtime() (policies, operatorPolicies []Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Policy(nil), s.runtime...), append([]Policy(nil), s.runtimeOperator...)
}

// RetireFile renames state_dir's runtime policies file, once its policies
// are in the log (UseLog), to the same name with ".imported" appended, so
// that it is neither read nor mistaken for the current policies. It
// returns the new name, "" when there was no file.
func (s *PolicyStore) RetireFile() (string, error) {
	if s.path == "" {
		return "", nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	retired := s.path + ".imported"
	if err := os.Rename(s.path, retired); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("retiring the runtime policies file: %w", err)
	}
	return retired, nil
}

// SetRuntime replaces the runtime policies with the log's state at index
// (the log index of its last policy change). A state not newer than the
// last one taken is ignored, so that callers need not order their calls.
// Each policy is validated again as set_policy would (a policy this
// proxy's version cannot take is left out and reported); the others are
// taken all the same.
func (s *PolicyStore) SetRuntime(index uint64, policies, operatorPolicies []Policy) error {
	// Most calls bring nothing new (the log changed for a queue): skip
	// the validation, which compiles every pattern.
	s.mu.Lock()
	stale := index <= s.logIndex
	s.mu.Unlock()
	if stale {
		return nil
	}
	var errs []error
	check := func(list []Policy, operator bool, source string) []Policy {
		out := make([]Policy, 0, len(list))
		for _, p := range list {
			v, err := p.Validated(operator)
			if err != nil {
				errs = append(errs, fmt.Errorf("runtime policy %q in vhost %q from the log: %w", p.Name, p.VHost, err))
				continue
			}
			v.Source, v.OverridesFile = source, false
			out = append(out, v)
		}
		return out
	}
	runtime := check(policies, false, SourceRuntime)
	runtimeOperator := check(operatorPolicies, true, SourceOperatorRuntime)
	s.mu.Lock()
	defer s.mu.Unlock()
	if index <= s.logIndex {
		return nil
	}
	s.logIndex = index
	s.runtime, s.runtimeOperator = runtime, runtimeOperator
	s.publishLocked(true)
	return errors.Join(errs...)
}

// SetFilePolicies replaces the file's policies (on reload).
func (s *PolicyStore) SetFilePolicies(policies, operatorPolicies []Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.file = withSource(policies, SourceFile)
	s.fileOperator = withSource(operatorPolicies, SourceOperatorFile)
	s.publishLocked(true)
}

// Subscribe returns a channel that receives the newest snapshot after each
// change, and a function that ends the subscription. The channel holds one
// snapshot; a slow reader misses intermediate ones but always gets the
// latest, and a writer never blocks on it.
func (s *PolicyStore) Subscribe() (<-chan *Snapshot, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.nextSub
	s.nextSub++
	ch := make(chan *Snapshot, 1)
	s.subs[id] = ch
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			s.mu.Lock()
			delete(s.subs, id)
			s.mu.Unlock()
		})
	}
}

func (s *PolicyStore) set(p Policy, operator bool) (Policy, error) {
	v, err := p.Validated(operator)
	if err != nil {
		return Policy{}, err
	}
	v.Source = SourceRuntime
	if operator {
		v.Source = SourceOperatorRuntime
	}
	v.OverridesFile = false
	if box := s.log.Load(); box != nil {
		if err := box.log.SetPolicy(v, operator); err != nil {
			return Policy{}, err
		}
		return v, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list := &s.runtime
	if operator {
		list = &s.runtimeOperator
	}
	next := make([]Policy, 0, len(*list)+1)
	for _, q := range *list {
		if q.VHost != v.VHost || q.Name != v.Name {
			next = append(next, q)
		}
	}
	next = append(next, v)
	old := *list
	*list = next
	if err := s.saveLocked(); err != nil {
		*list = old
		return Policy{}, err
	}
	s.publishLocked(true)
	return v, nil
}

func (s *PolicyStore) clear(vhost, name string, operator bool) error {
	if vhost == "" {
		vhost = "/"
	}
	if box := s.log.Load(); box != nil {
		err := box.log.ClearPolicy(vhost, name, operator)
		if errors.Is(err, ErrPolicyNotFound) && s.inFile(vhost, name, operator) {
			return fmt.Errorf("%w: %q in vhost %q; change the config file and reload", ErrFilePolicy, name, vhost)
		}
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list, file := &s.runtime, s.file
	if operator {
		list, file = &s.runtimeOperator, s.fileOperator
	}
	next := make([]Policy, 0, len(*list))
	for _, q := range *list {
		if q.VHost != vhost || q.Name != name {
			next = append(next, q)
		}
	}
	if len(next) == len(*list) {
		for _, q := range file {
			if q.VHost == vhost && q.Name == name {
				return fmt.Errorf("%w: %q in vhost %q; change the config file and reload", ErrFilePolicy, name, vhost)
			}
		}
		return fmt.Errorf("%w: %q in vhost %q", ErrPolicyNotFound, name, vhost)
	}
	old := *list
	*list = next
	if err := s.saveLocked(); err != nil {
		*list = old
		return err
	}
	s.publishLocked(true)
	return nil
}

// inFile reports whether the config file defines the policy.
func (s *PolicyStore) inFile(vhost, name string, operator bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	file := s.file
	if operator {
		file = s.fileOperator
	}
	for _, q := range file {
		if q.VHost == vhost && q.Name == name {
			return true
		}
	}
	return false
}

// saveLocked writes the runtime policies atomically: a temporary file in the
// same directory, synced, then renamed over the old one.
func (s *PolicyStore) saveLocked() error {
	if s.path == "" {
		return nil
	}
	b, err := json.MarshalIndent(persisted{Version: 1, Policies: nonNil(s.runtime), OperatorPolicies: nonNil(s.runtimeOperator)}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(s.path, append(b, '\n'), 0o600)
}

func nonNil(p []Policy) []Policy {
	if p == nil {
		return []Policy{}
	}
	return p
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		_ = dir.Sync() // make the rename durable where the platform allows
		dir.Close()
	}
	return nil
}

// publishLocked builds a new snapshot and, when notify is set and the
// policies changed, hands it to every subscriber without blocking.
func (s *PolicyStore) publishLocked(notify bool) {
	next := &Snapshot{
		Policies:         combine(s.file, s.runtime),
		OperatorPolicies: combine(s.fileOperator, s.runtimeOperator),
	}
	prev := s.snap.Load()
	if prev != nil && samePolicies(prev, next) {
		return
	}
	s.version++
	next.Version = s.version
	s.snap.Store(next)
	if !notify {
		return
	}
	for _, ch := range s.subs {
		select {
		case <-ch: // drop the stale snapshot the reader has not taken yet
		default:
		}
		ch <- next // cannot block: capacity 1, emptied above, writers serialised
	}
}

func samePolicies(a, b *Snapshot) bool {
	ja, err1 := json.Marshal([2][]Policy{a.Policies, a.OperatorPolicies})
	jb, err2 := json.Marshal([2][]Policy{b.Policies, b.OperatorPolicies})
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

func combine(file, runtime []Policy) []Policy {
	out := make([]Policy, 0, len(file)+len(runtime))
	overridden := map[[2]string]bool{}
	for _, p := range runtime {
		overridden[[2]string{p.VHost, p.Name}] = true
	}
	fileNames := map[[2]string]bool{}
	for _, p := range file {
		k := [2]string{p.VHost, p.Name}
		fileNames[k] = true
		if !overridden[k] {
			out = append(out, p)
		}
	}
	for _, p := range runtime {
		p.OverridesFile = fileNames[[2]string{p.VHost, p.Name}]
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.VHost != b.VHost {
			return a.VHost < b.VHost
		}
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		return a.Name < b.Name
	})
	return out
}

// List returns the policies of vhost ("" for every vhost).
func (s *Snapshot) List(vhost string, operator bool) []Policy {
	src := s.Policies
	if operator {
		src = s.OperatorPolicies
	}
	var out []Policy
	for _, p := range src {
		if vhost == "" || p.VHost == vhost {
			out = append(out, p)
		}
	}
	return out
}

// Match returns the user policy that applies (nil for none), without
// allocating an explanation: this is the proxy's hot path.
func (s *Snapshot) Match(vhost, name string, kind Kind, exclusive bool) *Policy {
	return matchFast(s.Policies, vhost, name, kind, exclusive)
}

// MatchOperator is Match for operator policies.
func (s *Snapshot) MatchOperator(vhost, name string, kind Kind, exclusive bool) *Policy {
	return matchFast(s.OperatorPolicies, vhost, name, kind, exclusive)
}

// Effective returns the merged definition for a queue (see Effective).
func (s *Snapshot) Effective(vhost, queue string, exclusive bool) Definition {
	return Effective(s.Match(vhost, queue, KindQueue, exclusive), s.MatchOperator(vhost, queue, KindQueue, exclusive))
}

// Explain explains the decision for one object.
func (s *Snapshot) Explain(vhost, name string, kind Kind, exclusive bool) Report {
	return Explain(s.Policies, s.OperatorPolicies, vhost, name, kind, exclusive)
}
