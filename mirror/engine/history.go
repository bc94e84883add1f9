package engine

import (
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// historySize is how many promotions the engine remembers for the status
// page: enough for the failovers of a broker's loss in a small install,
// and a bounded amount of memory in a large one.
const historySize = 50

// history is the last promotions this proxy wrote to the metadata log,
// newest last, in a ring of historySize. It is kept in memory only: a
// restart forgets it, and in a sidecar cluster each proxy remembers those
// it wrote. Its lock is taken alone.
type history struct {
	node string // this proxy's node, for Failover.Node

	mu    sync.Mutex
	ring  [historySize]mirror.Failover
	next  int // where the next promotion goes
	count int // how many of ring hold one
}

// promoted records a promotion written at now of a master whose loss was
// detected at detected.
func (h *history) promoted(id mirror.QueueID, p mirror.Promotion, cause mirror.Cause, epoch uint64, detected, now time.Time) {
	if detected.IsZero() || detected.After(now) {
		detected = now
	}
	f := mirror.Failover{
		Queue: id, From: p.From, To: p.To, Cause: cause.String(), Epoch: epoch, Synchronised: p.Synchronised,
		DetectedAt: detected, PromotedAt: now, Duration: now.Sub(detected), Node: h.node,
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ring[h.next] = f
	h.next = (h.next + 1) % historySize
	h.count = min(h.count+1, historySize)
}

// list returns the promotions remembered, newest first.
func (h *history) list() []mirror.Failover {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]mirror.Failover, 0, h.count)
	for i := 1; i <= h.count; i++ {
		out = append(out, h.ring[(h.next-i+historySize)%historySize])
	}
	return out
}

// Failovers returns the last promotions this proxy wrote to the metadata
// log after a master's backend was lost (at most historySize), newest
// first, for the admin status page. Promotions of ctl drain are not among
// them, nor those another proxy of a cluster wrote.
func (e *Engine) Failovers() []mirror.Failover { return e.history.list() }
