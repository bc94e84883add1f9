package cluster

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// The read-only views that list the whole cluster, as rabbitmqctl lists
// every node's: the proxy asked lists its own rows and asks every other
// alive proxy for theirs, with the calls below.

// Kinds of the calls that ask a proxy for its rows of a view.
const (
	connectionsCall = "connections"
	consumersCall   = "consumers"
	failoversCall   = "failovers"
)

// HandleConnections sets the function that lists this proxy's client
// connections for other proxies' list_connections
// (proxy.Server.Connections).
func (p *Peers) HandleConnections(f func() []mirror.Connection) {
	handleRows(p, connectionsCall, func(string) []mirror.Connection { return f() })
}

// Connections asks every other alive proxy, at once, for its client
// connections. When one does not answer before ctx ends it returns the
// others' with the error.
func (p *Peers) Connections(ctx context.Context) ([]mirror.Connection, error) {
	return askRows[mirror.Connection](ctx, p, connectionsCall, "")
}

// HandleConsumers sets the function that lists the consumers of this
// proxy's clients in a vhost ("" for all) for other proxies'
// list_consumers (proxy.Server.Consumers).
func (p *Peers) HandleConsumers(f func(vhost string) []mirror.Consumer) {
	handleRows(p, consumersCall, f)
}

// Consumers asks every other alive proxy, at once, for the consumers of
// its clients in vhost ("" for all); as Connections when one does not
// answer.
func (p *Peers) Consumers(ctx context.Context, vhost string) ([]mirror.Consumer, error) {
	return askRows[mirror.Consumer](ctx, p, consumersCall, vhost)
}

// HandleFailovers sets the function that lists the promotions this proxy
// wrote (engine.Failovers), for other proxies' status pages.
func (p *Peers) HandleFailovers(f func() []mirror.Failover) {
	handleRows(p, failoversCall, func(string) []mirror.Failover { return f() })
}

// Failovers asks every other alive proxy, at once, for the promotions it
// wrote; as Connections when one does not answer.
func (p *Peers) Failovers(ctx context.Context) ([]mirror.Failover, error) {
	return askRows[mirror.Failover](ctx, p, failoversCall, "")
}

// handleRows answers calls of kind, whose request is a vhost, with the
// rows list returns.
func handleRows[T any](p *Peers, kind string, list func(vhost string) []T) {
	p.calls.Store(kind, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var vhost string
		if err := json.Unmarshal(payload, &vhost); err != nil {
			return nil, fmt.Errorf("decoding a %s request: %w", kind, err)
		}
		return json.Marshal(list(vhost))
	}))
}

// askRows asks every other alive proxy for its rows of kind in vhost, and
// returns those that came with an error naming the proxies that did not
// answer.
func askRows[T any](ctx context.Context, p *Peers, kind, vhost string) ([]T, error) {
	var all []T
	err := p.askEveryone(ctx, kind, vhost, func(node string, raw []byte) error {
		var rows []T
		if err := json.Unmarshal(raw, &rows); err != nil {
			return fmt.Errorf("decoding %s's %s: %w", node, kind, err)
		}
		all = append(all, rows...)
		return nil
	})
	if err != nil {
		return all, fmt.Errorf("listing %s: %w", kind, err)
	}
	return all, nil
}
