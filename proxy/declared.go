package proxy

import (
	"sync"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// declaredQueues are the queues a client connection declared on its home
// link that the metadata log does not record: exclusive queues and
// server-named ones, which the connection's router sends to the home link
// alone and records here (router.declared). The engine lists the log's
// queues; these are the rest of what RabbitMQ's list_queues shows, and
// only the connection knows them.
//
// An entry lasts while the link it was declared on does (an exclusive
// queue dies with its owner's connection to the broker), until the client
// deletes the queue, or until maxDeclared newer ones push it out. A queue
// the broker deleted by itself (auto-delete, x-expires) stays here; the
// engine leaves it out of the listing when its broker no longer has it.
type declaredQueues struct {
	mu     sync.Mutex // a leaf: nothing else is taken under it
	seq    uint64
	byName map[string]declaredQueue
}

type declaredQueue struct {
	link      *link // the home link it was declared on
	exclusive bool
	seq       uint64 // declaration order, to push out the oldest
}

// maxDeclared bounds a connection's memory of its unrecorded queues: a
// client that declares a temporary queue per request, which the broker
// auto-deletes, must not grow it without end.
const maxDeclared = 1024

// add remembers a queue declared on l.
func (d *declaredQueues) add(name string, l *link, exclusive bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byName == nil {
		d.byName = make(map[string]declaredQueue)
	}
	if _, known := d.byName[name]; !known && len(d.byName) >= maxDeclared {
		oldest, oldestSeq := "", d.seq+1
		for n, q := range d.byName {
			if q.seq < oldestSeq {
				oldest, oldestSeq = n, q.seq
			}
		}
		delete(d.byName, oldest)
	}
	d.seq++
	d.byName[name] = declaredQueue{link: l, exclusive: exclusive, seq: d.seq}
}

// forget drops a queue the client deleted.
func (d *declaredQueues) forget(name string) {
	d.mu.Lock()
	delete(d.byName, name)
	d.mu.Unlock()
}

// appendLive appends to out the queues declared on links that are still
// open (links is the connection's links by backend index).
func (d *declaredQueues) appendLive(vhost string, links []*link, out []mirror.UnrecordedQueue) []mirror.UnrecordedQueue {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, q := range d.byName {
		if links[q.link.idx] != q.link {
			continue
		}
		out = append(out, mirror.UnrecordedQueue{
			ID:        mirror.QueueID{VHost: vhost, Name: name},
			Backend:   q.link.name,
			Exclusive: q.exclusive,
		})
	}
	return out
}

// UnrecordedQueues returns the queues of vhost ("" for every vhost) that
// this proxy's clients declared and the metadata log does not record
// (declaredQueues), for list_queues.
func (s *Server) UnrecordedQueues(vhost string) []mirror.UnrecordedQueue {
	s.mu.Lock()
	conns := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	var out []mirror.UnrecordedQueue
	for _, c := range conns {
		// vhost is set by the handshake, before opened (under c.mu).
		if !c.isOpen() || vhost != "" && c.terms.vhost != vhost {
			continue
		}
		out = c.router.declared.appendLive(c.terms.vhost, c.links.snapshot(), out)
	}
	return out
}

// declaredAt returns, for a declare of a queue the log does not record
// sent to the home link l alone, what remembers the queue once l answers
// with its name; with no-wait it remembers the client's name at once and
// returns nil.
func (rt *router) declaredAt(l *link, q queueMethod, wantReply bool) func([]byte) []byte {
	if !wantReply {
		if q.queue != "" {
			rt.declared.add(q.queue, l, q.exclusive)
		}
		return nil
	}
	return func(reply []byte) []byte {
		var ok frames.QueueDeclareOk
		if isMethod(reply, frames.QueueDeclareOkKey) && decodeArgs(reply, &ok) == nil {
			rt.declared.add(ok.Queue, l, q.exclusive)
		}
		return reply
	}
}
