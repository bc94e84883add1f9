package engine

import (
	"context"
	"maps"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// CountUnackedWith sets how the engine counts the messages this proxy's
// clients hold unacknowledged, per queue of a vhost (proxy.Server.Unacked),
// for list_queues. Without it the engine counts none.
func (e *Engine) CountUnackedWith(f func(vhost string) map[mirror.QueueID]int) {
	e.unacked.Store(&f)
}

// ListQueues returns every recorded queue of vhost ("" for every vhost)
// with what its master's broker says now (messages ready and consumers,
// -1 when the master cannot be asked), with unacked the messages clients of
// the proxies hold unacknowledged (-1 without: asking the other proxies
// takes a round trip to each), its policy, the slaves a sync copies to
// now and the backends that refuse the proxy's account in its vhost; then
// the exclusive and server-named queues clients declared, which the log
// does not record (unrecordedStatus). It is `ctl list_queues`.
func (e *Engine) ListQueues(ctx context.Context, vhost string, unacked bool) ([]mirror.QueueStatus, error) {
	var out []mirror.QueueStatus
	var counts map[mirror.QueueID]int
	known := false
	if unacked {
		counts, known = e.countUnacked(ctx, vhost)
	}
	for _, m := range e.opts.Store.List() {
		if vhost != "" && m.ID.VHost != vhost {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		_, policy := definition(e.opts.Policies, m.ID)
		st := mirror.QueueStatus{Meta: m, Messages: -1, MessagesReady: -1, MessagesUnacked: -1, Consumers: -1, Policy: policy, Syncing: e.syncs.targets(m.ID)}
		for _, b := range e.backends {
			if e.opts.Watcher.Refuses(b, m.ID.VHost) {
				st.Refused = append(st.Refused, b)
			}
		}
		if known {
			st.MessagesUnacked = counts[m.ID]
		}
		if q, err := e.operator.inspect(m.Master, m.ID); err == nil {
			st.MessagesReady, st.Consumers = q.Messages, q.Consumers
			if known {
				st.Messages = q.Messages + st.MessagesUnacked
			}
		}
		out = append(out, st)
	}
	unrecorded, err := e.unrecordedStatus(ctx, vhost, counts, known)
	if err != nil {
		return nil, err
	}
	return append(out, unrecorded...), nil
}

// unackedAskTimeout bounds how long list_queues waits for the other
// proxies' counts: a proxy frozen, and not yet judged failed, would hold
// every listing (and a script polling it for a failover) until the call's
// own timeout.
const unackedAskTimeout = time.Second

// countUnacked adds up the messages of vhost's queues that clients of this
// proxy and, in a cluster, of the other live proxies hold unacknowledged;
// known is false when a proxy did not answer. A proxy that is gone has no
// clients left: their brokers took the deliveries back.
func (e *Engine) countUnacked(ctx context.Context, vhost string) (counts map[mirror.QueueID]int, known bool) {
	counts = make(map[mirror.QueueID]int)
	if f := e.unacked.Load(); f != nil {
		maps.Copy(counts, (*f)(vhost))
	}
	if !e.roles.clustered {
		return counts, true
	}
	ctx, cancel := context.WithTimeout(ctx, unackedAskTimeout)
	defer cancel()
	theirs, err := e.opts.Peers.Unacked(ctx, vhost)
	if err != nil {
		e.log.Warn("list_queues: the unacknowledged messages of other proxies' clients are unknown", "vhost", vhost, "err", err)
		return counts, false
	}
	for id, n := range theirs {
		counts[id] += n
	}
	return counts, true
}
