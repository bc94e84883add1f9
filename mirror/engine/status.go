package engine

import (
	"context"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// ListQueues returns every recorded queue of vhost ("" for every vhost)
// with what its master's broker says now (messages ready and consumers,
// -1 when the master cannot be asked), its policy and the slaves a sync
// copies to now. It is `ctl list_queues`.
func (e *Engine) ListQueues(ctx context.Context, vhost string) ([]mirror.QueueStatus, error) {
	var out []mirror.QueueStatus
	for _, m := range e.opts.Store.List() {
		if vhost != "" && m.ID.VHost != vhost {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		_, policy := e.definition(m.ID)
		st := mirror.QueueStatus{Meta: m, Messages: -1, Consumers: -1, Policy: policy, Syncing: e.syncing(m.ID)}
		if q, err := e.inspect(m.Master, m.ID.Name); err == nil {
			st.Messages, st.Consumers = q.Messages, q.Consumers
		}
		out = append(out, st)
	}
	return out, nil
}
