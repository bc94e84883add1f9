package engine

import (
	"sync"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// missedCopies collects the proxy's reports of slave copies that may lack
// a publish (Missed) until the background loop handles them.
type missedCopies struct {
	mu sync.Mutex
	// byBackend holds, per backend, the queues reported; all is set for a
	// backend an exchange publish may have missed (any queue there).
	byBackend map[string]*missedOn
}

type missedOn struct {
	all    bool
	queues map[mirror.QueueID]bool
}

func (m *missedCopies) add(backend string, queue *mirror.QueueID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byBackend == nil {
		m.byBackend = make(map[string]*missedOn)
	}
	on := m.byBackend[backend]
	if on == nil {
		on = &missedOn{queues: make(map[mirror.QueueID]bool)}
		m.byBackend[backend] = on
	}
	if queue == nil {
		on.all = true
		return
	}
	on.queues[*queue] = true
}

// keep puts back a backend's reports that take returned, merged with any
// made since.
func (m *missedCopies) keep(backend string, on *missedOn) {
	if on.all {
		m.add(backend, nil)
	}
	for q := range on.queues {
		m.add(backend, &q)
	}
}

func (m *missedCopies) take() map[string]*missedOn {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.byBackend
	m.byBackend = nil
	return out
}

// Missed records that the slave copy on backend of queue (of every queue
// with a slave there, when queue is nil) may lack a publish: the backend
// nacked it, a client's link to it broke before the backend confirmed it,
// or the proxy did not send it there because it counted the backend down.
// The background loop makes such a slave unsynchronised. It does not
// block: the proxy calls it from a link's read loop.
func (e *Engine) Missed(backend string, queue *mirror.QueueID) {
	e.reconciler.missed.add(backend, queue)
	e.poke()
}

// Holds reports whether the metadata counts backend as the master or a
// synchronised slave of queue, or with queue nil of any queue that has
// slaves (a queue alone on its backend has nothing the metadata could
// record about its loss). The proxy keeps a publish whose copy there was
// lost waiting until it does not: confirms never count fewer copies than
// the log, which a proxy cut off from the majority cannot change.
func (e *Engine) Holds(backend string, queue *mirror.QueueID) bool {
	holds := func(m mirror.QueueMeta) bool {
		if len(m.Slaves) == 0 {
			return false
		}
		if m.Master == backend {
			return true
		}
		i := m.SlaveIndex(backend)
		return i >= 0 && m.Slaves[i].Synchronised
	}
	if queue != nil {
		m, ok := e.Lookup(*queue)
		return ok && holds(m)
	}
	return e.view.anyQueue(holds)
}
