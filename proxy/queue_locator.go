package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// queueLocator finds where a client's queue lives and reaches its master
// for the router: from the metadata log, or from the backends for a queue
// the log does not record (locate); a queue's master, waiting out a
// promotion on its way (reachMaster, masterOf); and the answer a client
// gets for a queue whose master is down (masterDown). The router holds it
// by value.
//
// Who uses it: the client loop, through the router, for every queue
// method, consume, get and publish to the default exchange; and the
// consumerMover, which asks whether a promotion is still to come
// (promotionPending). Its fields but unrecorded are set once by
// clientConn.open under clientConn.mu, before the connection counts as
// open, and only read after; unrecorded belongs to the client loop and
// has no lock.
type queueLocator struct {
	mirror Mirror // nil without mirroring
	vhost  string
	links  *linkSet
	log    *slog.Logger
	ctx    context.Context // ends with the connection
	// reach opens the links to the named backends with the channel open
	// on each (router.reach); closeChannel closes a channel for a reason
	// the proxy found (clientConn.closeChannelByProxy).
	reach        func(ch *channelState, backends ...string) []*link
	closeChannel func(ch *channelState, code uint16, text string, classID, methodID uint16)
	// unrecorded remembers where exclusive queues of other connections
	// are (see locate).
	unrecorded map[string]mirror.QueueMeta
}

// locate returns where a queue lives: from the metadata log, or found on
// the backends (adopted). ok is false when no backend has it.
func (loc *queueLocator) locate(name string) (mirror.QueueMeta, bool) {
	if mirror.IsReplyTo(name) {
		// No backend holds it; a passive declare of it would count as found.
		return mirror.QueueMeta{}, false
	}
	id := mirror.QueueID{VHost: loc.vhost, Name: name}
	if m, ok := loc.mirror.Lookup(id); ok {
		return m, true
	}
	if m, ok := loc.unrecorded[name]; ok {
		return m, true
	}
	ctx, cancel := mirrorContext(loc.ctx)
	defer cancel()
	m, ok, err := loc.mirror.Resolve(ctx, id)
	if err != nil {
		loc.log.Warn("cannot locate queue", "queue", name, "err", err)
		return m, false
	}
	if ok && m.Version == 0 {
		// An exclusive queue of some connection: never recorded, and it
		// never moves, so this connection remembers where it is (an RPC
		// server publishes every reply to one).
		if loc.unrecorded == nil || len(loc.unrecorded) >= maxUnrecorded {
			loc.unrecorded = make(map[string]mirror.QueueMeta)
		}
		loc.unrecorded[name] = m
	}
	return m, ok
}

// maxUnrecorded bounds a connection's memory of exclusive queues.
const maxUnrecorded = 1024

// promotionWait bounds how long a request for a queue whose master was
// just lost waits for the promotion of a slave.
const promotionWait = 10 * time.Second

// reachMaster returns the link to meta's master with the channel open on
// it. When the master cannot be reached, is counted down, and a
// synchronised slave is live, a promotion is on its way: it waits for the
// metadata to name another master, at most promotionWait, as RabbitMQ's
// channel waits for a mirrored queue's new master instead of failing the
// request. It returns the metadata it ends with, and no link when the
// master stays unreachable.
func (loc *queueLocator) reachMaster(ch *channelState, meta mirror.QueueMeta) (mirror.QueueMeta, []*link) {
	// The link to a master's backend counted down a moment ago may still
	// be open (checkLinks drops it within masterCheckInterval), and a
	// request sent there is lost with it: with a promotion on its way, the
	// request waits for the new master instead.
	if m := loc.mirror; m == nil || !m.BackendDown(meta.Master) || !loc.promotionPending(meta) {
		if master := loc.reach(ch, meta.Master); len(master) > 0 || !loc.promotionPending(meta) {
			return meta, master
		}
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(promotionWait)
	for {
		select {
		case <-loc.ctx.Done():
			return meta, nil
		case <-deadline:
			return meta, nil
		case <-tick.C:
		}
		now, ok := loc.mirror.Lookup(meta.ID)
		if !ok {
			return meta, nil
		}
		// A new master, or the old one not (or no longer) counted down:
		// one more try. A backend counted down is not dialled again.
		if now.Master != meta.Master || !loc.mirror.BackendDown(now.Master) {
			return now, loc.reach(ch, now.Master)
		}
	}
}

// promotionPending reports whether a synchronised slave of meta is live,
// which the engine promotes when it counts the master down.
func (loc *queueLocator) promotionPending(meta mirror.QueueMeta) bool {
	m := loc.mirror
	if m == nil {
		return false
	}
	for _, s := range meta.Slaves {
		if s.Synchronised && !m.BackendDown(s.Backend) {
			return true
		}
	}
	return false
}

// masterDown answers a request for a queue whose master cannot be reached
// (its broker is down and no slave was promoted) as RabbitMQ answers for a
// queue whose node is down.
func (loc *queueLocator) masterDown(ch *channelState, meta mirror.QueueMeta, f frames.Frame) {
	classID, methodID, _, _ := frames.ParseMethodID(f.Payload)
	loc.closeChannel(ch, frames.NotFound, fmt.Sprintf(
		"NOT_FOUND - home node '%s' of durable queue '%s' in vhost '%s' is down or inaccessible", meta.Master, meta.ID.Name, meta.ID.VHost),
		classID, methodID)
}

// masterOf returns the link a consume or get of queue goes to: its master's
// with mirroring (and the queue to trim, ref), the home link otherwise or
// for a queue no backend has (the broker answers 404). ok is false when the
// request was answered already (the master is down: 404) or there is no
// link at all.
func (loc *queueLocator) masterOf(ch *channelState, queue string, f frames.Frame) (target *link, ref *ledger.QueueRef, ok bool) {
	if loc.mirror != nil && queue != "" {
		if meta, found := loc.locate(queue); found {
			meta, master := loc.reachMaster(ch, meta)
			if len(master) == 0 {
				loc.masterDown(ch, meta, f)
				return nil, nil, false
			}
			return master[0], &ledger.QueueRef{ID: meta.ID}, true
		}
	}
	home := loc.links.homeOnly()
	if len(home) == 0 {
		return nil, nil, false
	}
	return home[0], nil, true
}
