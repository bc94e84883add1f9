package engine

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// A sidecar proxy that stops running for a while (SIGSTOP, a paused VM, a
// host so starved that none of its goroutines ran) wakes with the metadata
// of before the stop, while serf may have declared it failed meanwhile and
// the other proxies moved its broker's masters away. Until its log has
// caught up with the leader, two things it acts on are stale:
//
//   - deliveries its links read: its broker's deposed masters went on
//     sending to its consumers, messages acked through another proxy
//     since, which would reach clients again without redelivered;
//   - its own probes' verdicts: the brokers closed its connections when
//     it went silent, which looks like their failure, and a promotion
//     away from a live broker would follow.
//
// stallGuard notices such a stop: a ticker records when it last ran, and a
// gap longer than stallThreshold between ticks is a stall, whichever
// goroutine sees it first (after SIGCONT a link's read loop may run before
// the ticker does). It then holds the proxy's deliveries (Engine.Current,
// AwaitCurrent) until the metadata log has applied what the leader had
// applied when asked, and failover leaves promotions to the other proxies
// for ResumeSettle after that, as after a pause in a minority.
//
// A proxy cut off from the other proxies is in the same place without
// stopping: the majority promotes its broker's masters away about a second
// after the cut (serf's verdict and half a second more), while its own
// raft follower notices the lost leader only after one to two election
// timeouts, and pause_minority closes its clients only then. So the guard
// also holds deliveries while the log's leader has not been heard from for
// leaderContactLimit, well before the majority's promotion, until the log
// has caught up again; no settle window follows, since nothing stood still.

const (
	// stallTick is how often the guard's ticker records that it ran.
	stallTick = 50 * time.Millisecond
	// stallThreshold is the gap between ticks that counts as a stall:
	// below serf's quickest verdict on a silent proxy (a probe timeout
	// and the suspicion timeout, about half a second; see "Failure
	// detection" in mirror/cluster), so that no stall long enough for the
	// others to act goes unnoticed. A false alarm on a starved host costs
	// one round trip to the leader.
	stallThreshold = 300 * time.Millisecond
	// stallCatchUpTimeout bounds one attempt to catch up; the guard tries
	// again until one succeeds.
	stallCatchUpTimeout = 5 * time.Second
	// leaderContactLimit is how long a follower may go without hearing
	// from the leader before its metadata counts as stale: eight of
	// raft's heartbeats (ElectionTimeout/10), and below the majority's
	// quickest promotion after a cut (about 1.1 s).
	leaderContactLimit = 400 * time.Millisecond
)

// stallGuard is safe for concurrent use. A nil *stallGuard never stalls:
// a proxy alone has nobody to move masters while it stands still.
type stallGuard struct {
	// catchUp returns once the metadata this proxy serves from shows
	// what the leader had applied when asked.
	catchUp func(ctx context.Context) error
	// inContact reports whether the log's leader was heard from within
	// the given time (store.Store.InContact); nil never loses contact.
	inContact func(within time.Duration) bool
	log       *slog.Logger
	// origin is the guard's monotonic clock origin; lastTick and
	// caughtUpAt count nanoseconds from it.
	origin   time.Time
	lastTick atomic.Int64
	// stale is set from a stall until the log caught up after it.
	stale      atomic.Bool
	caughtUpAt atomic.Int64
	// wake (capacity one) tells the catch-up goroutine of a stall.
	wake chan struct{}

	mu sync.Mutex
	// stalls counts the stalls seen: a catch-up clears stale only when no
	// stall was seen after it began.
	stalls uint64
	// stoodStill is set when the stale metadata being caught up includes
	// a stall, not only a lost contact: the settle window follows then.
	stoodStill bool
	// fresh is closed when stale clears; nil while not stale.
	fresh chan struct{}
}

func newStallGuard(catchUp func(ctx context.Context) error, inContact func(time.Duration) bool, log *slog.Logger) *stallGuard {
	return &stallGuard{catchUp: catchUp, inContact: inContact, log: log, origin: time.Now(), wake: make(chan struct{}, 1)}
}

// now is the time on the guard's clock.
func (g *stallGuard) now() int64 { return int64(time.Since(g.origin)) }

// current reports, without blocking, whether the metadata is known
// current: no stall is being caught up and the ticker ran lately. It is
// on the delivery path.
func (g *stallGuard) current() bool {
	if g == nil {
		return true
	}
	return !g.stale.Load() && g.now()-g.lastTick.Load() <= int64(stallThreshold)
}

// await returns once the metadata is current (at once when it is), or
// with ctx's error.
func (g *stallGuard) await(ctx context.Context) error {
	if g.current() {
		return nil
	}
	fresh := g.stalled()
	select {
	case <-fresh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settling reports whether a stall is under way or was caught up less
// than window ago.
func (g *stallGuard) settling(window time.Duration) bool {
	if g == nil {
		return false
	}
	if !g.current() {
		return true
	}
	at := g.caughtUpAt.Load()
	return at != 0 && g.now()-at < int64(window)
}

// stalled records a stall, unless it is one being caught up already
// (stale, and the ticker ran lately), and returns the channel closed once
// the log has caught up after it.
func (g *stallGuard) stalled() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := g.now(); g.fresh == nil || now-g.lastTick.Load() > int64(stallThreshold) {
		g.stalls++
		g.stoodStill = true
		// The gap is counted: the ticker, when it runs, must not count
		// it again and void the catch-up under way.
		g.lastTick.Store(now)
	}
	if g.fresh == nil {
		g.fresh = make(chan struct{})
		g.stale.Store(true)
	}
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return g.fresh
}

// lostContact marks the metadata stale for a lost contact with the
// leader, and reports whether that begins a new stale spell.
func (g *stallGuard) lostContact() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fresh != nil {
		return false
	}
	g.fresh = make(chan struct{})
	g.stale.Store(true)
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return true
}

// run ticks and catches up after stalls and lost contacts until ctx
// ends.
func (g *stallGuard) run(ctx context.Context) {
	g.lastTick.Store(g.now())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.catchUpAfterStalls(ctx)
	}()
	t := time.NewTicker(stallTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			<-done
			return
		case <-t.C:
		}
		now := g.now()
		if gap := now - g.lastTick.Load(); gap > int64(stallThreshold) {
			g.log.Warn("this proxy stood still; holding mirrored deliveries and promotions until its metadata log has caught up with the leader",
				"stalled", time.Duration(gap).Round(time.Millisecond))
			g.stalled()
		}
		g.lastTick.Store(now)
		if g.inContact != nil && !g.stale.Load() && !g.inContact(leaderContactLimit) && g.lostContact() {
			g.log.Warn("this proxy has not heard from the metadata log's leader lately; holding mirrored deliveries until its log has caught up with the leader",
				"limit", leaderContactLimit)
		}
	}
}

// catchUpAfterStalls catches up after each stall: it clears stale only
// after a catch-up during which no further stall was seen.
func (g *stallGuard) catchUpAfterStalls(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.wake:
		}
		for attempt := 1; ; attempt++ {
			g.mu.Lock()
			if g.fresh == nil {
				g.mu.Unlock()
				break
			}
			seen := g.stalls
			g.mu.Unlock()
			began := time.Now()
			try, cancel := context.WithTimeout(ctx, stallCatchUpTimeout)
			err := g.catchUp(try)
			cancel()
			if ctx.Err() != nil {
				return
			}
			g.mu.Lock()
			if err == nil && g.stalls == seen {
				if g.stoodStill {
					g.caughtUpAt.Store(g.now())
				}
				g.stoodStill = false
				g.stale.Store(false)
				close(g.fresh)
				g.fresh = nil
				g.mu.Unlock()
				g.log.Info("metadata log caught up with the leader; serving deliveries again",
					"took", time.Since(began).Round(time.Millisecond), "attempts", attempt)
				break
			}
			g.mu.Unlock()
			if err != nil {
				g.log.Warn("metadata log not caught up with the leader yet; holding mirrored deliveries and trying again", "attempt", attempt, "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(stallTick):
				}
			}
		}
	}
}

// Current reports, without blocking, whether this proxy's metadata is
// known current: always for a proxy alone; in a cluster, unless it stood
// still lately or has not heard from the log's leader for
// leaderContactLimit, and its log has not caught up with the leader since.
// It is on the delivery path.
func (e *Engine) Current() bool { return e.stall.current() }

// AwaitCurrent returns once Current holds, or with ctx's error.
func (e *Engine) AwaitCurrent(ctx context.Context) error {
	if e.stall == nil {
		return nil
	}
	return e.stall.await(ctx)
}

// catchUp waits until this proxy has applied the metadata log as far as
// the leader had when asked, and Lookup shows it.
func (e *Engine) catchUp(ctx context.Context) error {
	if err := e.opts.Store.WaitLeader(ctx); err != nil {
		return err
	}
	e.view.rebuild()
	return nil
}
