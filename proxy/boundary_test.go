package proxy

import (
	"slices"
	"sync"
	"testing"
)

// TestAtBoundary: a link loop's write on a channel runs at once when the
// client loop is idle; it waits while the client loop holds sendMu and runs
// when it lets go; it waits while the channel is between a publish's
// frames, and so does every later write on that channel, in order, while
// other channels' writes go on.
func TestAtBoundary(t *testing.T) {
	c := &clientConn{}
	a, b := newChannelState(1), newChannelState(2)
	var ran []string
	record := func(name string) func() { return func() { ran = append(ran, name) } }
	check := func(step string, want ...string) {
		t.Helper()
		if !slices.Equal(ran, want) {
			t.Errorf("%s: ran %q, want %q", step, ran, want)
		}
	}

	c.atBoundary(a, record("a1"))
	check("client loop idle", "a1")

	c.sendMu.Lock() // the client loop handles a frame
	c.atBoundary(b, record("b1"))
	check("client loop busy", "a1")
	c.unlockSend()
	check("client loop done with its frame", "a1", "b1")

	c.sendMu.Lock()
	a.publisher.current.inContent = true // a publish's method went out, its content not yet
	c.sendMu.Unlock()
	c.atBoundary(a, record("a2"))
	c.atBoundary(b, record("b2"))
	c.atBoundary(a, record("a3"))
	check("channel a in content", "a1", "b1", "b2")
	c.sendMu.Lock()
	c.runBoundaryLocked() // after a content frame that did not end it
	check("channel a still in content", "a1", "b1", "b2")
	a.publisher.current.inContent = false // the last content frame
	c.runBoundaryLocked()
	c.unlockSend()
	check("channel a's content ended", "a1", "b1", "b2", "a2", "a3")
	if n := c.boundary.waiting.Load(); n != 0 {
		t.Errorf("waiting work: got %d, want 0", n)
	}
}

// TestAtBoundaryConcurrent: work queued from many goroutines while the
// client loop takes and releases sendMu all runs, none twice, without the
// client loop's next frame.
func TestAtBoundaryConcurrent(t *testing.T) {
	c := &clientConn{}
	ch := newChannelState(1)
	const writers, each = 4, 500
	var mu sync.Mutex
	ran := 0
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				c.atBoundary(ch, func() { mu.Lock(); ran++; mu.Unlock() })
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
			c.sendMu.Lock()
			c.runBoundaryLocked()
			c.unlockSend()
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
