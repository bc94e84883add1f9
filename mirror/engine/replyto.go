package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
)

// Which backend owns a direct reply-to name (mirror.ReplyToNode): the proxy
// sends a reply only to the broker whose Erlang node the name's pid is on.
// Each backend's node is learnt by a probe on the watcher's connection: a
// consumer of amq.rabbitmq.reply-to and a mandatory publish with that
// reply_to to a routing key no queue can have (names beginning "amq." are
// refused to declares), which the broker returns with the reply_to it wrote.
// A probe holds for the connection it ran on: a broker that comes back may
// be another node.

// replyProbeKey is the probe publish's routing key.
const replyProbeKey = "amq.amqp-mirror.reply-to-probe"

// replyProbeRetry is how long a backend whose probe failed is not probed
// again.
const replyProbeRetry = time.Second

// replyNodes remembers each backend's node, by backend, and probes the
// backends for it on the watcher's connections.
type replyNodes struct {
	watcher *controllink.Watcher
	timeout time.Duration // bounds one probe

	mu        sync.Mutex
	byBackend map[string]replyProbe
}

type replyProbe struct {
	node        string
	generation  uint64    // of the watcher connection the probe ran on
	failedUntil time.Time // set when the probe failed
}

// ReplyBackend returns the backend whose broker runs node, the node of a
// direct reply-to name. Backends not probed on their current connection
// are probed first (one round trip each); ok is false when no live backend,
// or more than one, runs it.
func (e *Engine) ReplyBackend(ctx context.Context, node string) (backend string, ok bool) {
	generations := make(map[string]uint64, len(e.backends))
	for _, b := range e.backends {
		if _, gen, err := e.replies.urlConn(b); err == nil {
			generations[b] = gen
		}
	}
	owner, ambiguous, unprobed := e.replies.owner(node, generations, time.Now())
	for _, b := range unprobed {
		if owner != "" {
			break
		}
		found, gen, err := e.replies.probe(ctx, b)
		e.replies.record(b, found, gen, err, time.Now())
		if err != nil {
			e.log.Warn("cannot learn the backend's Erlang node for direct reply-to", "backend", b, "err", err)
			continue
		}
		if found == node {
			owner, ambiguous, _ = e.replies.owner(node, generations, time.Now())
		}
	}
	if ambiguous {
		e.log.Warn("two backends name the same Erlang node in direct reply-to; a reply to it goes to neither", "node", node)
		return "", false
	}
	return owner, owner != ""
}

// owner returns the backend whose probe on its current connection found
// node (ambiguous: more than one did), and the live backends that have no
// such probe and may be probed now.
func (r *replyNodes) owner(node string, generations map[string]uint64, now time.Time) (owner string, ambiguous bool, unprobed []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for b, gen := range generations {
		p, known := r.byBackend[b]
		switch {
		case known && p.generation == gen && p.node == node:
			ambiguous = ambiguous || owner != ""
			owner = b
		case known && p.generation == gen && p.node != "":
		case known && now.Before(p.failedUntil):
		default:
			unprobed = append(unprobed, b)
		}
	}
	return owner, ambiguous, unprobed
}

// record keeps a probe's outcome.
func (r *replyNodes) record(backend, node string, generation uint64, err error, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byBackend == nil {
		r.byBackend = make(map[string]replyProbe)
	}
	if err != nil {
		r.byBackend[backend] = replyProbe{generation: generation, failedUntil: now.Add(replyProbeRetry)}
		return
	}
	r.byBackend[backend] = replyProbe{node: node, generation: generation}
}

// probe asks backend for a direct reply-to name of its own and
// returns the node it names, with the generation of the connection asked.
func (r *replyNodes) probe(ctx context.Context, backend string) (string, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	conn, gen, err := r.urlConn(backend)
	if err != nil {
		return "", 0, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return "", gen, fmt.Errorf("opening a channel: %w", err)
	}
	defer ch.Close()
	returns := ch.NotifyReturn(make(chan amqp.Return, 1)) // one publish, one return
	if _, err := ch.ConsumeWithContext(ctx, mirror.ReplyToQueue, "", true, false, false, false, nil); err != nil {
		return "", gen, fmt.Errorf("consuming %s: %w", mirror.ReplyToQueue, err)
	}
	if err := ch.PublishWithContext(ctx, "", replyProbeKey, true, false, amqp.Publishing{ReplyTo: mirror.ReplyToQueue}); err != nil {
		return "", gen, fmt.Errorf("publishing the probe: %w", err)
	}
	select {
	case r, ok := <-returns:
		if !ok {
			return "", gen, errors.New("the channel closed before the probe came back")
		}
		node, ok := mirror.ReplyToNode(r.ReplyTo)
		if !ok {
			return "", gen, fmt.Errorf("the broker wrote reply_to %q, which names no node", r.ReplyTo)
		}
		return node, gen, nil
	case <-ctx.Done():
		return "", gen, fmt.Errorf("waiting for the probe to come back: %w", ctx.Err())
	}
}

// urlConn is the watcher's connection to backend in the vhost of its URL:
// a broker's node is the same in every vhost.
func (r *replyNodes) urlConn(backend string) (*amqp.Connection, uint64, error) {
	c, gen := r.watcher.Conn(backend)
	if c == nil {
		return nil, 0, fmt.Errorf("backend %s: %w", backend, errBackendDown)
	}
	return c, gen, nil
}
