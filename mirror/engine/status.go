package engine

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// CountUnackedWith sets how the engine counts the messages this proxy's
// clients hold unacknowledged, per queue of a vhost (proxy.Server.Unacked),
// for list_queues. Without it the engine counts none.
func (e *Engine) CountUnackedWith(f func(vhost string) map[mirror.QueueID]int) {
	e.listing.unacked.Store(&f)
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
	return e.listing.list(ctx, vhost, unacked)
}

// Overview returns every recorded queue of every vhost with its policy and
// the slaves a sync copies to now, asking no broker and no other proxy:
// the admin status page's view, cheap enough for every refresh of a large
// install. Its counts are -1 (unknown).
func (e *Engine) Overview() []mirror.QueueStatus { return e.listing.overview() }

// listing answers `ctl list_queues`: the log's queues with what their
// masters' brokers say, the unacknowledged counts of every proxy's
// clients and the queues the log does not record. The functions that ask
// this proxy's clients are set once serve has built the proxy, so they
// are atomic pointers; the rest is the engine's parts, read only.
type listing struct {
	store    *store.Store
	policies *config.PolicyStore
	watcher  *controllink.Watcher // which backends refuse a vhost
	operator *operator
	syncs    *syncs
	peers    Peers // nil for one proxy alone
	backends []string
	log      *slog.Logger

	// unacked counts what this proxy's clients hold unacknowledged
	// (CountUnackedWith).
	unacked atomic.Pointer[func(vhost string) map[mirror.QueueID]int]
	// unrecorded lists the queues this proxy's clients declared that the
	// log does not record (ListUnrecordedWith).
	unrecorded atomic.Pointer[func(vhost string) []mirror.UnrecordedQueue]
}

// list is Engine.ListQueues.
func (l *listing) list(ctx context.Context, vhost string, unacked bool) ([]mirror.QueueStatus, error) {
	var out []mirror.QueueStatus
	var counts map[mirror.QueueID]mirror.Held
	known := false
	if unacked {
		var err error
		counts, err = l.held(ctx, vhost)
		if known = err == nil; !known {
			l.log.Warn("list_queues: the unacknowledged messages of other proxies' clients are unknown", "vhost", vhost, "err", err)
		}
	}
	for _, m := range l.store.List() {
		if vhost != "" && m.ID.VHost != vhost {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		_, policy := definition(l.policies, m.ID)
		syncing, copied := l.syncs.targets(m.ID)
		st := mirror.QueueStatus{Meta: m, Messages: -1, MessagesReady: -1, MessagesUnacked: -1, Consumers: -1, Policy: policy, Syncing: syncing, SyncCopied: copied}
		for _, b := range l.backends {
			if l.watcher.Refuses(b, m.ID.VHost) {
				st.Refused = append(st.Refused, b)
			}
		}
		if known {
			st.MessagesUnacked = counts[m.ID].Unacked
		}
		if q, err := l.operator.inspect(m.Master, m.ID); err == nil {
			st.MessagesReady, st.Consumers = q.Messages, q.Consumers
			if known {
				st.Messages = q.Messages + st.MessagesUnacked
			}
		}
		out = append(out, st)
	}
	unrecorded, err := l.unrecordedStatus(ctx, vhost, counts, known)
	if err != nil {
		return nil, err
	}
	return append(out, unrecorded...), nil
}

// overview is Engine.Overview.
func (l *listing) overview() []mirror.QueueStatus {
	metas := l.store.List()
	out := make([]mirror.QueueStatus, 0, len(metas))
	for _, m := range metas {
		_, policy := definition(l.policies, m.ID)
		syncing, copied := l.syncs.targets(m.ID)
		out = append(out, mirror.QueueStatus{Meta: m, Messages: -1, MessagesReady: -1, MessagesUnacked: -1, Consumers: -1,
			Policy: policy, Syncing: syncing, SyncCopied: copied})
	}
	return out
}

// unackedAskTimeout bounds how long list_queues and a backlog check wait
// for the other proxies' counts: a proxy frozen, and not yet judged
// failed, would hold every listing (and a script polling it for a
// failover) until the call's own timeout.
const unackedAskTimeout = time.Second

// HeldHere returns, per queue of vhost ("" for every vhost), what this
// proxy holds of its messages: its clients' unacknowledged deliveries and
// its copies from the master. Other proxies ask it (Peers.Held).
func (e *Engine) HeldHere(vhost string) map[mirror.QueueID]mirror.Held {
	return e.listing.heldHere(vhost)
}

// heldHere is Engine.HeldHere.
func (l *listing) heldHere(vhost string) map[mirror.QueueID]mirror.Held {
	out := l.syncs.heldByCopies(vhost)
	if f := l.unacked.Load(); f != nil {
		for id, n := range (*f)(vhost) {
			h := out[id]
			h.Unacked += n
			out[id] = h
		}
	}
	return out
}

// held adds up what this proxy and, in a cluster, the other live proxies
// hold of vhost's queues' messages (mirror.Held); err says a proxy did not
// answer, and the counts are short. A proxy that is gone holds nothing:
// the brokers took its clients' deliveries and its copies' back.
func (l *listing) held(ctx context.Context, vhost string) (map[mirror.QueueID]mirror.Held, error) {
	counts := l.heldHere(vhost)
	if l.peers == nil {
		return counts, nil
	}
	ctx, cancel := context.WithTimeout(ctx, unackedAskTimeout)
	defer cancel()
	theirs, err := l.peers.Held(ctx, vhost)
	if err != nil {
		return counts, err
	}
	for id, h := range theirs {
		counts[id] = counts[id].Add(h)
	}
	return counts, nil
}
