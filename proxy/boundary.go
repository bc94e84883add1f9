package proxy

import (
	"sync"
	"sync/atomic"
)

// A publish's method and content frames reach a link one after the other,
// and a broker takes no other frame on that channel between them: a method
// there is 505 UNEXPECTED_FRAME, which closes the whole backend connection.
// The client loop writes them, so it never splits a publish; but with
// mirroring a link's read loop sometimes writes on a channel too, when one
// link closed the channel: the proxy's channel.close to the channel's other
// links, and the close-ok of a close that crossed it. Those writes go
// through atBoundary. They run under the gate's lock, so the client loop is
// not in the middle of a frame, and only when the channel is not between a
// publish's frames; otherwise they wait, and the client loop runs them
// after the frame that ends the content, before it handles the next one.
//
// Whoever holds the lock runs the waiting work when it lets go of it
// (unlock), so work queued while the lock was taken never waits for the
// client's next frame.

// sendGate is what a connection's goroutines pass through to write on its
// links without splitting a publish: the lock the client loop holds while
// it handles a frame, and the work waiting for a message boundary. The
// connection holds it by value.
//
// The client loop takes the lock for every frame (lock, runWaitingLocked,
// unlock). The failover of consumers takes it to write to links for the
// client (lock, or tryLock from the server's watcher); whoever holds it
// may read whether a channel is in a publish's content
// (publisher.inContent). The link loops queue their writes on a channel
// (atBoundary), which run under the lock. workMu guards work and nothing
// is taken under it; waiting and added are atomics that change under it.
type sendGate struct {
	mu      sync.Mutex    // held by whoever writes on the links for the client
	waiting atomic.Int32  // len(work), read without workMu on every client frame
	added   atomic.Uint64 // counts work queued, to notice work added meanwhile
	workMu  sync.Mutex    // guards work; nothing is taken under it
	work    []boundaryWork
}

// boundaryWork is a write on a channel's links that waits for a boundary;
// per channel, the work runs in the order it came.
type boundaryWork struct {
	ch  *channelState
	run func()
}

// lock takes the gate: the caller is between frames on every channel but
// those in a publish's content.
func (g *sendGate) lock() { g.mu.Lock() }

// tryLock takes the gate if it is free.
func (g *sendGate) tryLock() bool { return g.mu.TryLock() }

// unlock releases the gate and runs the work queued meanwhile.
func (g *sendGate) unlock() {
	g.mu.Unlock()
	g.runWaiting()
}

// atBoundary runs run once the client loop is at a message boundary on ch:
// at once when the gate is free and ch is not in a publish's content, or
// else by the holder of the gate.
func (g *sendGate) atBoundary(ch *channelState, run func()) {
	g.workMu.Lock()
	g.work = append(g.work, boundaryWork{ch: ch, run: run})
	g.waiting.Store(int32(len(g.work)))
	g.added.Add(1)
	g.workMu.Unlock()
	g.runWaiting()
}

// runWaiting runs the waiting work if the gate is free. When it is not,
// its holder runs the work in unlock; work added while this goroutine
// held the gate is run in the next round.
func (g *sendGate) runWaiting() {
	for {
		seen := g.added.Load()
		if g.waiting.Load() == 0 || !g.mu.TryLock() {
			return
		}
		g.runWaitingLocked()
		g.mu.Unlock()
		if g.added.Load() == seen {
			// Nothing came while the gate was held: what still waits is
			// in a publish's content, and the client loop runs it.
			return
		}
	}
}

// runWaitingLocked runs the waiting work of every channel that is not in
// a publish's content. The caller holds the gate.
func (g *sendGate) runWaitingLocked() {
	if g.waiting.Load() == 0 {
		return
	}
	g.workMu.Lock()
	work := g.work
	g.work = nil
	g.workMu.Unlock()
	var kept []boundaryWork
	for _, w := range work {
		if w.ch.publisher.inContent() || waitsFor(kept, w.ch) {
			kept = append(kept, w)
			continue
		}
		w.run()
	}
	g.workMu.Lock()
	g.work = append(kept, g.work...)
	g.waiting.Store(int32(len(g.work)))
	g.workMu.Unlock()
}

// waitsFor reports whether work holds work of ch, which the next of ch's
// must follow.
func waitsFor(work []boundaryWork, ch *channelState) bool {
	for _, w := range work {
		if w.ch == ch {
			return true
		}
	}
	return false
}
