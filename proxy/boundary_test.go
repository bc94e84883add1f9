package proxy

import (
	"slices"
	"sync"
	"testing"
)

// TestAtBoundary: a link loop's write on a channel runs at once when the
// client loop is idle; it waits while the client loop holds the gate and runs
// when it lets go; it waits while the channel is between a publish's
// frames, and so does every later write on that channel, in order, while
// other channels' writes go on.
func TestAtBoundary(t *testing.T) {
	g := &sendGate{}
	a, b := newChannelState(1), newChannelState(2)
	var ran []string
	record := func(name string) func() { return func() { ran = append(ran, name) } }
	check := func(step string, want ...string) {
		t.Helper()
		if !slices.Equal(ran, want) {
			t.Errorf("%s: ran %q, want %q", step, ran, want)
		}
	}

	g.atBoundary(a, record("a1"))
	check("client loop idle", "a1")

	g.lock() // the client loop handles a frame
	g.atBoundary(b, record("b1"))
	check("client loop busy", "a1")
	g.unlock()
	check("client loop done with its frame", "a1", "b1")

	g.lock()
	a.publisher.current.inContent = true // a publish's method went out, its content not yet
	g.mu.Unlock()
	g.atBoundary(a, record("a2"))
	g.atBoundary(b, record("b2"))
	g.atBoundary(a, record("a3"))
	check("channel a in content", "a1", "b1", "b2")
	g.lock()
	g.runWaitingLocked() // after a content frame that did not end it
	check("channel a still in content", "a1", "b1", "b2")
	a.publisher.current.inContent = false // the last content frame
	g.runWaitingLocked()
	g.unlock()
	check("channel a's content ended", "a1", "b1", "b2", "a2", "a3")
	if n := g.waiting.Load(); n != 0 {
		t.Errorf("waiting work: got %d, want 0", n)
	}
}

// TestAtBoundaryConcurrent: work queued from many goroutines while the
// client loop takes and releases the gate all runs, none twice, without the
// client loop's next frame.
func TestAtBoundaryConcurrent(t *testing.T) {
	g := &sendGate{}
	ch := newChannelState(1)
	const writers, each = 4, 500
	var mu sync.Mutex
	ran := 0
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				g.atBoundary(ch, func() { mu.Lock(); ran++; mu.Unlock() })
			}
		})
	}
	stop := make(chan struct{})
	clientLoop := make(chan struct{})
	go func() {
		defer close(clientLoop)
		for {
			select {
			case <-stop:
				return
			default:
			}
			g.lock()
			g.runWaitingLocked()
			g.unlock()
		}
	}()
	wg.Wait()
	close(stop)
	<-clientLoop
	mu.Lock()
	defer mu.Unlock()
	if ran != writers*each {
		t.Errorf("work run: got %d, want %d", ran, writers*each)
	}
}
