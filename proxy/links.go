package proxy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// linkSet is a client connection's links, at most one per backend, by
// backend index: which link serves each backend, how many links each
// backend had (the generations), when a link to it last failed, which link
// is home, and how often the set changed. Any goroutine may use it; the
// client connection dials a link and runs its read loop, and the set
// decides when a link opens and which one serves.
type linkSet struct {
	// names are the backends' names by index; mirror, nil without
	// mirroring, says which backends the engine counts down. Both are the
	// server's and only read.
	names  []string
	mirror Mirror
	// first is the socket of the link the handshake opened, set before the
	// connection serves; with one backend it is the only link's, which
	// flush flushes without looking the link up.
	first *wire.Socket
	// homeLink is where channel 0 and anything without a place of its own
	// goes: the link the handshake opened until that link is lost; with
	// mirroring, another link then becomes home (rehome). homeList is the
	// same as a one-element target list.
	homeLink atomic.Pointer[link]
	homeList atomic.Pointer[[]*link]
	// changed counts links opened and lost, so that what was decided about
	// them (publishRoute) is decided again.
	changed atomic.Uint64
	// opening serialises opening each backend's link; the lock is held
	// while the link dials, never under mu.
	opening []sync.Mutex

	mu sync.Mutex // guards the fields below
	// byIndex holds the open links; nil where none is open.
	byIndex []*link
	// gens counts each backend's links; failedAt is when a link to it last
	// failed.
	gens     []uint64
	failedAt []time.Time
	// sealed is set once the connection ends: no link opens after.
	sealed bool
}

func newLinkSet(names []string, m Mirror) linkSet {
	n := len(names)
	return linkSet{
		names:    names,
		mirror:   m,
		opening:  make([]sync.Mutex, n),
		byIndex:  make([]*link, n),
		gens:     make([]uint64, n),
		failedAt: make([]time.Time, n),
	}
}

// begin takes the link the handshake opened as the first and home link,
// and failedAt, when not nil, as the failures of the backends tried before
// it (by backend index).
func (s *linkSet) begin(home *link, failedAt []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.first = home.sock
	if failedAt != nil {
		copy(s.failedAt, failedAt)
	}
	s.byIndex[home.idx] = home
	s.gens[home.idx] = 1
	s.setHome(home)
}

// seal ends the set's openings: once the connection ends, no link opens.
func (s *linkSet) seal() {
	s.mu.Lock()
	s.sealed = true
	s.mu.Unlock()
}

// len is the number of backends, open or not.
func (s *linkSet) len() int { return len(s.byIndex) }

// at returns the open link to backend i, nil when none is open.
func (s *linkSet) at(i int) *link {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byIndex[i]
}

// live returns the links that are open now.
func (s *linkSet) live() []*link {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*link, 0, len(s.byIndex))
	for _, l := range s.byIndex {
		if l != nil {
			out = append(out, l)
		}
	}
	return out
}

// snapshot returns the links by backend index, nil where none is open.
func (s *linkSet) snapshot() []*link {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*link(nil), s.byIndex...)
}

// liveNames returns the names of the backends with an open link.
func (s *linkSet) liveNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for _, l := range s.byIndex {
		if l != nil {
			names = append(names, l.name)
		}
	}
	return names
}

// generations returns the generation of each backend's open link, by
// backend index; 0 where none is open.
func (s *linkSet) generations() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	gens := make([]uint64, len(s.byIndex))
	for i, l := range s.byIndex {
		if l != nil {
			gens[i] = l.gen
		}
	}
	return gens
}

// openOn returns the links client channel ch is open on, in backend order,
// in ch.reachable's buffer (the client loop's scratch).
func (s *linkSet) openOn(ch *channelState) []*link {
	out := ch.reachable[:0]
	for i := range s.byIndex {
		if l := s.at(i); l != nil && l.channelOpen(ch.id) {
			out = append(out, l)
		}
	}
	ch.reachable = out
	return out
}

// changes counts the links opened and lost so far.
func (s *linkSet) changes() uint64 { return s.changed.Load() }

// home returns the home link; nil before the connection serves.
func (s *linkSet) home() *link { return s.homeLink.Load() }

// homeOnly is the home link as a target list.
func (s *linkSet) homeOnly() []*link {
	if l := s.homeList.Load(); l != nil {
		return *l
	}
	return nil
}

// setHome makes l the home link.
func (s *linkSet) setHome(l *link) {
	s.homeLink.Store(l)
	targets := []*link{l}
	s.homeList.Store(&targets)
}

// flush sends what the client loop queued on every link.
func (s *linkSet) flush() {
	if len(s.byIndex) == 1 {
		s.first.Flush()
		return
	}
	for i := range s.byIndex {
		if l := s.at(i); l != nil {
			l.sock.Flush()
		}
	}
}

// ensure returns the link to backend i, opening one when the set has none
// (or lost it): dial connects and logs in, and run starts the new link's
// read loop. The set calls run under its lock, before any other goroutine
// sees the link, so that a loop starts before teardown seals the set (and
// is waited for) or not at all. Any goroutine may call ensure; one opens a
// given backend's link at a time.
func (s *linkSet) ensure(i int, dial func(i int) (*wire.Socket, error), run func(*link)) (*link, error) {
	if l := s.at(i); l != nil {
		return l, nil
	}
	s.opening[i].Lock()
	defer s.opening[i].Unlock()
	if l := s.at(i); l != nil {
		return l, nil
	}
	s.mu.Lock()
	failedAt := s.failedAt[i]
	s.mu.Unlock()
	if !failedAt.IsZero() && time.Since(failedAt) < linkRetryPause {
		return nil, fmt.Errorf("backend %s: unreachable a moment ago", s.names[i])
	}
	if s.mirror != nil && s.mirror.BackendDown(s.names[i]) {
		// Not even dialled: a frozen or starting broker accepts TCP and
		// then says nothing, and the client's frames would wait for it.
		return nil, fmt.Errorf("backend %s: counted down", s.names[i])
	}
	sock, err := dial(i)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.failedAt[i] = time.Now()
		return nil, err
	}
	s.gens[i]++
	if s.sealed {
		sock.Conn().Close()
		return nil, errors.New("connection closing")
	}
	l := newLink(i, s.names[i], s.gens[i], sock)
	s.byIndex[i] = l
	s.changed.Add(1)
	run(l)
	return l, nil
}

// linkRetryPause is how long a backend that refused a link is not tried
// again for the same connection, so that a dead backend costs a publish one
// dial, not one per message.
const linkRetryPause = time.Second

// drop takes a lost link out of the set, and reports false when the set
// no longer held it (another goroutine dropped it).
func (s *linkSet) drop(l *link) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byIndex[l.idx] != l {
		return false
	}
	s.byIndex[l.idx] = nil
	s.failedAt[l.idx] = time.Now()
	s.changed.Add(1)
	return true
}

// rehome replaces a lost home link by another backend's link, one already
// open if there is one (else opened with dial and run, as by ensure), and
// reports whether the set has a home other than lost. next is the link
// this call made home; nil when another goroutine did it. Channel 0, the
// client's connection.close and whatever has no place of its own go there
// from then on; the client's channels open on it when they need it.
func (s *linkSet) rehome(lost *link, dial func(i int) (*wire.Socket, error), run func(*link)) (next *link, ok bool) {
	if s.home() != lost {
		return nil, true
	}
	for i := range s.byIndex {
		if l := s.at(i); l != nil && l != lost {
			next = l
			break
		}
	}
	for i := 0; next == nil && i < len(s.byIndex); i++ {
		if i == lost.idx {
			continue
		}
		if l, err := s.ensure(i, dial, run); err == nil {
			next = l
		}
	}
	if next == nil {
		return nil, false
	}
	if !s.homeLink.CompareAndSwap(lost, next) {
		return nil, true
	}
	targets := []*link{next}
	s.homeList.Store(&targets)
	return next, true
}
