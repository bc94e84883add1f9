package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// The copies of a queue that drops its head when full (x-max-length or
// x-max-length-bytes under drop-head) dead-letter into the proxy's own
// exchange, mirror.DeadLetterExchange, in their vhost on their broker,
// whatever the client asked: a broker dead-letters only into its own
// copies of the targets, and a message the master's broker drops must
// also leave the slaves, which hold it for their trimmers and never drop
// it themselves. A forwarder per backend and vhost reads that exchange's
// queue and decides by the message's first x-death entry, which the
// broker wrote as RabbitMQ does:
//
//   - maxlen, from the queue's master: the master dropped it. The slaves'
//     copies are settled (their trimmers ack them) and, when the client
//     asked for a dead-letter exchange, the message goes to it on every
//     backend, each routing it into its own copies of the targets.
//   - maxlen, from a slave: the slave's broker dropped a copy the master
//     still holds, which happens when its trimmer gave its copies back (a
//     sync reading it, a restart) and they outnumbered the limit. The
//     copy goes back into the slave's queue, without that x-death entry.
//     Unless it was dropped before the copy rejoined the queue purged
//     (rejoins): then the broker dropped it as the queue's master, before
//     it was lost and a slave promoted, and its forwarder never got to it.
//     The promoted slave's broker dropped the same messages again when its
//     trimmer gave them back, and forwarded them; this one is dropped.
//   - any other reason (rejected, expired): every copy is dead-lettered by
//     its own broker, so the message goes to the client's dead-letter
//     exchange on this backend only, as each broker does without a proxy.
//
// Each message is acked on the exchange's queue once what it decided is
// confirmed: a forwarder that stops in between leaves it there for the
// next, which sends it again (at least once). A message of a queue the
// log does not have (not yet, or a queue of proxies with a log of their
// own in front of the same brokers) is given back for a minute, then
// dropped.

// deadLetterPrefetch bounds what a forwarder holds unacknowledged.
const deadLetterPrefetch = 64

// deadLetterRetry is how long a forwarder waits before it connects again
// after an error.
const deadLetterRetry = time.Second

// unknownDeadLetterGrace is how long a dead-lettered message of a queue the
// log does not have is given back rather than dropped, and
// unknownDeadLetterPause how long the forwarder waits before it gives one
// back, so that a message nobody takes does not go round at full speed.
const (
	unknownDeadLetterGrace = time.Minute
	unknownDeadLetterPause = 10 * time.Millisecond
)

// deadLetterSource is one backend's vhost, read by one forwarder.
type deadLetterSource struct {
	backend, vhost string
}

// deadLetters owns the forwarders this proxy runs: one per backend whose
// slave copies it trims (every backend for a proxy alone, its own node's in
// a sidecar cluster) and vhost with a queue that drops its head and has a
// copy there. The engine's loop brings them in line with the log each
// round (reconcile); they end with the engine.
type deadLetters struct {
	operator *operator
	store    *store.Store
	roles    roles
	liveness *liveness
	backends []string
	// settle settles messages of a queue on its slaves (Engine.Settle).
	settle func(id mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome)
	// rejoins are the copies that rejoined their queue purged, and when.
	rejoins *rejoins
	log     *slog.Logger
	life    lifetime

	mu      sync.Mutex
	running map[deadLetterSource]context.CancelFunc
	wg      sync.WaitGroup
}

// reconcile starts the forwarders metas need and stops the others.
func (d *deadLetters) reconcile(metas []mirror.QueueMeta) {
	want := make(map[deadLetterSource]bool)
	for _, m := range metas {
		if !m.ForwardsDeadLetters {
			continue
		}
		for _, b := range m.Backends() {
			if d.roles.trimsHere(b) {
				want[deadLetterSource{backend: b, vhost: m.ID.VHost}] = true
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.life.ctx.Err() != nil {
		return
	}
	for src, stop := range d.running {
		if !want[src] {
			stop()
			delete(d.running, src)
		}
	}
	for src := range want {
		if _, ok := d.running[src]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(d.life.ctx)
		d.running[src] = cancel
		d.wg.Go(func() { d.forward(ctx, src) })
	}
}

// close stops every forwarder and waits for them.
func (d *deadLetters) close() {
	d.mu.Lock()
	for _, stop := range d.running {
		stop()
	}
	d.running = make(map[deadLetterSource]context.CancelFunc)
	d.mu.Unlock()
	d.wg.Wait()
}

// forward reads src's dead-letter queue until ctx ends, connecting again
// after each error.
func (d *deadLetters) forward(ctx context.Context, src deadLetterSource) {
	log := d.log.With("component", "dead-letters", "backend", src.backend, "vhost", src.vhost)
	var last string // the last error logged: a refusal repeats every second
	for {
		if d.liveness.up(src.backend) {
			if err := d.forwardOnce(ctx, src, log); err != nil && ctx.Err() == nil {
				level := slog.LevelWarn
				if err.Error() == last {
					level = slog.LevelDebug
				}
				last = err.Error()
				log.Log(ctx, level, "forwarding dead-lettered messages failed; connecting again", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(deadLetterRetry):
		}
	}
}

// forwardOnce is one connection's worth of forward.
func (d *deadLetters) forwardOnce(ctx context.Context, src deadLetterSource, log *slog.Logger) error {
	conn, err := d.operator.dialFor(src.backend, src.vhost, "dead-letter forwarder")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel: %w", err)
	}
	if err := declareDeadLetters(ch); err != nil {
		return err
	}
	if err := ch.Qos(deadLetterPrefetch, 0, false); err != nil {
		return fmt.Errorf("setting the prefetch: %w", err)
	}
	deliveries, err := ch.Consume(mirror.DeadLetterExchange, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consuming %s: %w", mirror.DeadLetterExchange, err)
	}
	out := &deadLetterPublisher{operator: d.operator, vhost: src.vhost, backend: src.backend, own: conn}
	defer out.close()
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg, ok := <-deliveries:
			if !ok {
				return errors.New("the broker closed the channel")
			}
			later, err := d.handle(ctx, src, msg, out, log)
			if err != nil {
				return err
			}
			if later {
				err = msg.Nack(false, true)
			} else {
				err = msg.Ack(false)
			}
			if err != nil {
				return fmt.Errorf("settling a dead-lettered message: %w", err)
			}
		}
	}
}

// handle decides what becomes of one dead-lettered message (see the top of
// this file) and does it; later is set for a message to give back to the
// queue, for this forwarder or another to take again.
func (d *deadLetters) handle(ctx context.Context, src deadLetterSource, msg amqp.Delivery, out *deadLetterPublisher, log *slog.Logger) (later bool, err error) {
	queue, reason, at, ok := firstDeath(msg.Headers)
	if !ok {
		log.Warn("a message without x-death in the dead-letter queue; dropped")
		return false, nil
	}
	id := mirror.QueueID{VHost: src.vhost, Name: queue}
	m, recorded := d.store.Get(id)
	if !recorded {
		// This proxy's log may not show a new queue yet; and the brokers
		// may serve proxies of another log as well (tests do), whose
		// forwarders read the same queue. A queue still unknown after
		// unknownDeadLetterGrace was deleted: its dead-letters go with it.
		if time.Since(at) < unknownDeadLetterGrace {
			select {
			case <-ctx.Done():
			case <-time.After(unknownDeadLetterPause):
			}
			return true, nil
		}
		log.Debug("a dead-lettered message of a queue the log does not have; dropped", "queue", queue)
		return false, nil
	}
	exchange, key, toExchange := mirror.DeadLetterTarget(m.Arguments)
	if key == "" {
		key = msg.RoutingKey // the broker routed it with the message's own keys
	}
	switch {
	case reason == "maxlen" && src.backend == m.Master:
		d.settle(id, []mirror.MessageID{messageIdentity(msg)}, mirror.Acked)
		if !toExchange {
			return false, nil
		}
		for _, b := range d.backends {
			if !d.liveness.up(b) {
				continue
			}
			err := out.publish(ctx, b, exchange, key, publishing(msg), log)
			var refused *amqp.Error
			if b != src.backend && errors.As(err, &refused) && (refused.Code == amqp.NotAllowed || refused.Code == amqp.AccessRefused) {
				// A backend without the vhost, or that refuses the proxy's
				// account there, holds no copy of a target.
				log.Warn("a backend refuses the dead-lettered message", "to", b, "err", err)
				continue
			}
			if err != nil {
				return false, err
			}
		}
		return false, nil
	case reason == "maxlen" && m.SlaveIndex(src.backend) < 0:
		log.Debug("a message dropped by a copy that is no longer the queue's; dropped", "queue", queue)
		return false, nil
	case reason == "maxlen" && d.rejoins.before(id, src.backend, at):
		log.Debug("a message the copy dropped before it rejoined purged; dropped", "queue", queue)
		return false, nil
	case reason == "maxlen":
		back := publishing(msg)
		back.Headers = withoutDeath(msg.Headers, queue, reason)
		return false, out.publish(ctx, src.backend, "", queue, back, log)
	case toExchange:
		return false, out.publish(ctx, src.backend, exchange, key, publishing(msg), log)
	}
	return false, nil
}

// rejoins remembers when copies rejoined their queues purged
// (failover.backendBack), for the forwarder of their backend, which runs
// on the same proxy (roles.trimsHere). A proxy that restarts forgets
// them, and then puts such a stale drop back as it would a slave's. A
// rejoin is forgotten after rejoinMemory: by then the forwarder has long
// read what the copy's broker dropped before it.
type rejoins struct {
	mu sync.Mutex
	at map[trimmerRef]time.Time
}

const rejoinMemory = time.Hour

// note records that the copy of id on backend rejoins purged at at.
func (r *rejoins) note(id mirror.QueueID, backend string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = make(map[trimmerRef]time.Time)
	}
	for ref, when := range r.at {
		if at.Sub(when) > rejoinMemory {
			delete(r.at, ref)
		}
	}
	r.at[trimmerRef{id, backend}] = at
}

// before reports whether death, an x-death time (whole seconds), is
// before the last rejoin of the copy of id on backend. A death in the
// rejoin's own second counts as after it: such a message is put back,
// which at worst keeps one the master no longer holds, and never drops
// one it does.
func (r *rejoins) before(id mirror.QueueID, backend string, death time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	purged, ok := r.at[trimmerRef{id, backend}]
	return ok && death.Before(purged.Truncate(time.Second))
}

// messageIdentity returns a message's identity: its identity header, or
// for a message published around the proxy, its body's.
func messageIdentity(msg amqp.Delivery) mirror.MessageID {
	value, _ := msg.Headers[mirror.IdentityHeader].(string)
	if id, ok := mirror.ParseMessageID(value); ok {
		return id
	}
	return mirror.ContentID(msg.Body)
}

// declareDeadLetters declares the proxy's dead-letter exchange, its queue
// and their binding on ch's broker and vhost.
func declareDeadLetters(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(mirror.DeadLetterExchange, amqp.ExchangeFanout, true, false, true, false, nil); err != nil {
		return fmt.Errorf("declaring exchange %s: %w", mirror.DeadLetterExchange, err)
	}
	if _, err := ch.QueueDeclare(mirror.DeadLetterExchange, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring queue %s: %w", mirror.DeadLetterExchange, err)
	}
	if err := ch.QueueBind(mirror.DeadLetterExchange, "", mirror.DeadLetterExchange, false, nil); err != nil {
		return fmt.Errorf("binding queue %s: %w", mirror.DeadLetterExchange, err)
	}
	return nil
}

// ensureDeadLetters declares the proxy's dead-letter exchange and queue on
// backend in vhost, before a copy that dead-letters there exists: a broker
// drops a message dead-lettered to an exchange it does not have.
func (o *operator) ensureDeadLetters(backend, vhost string) error {
	err := o.withChannel(backend, vhost, declareDeadLetters)
	if err != nil {
		return fmt.Errorf("backend %s, vhost %q: %w", backend, vhost, err)
	}
	return nil
}

// firstDeath returns the queue, reason and time of a message's newest
// x-death entry.
func firstDeath(headers amqp.Table) (queue, reason string, at time.Time, ok bool) {
	deaths, _ := headers["x-death"].([]any)
	if len(deaths) == 0 {
		return "", "", time.Time{}, false
	}
	entry, _ := deaths[0].(amqp.Table)
	queue, _ = entry["queue"].(string)
	reason, _ = entry["reason"].(string)
	at, _ = entry["time"].(time.Time)
	return queue, reason, at, queue != "" && reason != ""
}

// withoutDeath returns headers without what the newest dead-lettering of
// the message from queue for reason added: its x-death entry (or one of
// its count, when the entry counts several), and the x-first-death and
// x-last-death headers when no entry is left. headers is not changed.
func withoutDeath(headers amqp.Table, queue, reason string) amqp.Table {
	out := maps.Clone(headers)
	deaths, _ := out["x-death"].([]any)
	if len(deaths) == 0 {
		return out
	}
	entry, _ := deaths[0].(amqp.Table)
	if entry["queue"] != queue || entry["reason"] != reason {
		return out
	}
	deaths = slices.Clone(deaths)
	if count, _ := entry["count"].(int64); count > 1 {
		entry = maps.Clone(entry)
		entry["count"] = count - 1
		deaths[0] = entry
		out["x-death"] = deaths
		return out
	}
	deaths = deaths[1:]
	if len(deaths) > 0 {
		out["x-death"] = deaths
		return out
	}
	for _, key := range []string{"x-death", "x-first-death-reason", "x-first-death-queue", "x-first-death-exchange",
		"x-last-death-reason", "x-last-death-queue", "x-last-death-exchange"} {
		delete(out, key)
	}
	return out
}

// deadLetterPublisher publishes a forwarder's messages, with confirms, on a
// channel per backend: on the forwarder's own connection for its backend,
// on a connection of its own to each other backend, opened at its first
// use.
type deadLetterPublisher struct {
	operator *operator
	vhost    string
	backend  string           // the forwarder's
	own      *amqp.Connection // the forwarder's, closed by it
	conns    map[string]*amqp.Connection
	channels map[string]*confirmingChannel
}

// confirmingChannel is a channel in confirm mode and what closed it.
type confirmingChannel struct {
	ch     *amqp.Channel
	closed chan *amqp.Error
}

// publish sends msg to exchange on backend and waits for its confirm. A
// missing exchange drops the message, as the broker does with a message
// dead-lettered to an exchange it does not have.
func (p *deadLetterPublisher) publish(ctx context.Context, backend, exchange, key string, msg amqp.Publishing, log *slog.Logger) error {
	c, err := p.channel(backend)
	if err != nil {
		return err
	}
	confirm, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	if err == nil {
		var acked bool
		if acked, err = confirm.WaitContext(ctx); err == nil && acked {
			return nil
		}
	}
	delete(p.channels, backend)
	select {
	case closed := <-c.closed:
		switch {
		case closed != nil && closed.Code == amqp.NotFound:
			log.Warn("the dead-letter exchange is missing on a backend; the message is dropped there, as RabbitMQ drops it",
				"to", backend, "exchange", exchange)
			return nil
		case closed != nil && closed.Code == amqp.PreconditionFailed && msg.UserId != "":
			// The broker takes a user_id other than the publisher's only
			// from an account with RabbitMQ's impersonator tag. A message
			// stuck here would hold up every later one.
			log.Warn("the proxy's account may not publish another user's user_id (RabbitMQ's impersonator tag); the message goes on without it",
				"to", backend, "exchange", exchange, "err", closed)
			msg.UserId = ""
			return p.publish(ctx, backend, exchange, key, msg, log)
		}
	default:
		c.ch.Close()
	}
	if err == nil {
		err = errors.New("nacked")
	}
	return fmt.Errorf("publishing to exchange %q on %s: %w", exchange, backend, err)
}

// channel returns backend's channel, opened when missing.
func (p *deadLetterPublisher) channel(backend string) (*confirmingChannel, error) {
	if c, ok := p.channels[backend]; ok {
		return c, nil
	}
	conn := p.own
	if backend != p.backend {
		conn = p.conns[backend]
		if conn == nil || conn.IsClosed() {
			var err error
			if conn, err = p.operator.dialFor(backend, p.vhost, "dead-letter forwarder"); err != nil {
				return nil, err
			}
			if p.conns == nil {
				p.conns = make(map[string]*amqp.Connection)
			}
			p.conns[backend] = conn
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a channel on %s: %w", backend, err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("confirm mode on %s: %w", backend, err)
	}
	c := &confirmingChannel{ch: ch, closed: ch.NotifyClose(make(chan *amqp.Error, 1))}
	if p.channels == nil {
		p.channels = make(map[string]*confirmingChannel)
	}
	p.channels[backend] = c
	return c, nil
}

// close closes the connections the publisher opened.
func (p *deadLetterPublisher) close() {
	for _, c := range p.conns {
		c.Close()
	}
}
