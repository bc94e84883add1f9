package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// startStallGuard runs a guard whose catch-up is catchUp until the test
// ends.
func startStallGuard(t *testing.T, catchUp func(context.Context) error) *stallGuard {
	t.Helper()
	return startStallGuardWith(t, catchUp, nil)
}

// startStallGuardWith is startStallGuard with a contact to the leader.
func startStallGuardWith(t *testing.T, catchUp func(context.Context) error, inContact func(time.Duration) bool) *stallGuard {
	t.Helper()
	g := newStallGuard(catchUp, inContact, quietLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	for g.lastTick.Load() == 0 { // run has not started its clock yet
		time.Sleep(time.Millisecond)
	}
	return g
}

// standStill makes g see a stall as it would after SIGSTOP and SIGCONT:
// its ticker last ran a second ago.
func standStill(g *stallGuard) { g.lastTick.Store(g.now() - int64(time.Second)) }

// stallsSeen is how many stalls g has counted.
func stallsSeen(g *stallGuard) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stalls
}

// awaitWithin calls g.await and fails the test unless it returns nil
// within d.
func awaitWithin(t *testing.T, g *stallGuard, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := g.await(ctx); err != nil {
		t.Fatalf("await after the stall: %v; want the catch-up within %v", err, d)
	}
}

// TestStallGuardHoldsUntilCaughtUp: the metadata counts current until the
// guard's ticker misses its beat by more than stallThreshold; then it is
// not, await holds until a catch-up returned, and promotions are left to
// the other proxies for the settle window after it.
func TestStallGuardHoldsUntilCaughtUp(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	g := startStallGuard(t, func(ctx context.Context) error {
		calls.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if !g.current() {
		t.Fatal("current() = false before any stall")
	}
	if g.settling(time.Minute) {
		t.Fatal("settling = true before any stall")
	}

	standStill(g)
	if g.current() {
		t.Fatal("current() = true right after a one-second gap in the ticker")
	}
	held := make(chan error, 1)
	go func() { held <- g.await(context.Background()) }()
	select {
	case err := <-held:
		t.Fatalf("await returned (%v) before the catch-up did", err)
	case <-time.After(3 * stallTick):
	}
	if !g.settling(time.Minute) {
		t.Error("settling = false during the catch-up")
	}
	close(release)
	select {
	case err := <-held:
		if err != nil {
			t.Fatalf("await: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("await still held 10s after the catch-up returned")
	}
	if !g.current() {
		t.Error("current() = false after the catch-up")
	}
	if !g.settling(time.Minute) {
		t.Error("settling(1m) = false right after the catch-up; want promotions left to the others for the window")
	}
	if g.settling(0) {
		t.Error("settling(0) = true after the catch-up")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d catch-ups for one stall, want 1", n)
	}
}

// TestStallGuardRetriesAFailedCatchUp: a catch-up that fails (no leader
// yet, or one that cannot be asked) is tried again until one succeeds.
func TestStallGuardRetriesAFailedCatchUp(t *testing.T) {
	var calls atomic.Int32
	g := startStallGuard(t, func(context.Context) error {
		if calls.Add(1) < 3 {
			return errors.New("no leader known among the members")
		}
		return nil
	})
	standStill(g)
	awaitWithin(t, g, 10*time.Second)
	if n := calls.Load(); n != 3 {
		t.Errorf("%d catch-ups, want 3 (two failed)", n)
	}
}

// TestStallGuardStallDuringCatchUp: a stall seen while a catch-up runs
// makes that catch-up's answer stale too: the guard catches up again.
func TestStallGuardStallDuringCatchUp(t *testing.T) {
	var calls atomic.Int32
	var g *stallGuard
	g = startStallGuard(t, func(ctx context.Context) error {
		if calls.Add(1) == 1 {
			// The first catch-up stands still, and returns once the
			// guard's ticker has seen it do so.
			before := stallsSeen(g)
			standStill(g)
			for stallsSeen(g) == before && ctx.Err() == nil {
				time.Sleep(stallTick / 4)
			}
		}
		return nil
	})
	standStill(g)
	awaitWithin(t, g, 10*time.Second)
	if n := calls.Load(); n != 2 {
		t.Errorf("%d catch-ups, want 2: the stall during the first must void it", n)
	}
}

// TestStallGuardAwaitEnds: await returns with the context's error when no
// catch-up succeeds in time.
func TestStallGuardAwaitEnds(t *testing.T) {
	g := startStallGuard(t, func(context.Context) error { return errors.New("no leader") })
	standStill(g)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := g.await(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("await = %v, want context.DeadlineExceeded", err)
	}
}

// TestStallGuardNil: a proxy alone has no guard, and its metadata is
// always current.
func TestStallGuardNil(t *testing.T) {
	var g *stallGuard
	if !g.current() || g.settling(time.Minute) {
		t.Error("a nil guard is not current, or settling")
	}
	if err := g.await(context.Background()); err != nil {
		t.Errorf("await on a nil guard: %v", err)
	}
}

// TestStallGuardHoldsWhileOutOfContact: a proxy that has not heard from the
// log's leader for leaderContactLimit holds its deliveries until a catch-up
// succeeds, which needs the leader; no settle window follows, since the
// proxy never stood still.
func TestStallGuardHoldsWhileOutOfContact(t *testing.T) {
	var contact atomic.Bool
	contact.Store(true)
	var calls atomic.Int32
	g := startStallGuardWith(t, func(context.Context) error {
		calls.Add(1)
		if !contact.Load() {
			return errors.New("no leader known among the members")
		}
		return nil
	}, func(time.Duration) bool { return contact.Load() })
	time.Sleep(3 * stallTick)
	if !g.current() || calls.Load() != 0 {
		t.Fatalf("current() = %v after %d catch-ups while in contact; want true, none", g.current(), calls.Load())
	}

	contact.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for g.current() {
		if time.Now().After(deadline) {
			t.Fatal("current() still true 10s after the contact with the leader was lost")
		}
		time.Sleep(stallTick / 2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*stallTick)
	defer cancel()
	if err := g.await(ctx); err == nil {
		t.Fatal("await returned while the leader is out of contact; want it to hold")
	}

	contact.Store(true)
	awaitWithin(t, g, 10*time.Second)
	if n := calls.Load(); n < 2 {
		t.Errorf("%d catch-ups, want at least 2 (one failed out of contact)", n)
	}
	if g.settling(time.Minute) {
		t.Error("settling(1m) = true after a lost contact was caught up; want no settle window")
	}
}
