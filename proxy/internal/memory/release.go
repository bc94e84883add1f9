// Package memory gives memory back to the operating system after a storm
// of connections has ended (Releaser).
package memory

import (
	"runtime/debug"
	"sync"
	"time"
)

// Releaser gives memory back to the operating system after a storm of
// connections has ended. What a connection holds while it is open is mostly
// its goroutines' stacks; when thousands close at once, that memory is free
// inside the Go runtime but stays resident: the runtime finds it free only at
// its next collection, which nothing triggers while the proxy is quiet (the
// periodic one comes every two minutes), and then returns it to the kernel
// at a paced 1 % of a core, which for a few hundred MiB takes minutes. So,
// once the open connections have fallen by at least releaseDrop and to at
// most half of their peak, and no further connection has ended for
// releaseQuiet, the releaser runs debug.FreeOSMemory (one collection and an
// immediate return of every free page) — at most once per releaseInterval,
// and never from a read loop. The connections that closed are its only
// trigger; steady traffic never causes one.
type Releaser struct {
	mu      sync.Mutex
	peak    int64     // most connections open since the last release
	armed   bool      // a timer will call run
	due     time.Time // when the release may run: the storm's end, and the interval
	lastRun time.Time
	stopped bool

	release  func() // debug.FreeOSMemory; tests count calls instead
	drop     int64
	quiet    time.Duration
	interval time.Duration
}

const (
	// releaseDrop is how many connections must have closed since the peak:
	// fewer free too little memory to be worth a collection.
	releaseDrop = 256
	// releaseQuiet is how long after the last connection ended the release
	// waits, so that one storm of closes costs one release.
	releaseQuiet = 2 * time.Second
	// releaseInterval is the least time between two releases.
	releaseInterval = 10 * time.Second
)

func NewReleaser() *Releaser {
	return &Releaser{release: debug.FreeOSMemory, drop: releaseDrop, quiet: releaseQuiet, interval: releaseInterval}
}

// Opened notes the number of open connections after one opened.
func (m *Releaser) Opened(open int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peak = max(m.peak, open)
}

// Closed notes the number of open connections after one ended, and arms the
// release when enough have gone.
func (m *Releaser) Closed(open int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peak = max(m.peak, open)
	if m.stopped || m.peak-open < m.drop || open > m.peak/2 {
		return
	}
	// Each close during the storm moves the release further out.
	m.due = time.Now().Add(m.quiet)
	if earliest := m.lastRun.Add(m.interval); earliest.After(m.due) {
		m.due = earliest
	}
	if !m.armed {
		m.armed = true
		time.AfterFunc(time.Until(m.due), m.run)
	}
}

func (m *Releaser) run() {
	m.mu.Lock()
	if m.stopped {
		m.armed = false
		m.mu.Unlock()
		return
	}
	if wait := time.Until(m.due); wait > 0 {
		time.AfterFunc(wait, m.run) // closes went on: wait for the storm's end
		m.mu.Unlock()
		return
	}
	m.armed = false
	m.mu.Unlock()

	m.release()

	m.mu.Lock()
	m.lastRun = time.Now()
	m.peak = 0 // the next peak is measured from here
	m.mu.Unlock()
}

// Stop cancels a pending release; the server calls it when it closes.
func (m *Releaser) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopped = true
}
