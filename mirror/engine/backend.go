package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/internal/rawsock"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/controllink"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// The engine's own operations on one backend, with the account in the
// backend's URL, on the watcher's connection to it in the vhost of the
// queue or exchange concerned (controllink.Watcher.VHostConn). Each opens
// a fresh channel: a 404 or 405 closes the channel it happened on, never
// the connection.

var errBackendDown = controllink.ErrNotUp

// operator carries out the engine's own operations on the backends. It
// keeps no state of its own: the connections are the watcher's, a sync's
// are dialled for it (dial).
type operator struct {
	watcher  *controllink.Watcher
	backends []controllink.Backend
	store    *store.Store // the tombstones (buryCopies)
	log      *slog.Logger
	timeout  time.Duration // bounds dialling a sync's connection
}

// conn returns the watcher's connection to backend in vhost and its
// generation; the watcher logs a vhost that a backend refuses.
func (o *operator) conn(backend, vhost string) (*amqp.Connection, uint64, error) {
	return o.watcher.VHostConn(backend, vhost)
}

// withChannel runs f on a fresh channel of the watcher's connection to
// backend in vhost, and closes the channel after.
func (o *operator) withChannel(backend, vhost string, f func(ch *amqp.Channel) error) error {
	c, _, err := o.conn(backend, vhost)
	if err != nil {
		return err
	}
	ch, err := c.Channel()
	if err != nil {
		return fmt.Errorf("backend %s, vhost %q: opening a channel: %w", backend, vhost, err)
	}
	defer ch.Close()
	return f(ch)
}

// inspect passive-declares queue id on backend: its ready message and
// consumer counts. A missing queue is an *amqp.Error with code 404, an
// exclusive queue of another connection one with 405.
func (o *operator) inspect(backend string, id mirror.QueueID) (amqp.Queue, error) {
	var q amqp.Queue
	err := o.withChannel(backend, id.VHost, func(ch *amqp.Channel) error {
		var err error
		q, err = ch.QueueDeclarePassive(id.Name, false, false, false, false, nil)
		return err
	})
	return q, err
}

// exists reports whether queue id exists on backend without touching it:
// a passive declare counts as a use of the queue and restarts its
// x-expires timer (RabbitMQ 3.10 does), so a check by passive declare
// would keep an expiring queue alive for ever, and queue.unbind answers
// unbind-ok for a missing queue. A binding made and removed at once asks
// the broker's binding table only: 404 when the queue is gone.
func (o *operator) exists(backend string, id mirror.QueueID) (bool, error) {
	const probe = "amqp-mirror-existence-probe"
	err := o.withChannel(backend, id.VHost, func(ch *amqp.Channel) error {
		if err := ch.QueueBind(id.Name, probe, "amq.direct", false, nil); err != nil {
			return err
		}
		return ch.QueueUnbind(id.Name, probe, "amq.direct", nil)
	})
	switch {
	case err == nil:
		return true, nil
	case replyCode(err) == amqp.NotFound:
		return false, nil
	}
	return false, err
}

// replyCode returns the AMQP reply code of a channel or connection error,
// 0 when err is not one.
func replyCode(err error) int {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}

// declareCopy declares a slave copy of m on backend, with m's durability
// and arguments, and applies m's bindings. It is never auto-delete: the
// trimmer, its only consumer, recycles its channel now and then, which
// would delete an auto-delete copy; the engine deletes slaves when their
// master goes.
func (o *operator) declareCopy(backend string, m mirror.QueueMeta) error {
	arguments := m.Arguments
	if m.ForwardsDeadLetters {
		arguments = mirror.BrokerArguments(arguments)
	}
	args, err := amqpTable(arguments)
	if err != nil {
		return fmt.Errorf("%s: arguments: %w", m.ID, err)
	}
	if m.ForwardsDeadLetters {
		if err := o.ensureDeadLetters(backend, m.ID.VHost); err != nil {
			return fmt.Errorf("declaring a copy of %s: %w", m.ID, err)
		}
	}
	return o.withChannel(backend, m.ID.VHost, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(m.ID.Name, m.Durable, false, false, false, args); err != nil {
			return fmt.Errorf("declaring a copy of %s on %s: %w", m.ID, backend, err)
		}
		for _, binding := range m.Bindings {
			bargs, err := amqpTable(binding.Arguments)
			if err != nil {
				return fmt.Errorf("%s: binding arguments: %w", m.ID, err)
			}
			if err := ch.QueueBind(m.ID.Name, binding.RoutingKey, binding.Exchange, false, bargs); err != nil {
				return fmt.Errorf("binding the copy of %s on %s to exchange %q: %w", m.ID, backend, binding.Exchange, err)
			}
		}
		return nil
	})
}

// deleteCopy deletes the copy of queue id on backend; one already gone is
// not an error.
func (o *operator) deleteCopy(backend string, id mirror.QueueID) error {
	err := o.withChannel(backend, id.VHost, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(id.Name, false, false, false)
		return err
	})
	if replyCode(err) == amqp.NotFound {
		return nil
	}
	return err
}

// purgeCopy purges the copy of queue id on backend directly.
func (o *operator) purgeCopy(backend string, id mirror.QueueID) error {
	return o.withChannel(backend, id.VHost, func(ch *amqp.Channel) error {
		_, err := ch.QueuePurge(id.Name, false)
		return err
	})
}

// dial opens a connection of the proxy's own to backend in vhost for
// one sync.
// A sync never uses the watcher's connection: RabbitMQ throttles a
// connection that publishes fast (credit flow), and the watcher's probes
// on a throttled connection would go unanswered long enough to call the
// backend down.
func (o *operator) dial(backend, vhost string) (*amqp.Connection, error) {
	return o.dialFor(backend, vhost, "sync")
}

// dialFor is dial for purpose, which names the connection on the broker
// and in errors.
func (o *operator) dialFor(backend, vhost, purpose string) (*amqp.Connection, error) {
	for _, configured := range o.backends {
		if configured.Name != backend {
			continue
		}
		url, err := controllink.WithVHost(configured.URL, vhost)
		if err != nil {
			return nil, fmt.Errorf("backend %s: %w", backend, err)
		}
		dialer := &net.Dialer{Timeout: o.timeout}
		conn, err := amqp.DialConfig(url, amqp.Config{
			TLSClientConfig: configured.TLS,
			Heartbeat:       10 * time.Second,
			Locale:          "en_US",
			Dial: func(network, addr string) (net.Conn, error) {
				conn, err := dialer.Dial(network, addr)
				if err != nil {
					return nil, err
				}
				// Bounds the handshake; amqp091-go clears it once open.
				conn.SetDeadline(time.Now().Add(o.timeout))
				// A copy publishes thousands of messages a second on
				// it: raw calls, as on the trimmers' connections.
				return rawsock.Wrap(conn), nil
			},
			Properties: amqp.Table{"connection_name": "amqp-mirror " + purpose},
		})
		if err != nil {
			return nil, fmt.Errorf("backend %s, vhost %q: connecting for a %s: %w", backend, vhost, purpose, err)
		}
		return conn, nil
	}
	return nil, fmt.Errorf("backend %s is not configured", backend)
}

// buryCopies deletes the copies on backends of a queue that was deleted
// (the log keeps its tombstone), and reports whether it was: a broker that
// was down when the queue was deleted kept its copy, which must go, not be
// adopted as a new queue. A queue the log never knew has no tombstone and
// is left alone (adopted as before). The tombstone goes when the queue is
// declared again through a proxy.
func (o *operator) buryCopies(id mirror.QueueID, backends []string) (bool, error) {
	ts, ok := o.store.Tombstone(id)
	if !ok {
		return false, nil
	}
	var errs []error
	for _, backend := range backends {
		if err := o.deleteCopy(backend, id); err != nil {
			errs = append(errs, fmt.Errorf("deleting the copy of deleted %s on %s: %w", id, backend, err))
			continue
		}
		o.log.Info("copy of a deleted queue deleted", "queue", id.Name, "vhost", id.VHost, "backend", backend, "deleted_at", ts.At, "epoch", ts.Epoch)
	}
	return true, errors.Join(errs...)
}

// amqpTable converts a field table as it came on the wire (frames
// encoding, nil for none) to amqp091-go's Table.
func amqpTable(encoded []byte) (amqp.Table, error) {
	if len(encoded) == 0 {
		return nil, nil
	}
	t, _, err := frames.DecodeTable(encoded)
	if err != nil {
		return nil, err
	}
	if len(t) == 0 {
		return nil, nil
	}
	return convertTable(t), nil
}

func convertTable(t frames.Table) amqp.Table {
	out := make(amqp.Table, len(t))
	for _, f := range t {
		if _, dup := out[f.Key]; !dup { // the first of duplicate keys wins, as Table.Get
			out[f.Key] = convertValue(f.Value)
		}
	}
	return out
}

func convertValue(v any) any {
	switch v := v.(type) {
	case frames.Table:
		return convertTable(v)
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = convertValue(x)
		}
		return out
	case frames.Decimal:
		return amqp.Decimal{Scale: v.Scale, Value: v.Value}
	case frames.Timestamp:
		return time.Unix(int64(v), 0)
	}
	return v
}

// tableString returns a string (or bytes) argument of a wire-encoded
// table, "" when absent.
func tableString(encoded []byte, key string) (string, error) {
	if len(encoded) == 0 {
		return "", nil
	}
	t, _, err := frames.DecodeTable(encoded)
	if err != nil {
		return "", err
	}
	switch v, _ := t.Get(key); v := v.(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	}
	return "", nil
}

// hasKey reports whether a wire-encoded table has key; false when it
// cannot be decoded.
func hasKey(encoded []byte, key string) bool {
	if len(encoded) == 0 {
		return false
	}
	t, _, err := frames.DecodeTable(encoded)
	if err != nil {
		return false
	}
	_, ok := t.Get(key)
	return ok
}
