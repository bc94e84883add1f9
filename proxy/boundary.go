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
// through atBoundary. They run under sendMu, so the client loop is not in
// the middle of a frame, and only when the channel is not between a
// publish's frames; otherwise they wait, and the client loop runs them
// after the frame that ends the content, before it handles the next one.
//
// Whoever holds sendMu runs the waiting work when it lets go of it
// (unlockSend), so work queued while the lock was taken never waits for the
// client's next frame.

// boundaryWork is a write on a channel's links that waits for a boundary.
type boundaryWork struct {
	ch  *channelState
	run func()
}

// boundaryQueue is a connection's work waiting for a boundary; per channel,
// it runs in the order it came.
type boundaryQueue struct {
	waiting atomic.Int32  // len(work), read without mu on every client frame
	added   atomic.Uint64 // counts work queued, to notice work added meanwhile
	mu      sync.Mutex    // guards work; nothing is taken under it
	work    []boundaryWork
}

// atBoundary runs run once the client loop is at a message boundary on ch:
// at once when sendMu is free and ch is not in a publish's content, or
// else by the holder of sendMu.
func (c *clientConn) atBoundary(ch *channelState, run func()) {
	q := &c.boundary
	q.mu.Lock()
	q.work = append(q.work, boundaryWork{ch: ch, run: run})
	q.waiting.Store(int32(len(q.work)))
	q.added.Add(1)
	q.mu.Unlock()
	c.runAtBoundary()
}

// unlockSend releases sendMu and runs the work queued meanwhile.
func (c *clientConn) unlockSend() {
	c.sendMu.Unlock()
	c.runAtBoundary()
}

// runAtBoundary runs the waiting work if sendMu is free. When it is not,
// its holder runs the work in unlockSend; work added while this goroutine
// held the lock is run in the next round.
func (c *clientConn) runAtBoundary() {
	q := &c.boundary
	for {
		seen := q.added.Load()
		if q.waiting.Load() == 0 || !c.sendMu.TryLock() {
			return
		}
		c.runBoundaryLocked()
		c.sendMu.Unlock()
		if q.added.Load() == seen {
			// Nothing came while the lock was held: what still waits is
			// in a publish's content, and the client loop runs it.
			return
		}
	}
}

// runBoundaryLocked runs the waiting work of every channel that is not in
// a publish's content. The caller holds sendMu.
func (c *clientConn) runBoundaryLocked() {
	q := &c.boundary
	if q.waiting.Load() == 0 {
		return
	}
	q.mu.Lock()
	work := q.work
	q.work = nil
	q.mu.Unlock()
	var kept []boundaryWork
	for _, w := range work {
		if w.ch.publisher.inContent() || waitsFor(kept, w.ch) {
			kept = append(kept, w)
			continue
		}
		w.run()
	}
	q.mu.Lock()
	q.work = append(kept, q.work...)
	q.waiting.Store(int32(len(q.work)))
	q.mu.Unlock()
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
