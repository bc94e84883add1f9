package engine

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// ListUnrecordedWith sets how the engine learns the queues this proxy's
// clients declared that the metadata log does not record, exclusive and
// server-named ones (proxy.Server.UnrecordedQueues), which list_queues
// shows after the log's: RabbitMQ lists every queue. Without it the engine
// knows none.
func (e *Engine) ListUnrecordedWith(f func(vhost string) []mirror.UnrecordedQueue) {
	e.listing.unrecorded.Store(&f)
}

// unrecordedStatus returns list_queues' rows for the unrecorded queues of
// vhost that clients of this proxy and, in a cluster, of the other live
// proxies declared; unacked are the counts of ListQueues (known false:
// none). Each is asked of its broker with a passive declare: an exclusive
// queue answers 405 (only its owner may ask), so its counts stay unknown;
// a queue its broker no longer has (auto-deleted, expired) is left out.
func (l *listing) unrecordedStatus(ctx context.Context, vhost string, unacked map[mirror.QueueID]mirror.Held, known bool) ([]mirror.QueueStatus, error) {
	var out []mirror.QueueStatus
	seen := make(map[mirror.QueueID]bool)
	for _, u := range l.unrecordedQueues(ctx, vhost) {
		if seen[u.ID] {
			continue
		}
		seen[u.ID] = true
		if _, recorded := l.store.Get(u.ID); recorded {
			continue // a server-named queue adopted since
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		st := mirror.QueueStatus{
			Meta:     mirror.QueueMeta{ID: u.ID, Master: u.Backend},
			Messages: -1, MessagesReady: -1, MessagesUnacked: -1, Consumers: -1,
			Policy:    l.policyName(u.ID, u.Exclusive),
			Exclusive: u.Exclusive,
		}
		if known {
			st.MessagesUnacked = unacked[u.ID].Unacked
		}
		q, err := l.operator.inspect(u.Backend, u.ID)
		switch {
		case err == nil:
			st.MessagesReady, st.Consumers = q.Messages, q.Consumers
			if known {
				st.Messages = q.Messages + st.MessagesUnacked
			}
		case replyCode(err) == amqp.NotFound:
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

// unrecordedQueues collects the unrecorded queues of vhost from this proxy
// and the other live proxies. One that does not answer within
// unackedAskTimeout is logged and its queues are missing from the listing,
// rather than holding it up.
func (l *listing) unrecordedQueues(ctx context.Context, vhost string) []mirror.UnrecordedQueue {
	var out []mirror.UnrecordedQueue
	if f := l.unrecorded.Load(); f != nil {
		out = (*f)(vhost)
	}
	if l.peers == nil {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, unackedAskTimeout)
	defer cancel()
	theirs, err := l.peers.Unrecorded(ctx, vhost)
	if err != nil {
		l.log.Warn("list_queues: the exclusive and server-named queues of other proxies' clients are missing", "vhost", vhost, "err", err)
	}
	return append(out, theirs...)
}

// policyName is the name of the user policy that applies to the queue, ""
// for none. An exclusive queue matches no ha-mode policy (config.Match).
func (l *listing) policyName(id mirror.QueueID, exclusive bool) string {
	if p := l.policies.Snapshot().Match(id.VHost, id.Name, config.KindQueue, exclusive); p != nil {
		return p.Name
	}
	return ""
}
