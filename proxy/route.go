package proxy

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// This file decides which links a client method reaches. Without mirroring
// every method goes to the home link. With it (a Mirror is configured):
//
//   - exchanges and exchange bindings: every backend;
//   - a queue's declare, bind, unbind and delete: every backend holding a
//     copy (its master and slaves); purge, consume and get: the master;
//     exclusive and server-named queues live on the home backend and are
//     never mirrored;
//   - publishes: to the default exchange, every copy of the named queue;
//     to another exchange, every backend (each routes to the copies it
//     holds);
//   - channel-wide methods (qos, confirm.select, tx, recover, flow): every
//     link the channel is open on, and repeated on links it opens on later
//     (channelwide.go).

// router is a client connection's routing: where each client method goes
// (this file, channelwide.go, exchanges.go, replyto.go), where a publish
// goes (publish.go), where a kept transaction's frames wait until its
// commit (txemulated.go), and how a request is sent to its links and their
// replies matched to it (rpc.go); where a queue lives and how its master
// is reached is its locator's (queueLocator, queue_locator.go). It holds
// what routing uses of the connection, the state routing keeps, and the
// connection's own work it calls. The connection holds it by value and
// passes it by pointer to each channel's publisher with every publish.
//
// The client loop routes every client method through it. The link read
// loops match the links' replies to routed requests through it
// (replyArrived, abandonReply) and run what a request does once answered
// (rpcGroup.after: records in the Mirror and in declared, or
// bindingNotRecorded); whoever loses a link settles the replies it owed
// (settleLostReply). The consumerMover reaches links (reach, holding the
// send gate) and asks the locator whether a promotion is pending
// (queueLocator.promotionPending). Who touches what:
//
//   - everything but identities, declared and the locator's memory of
//     unrecorded queues is set once by clientConn.open under
//     clientConn.mu, before the connection counts as open, and only read
//     after;
//   - identities belong to the client loop and have no lock; so does the
//     locator's unrecorded;
//   - declared keeps its own lock (declaredQueues.mu): the link loops and
//     the client loop add to it, the views read it.
type router struct {
	srv    *Server // the backends, their indexes and names, the counts
	mirror Mirror  // nil without mirroring
	links  *linkSet
	vhost  string
	log    *slog.Logger
	ctx    context.Context // ends with the connection
	// out writes to the client the replies to routed requests and the
	// proxy's own (a copy of the connection's). settler is the
	// connection's: a publish calls it only to pass on the confirms it
	// settled at once, its copies' links being lost.
	out     clientOut
	settler *settler
	// identities numbers the published messages.
	identities identities
	// locator finds where a queue lives and reaches its master
	// (queue_locator.go).
	locator queueLocator
	// declared are the queues this connection declared that the log does
	// not record, for list_queues.
	declared declaredQueues

	// The connection's own work. A publish calls it only when a route is
	// decided, a link opens or a write fails; a route kept for the next
	// publish calls none of it. dial and run open a link
	// (linkKeeper.openLink, runLink).
	dial        func(i int) (*wire.Socket, error)
	run         func(l *link)
	writeFailed func(l *link, err error)
	// closeChannel closes a channel for a reason the proxy found
	// (clientConn.closeChannelByProxy); atBoundary runs work once the
	// client loop is between messages on a channel (sendGate.atBoundary).
	closeChannel func(ch *channelState, code uint16, text string, classID, methodID uint16)
	atBoundary   func(ch *channelState, run func())
}

// mirrorTimeout bounds a call to the engine made for a client request.
const mirrorTimeout = 10 * time.Second

// mirrorContext bounds a call to the engine made for a client request, on
// a connection whose calls run under ctx.
func mirrorContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, mirrorTimeout)
}

// reach returns the links to the named backends with the channel open on
// each, opening what is missing; a backend that cannot be reached is left
// out (and logged by openLink). The client loop calls it, and the failover
// of consumers holding the send gate (sendGate).
func (rt *router) reach(ch *channelState, backends ...string) []*link {
	out := ch.reachable[:0]
	for _, name := range backends {
		i, ok := rt.srv.backendIndex[name]
		if !ok {
			continue
		}
		l, err := rt.links.ensure(i, rt.dial, rt.run)
		if err != nil {
			continue
		}
		if err := ensureChannel(ch, l); err != nil {
			rt.writeFailed(l, err)
			continue
		}
		out = append(out, l)
	}
	ch.reachable = out
	return out
}

// reachAll returns every backend's link with the channel open on it, in
// backend order.
func (rt *router) reachAll(ch *channelState) []*link {
	return rt.reach(ch, rt.srv.backendNames...)
}

// sendTo sends f to targets (the home link when there are none).
func (rt *router) sendTo(ch *channelState, f frames.Frame, after func([]byte) []byte, targets []*link, wantReply bool) {
	if len(targets) == 0 {
		if home := rt.links.home(); home != nil {
			targets = rt.reach(ch, home.name)
		}
		if len(targets) == 0 {
			return
		}
	}
	rt.send(ch, f, targets, wantReply, after)
}

// queueMethod is the part of a queue method routing needs.
type queueMethod struct {
	queue     string
	noWait    bool
	passive   bool
	exclusive bool
	declare   *frames.QueueDeclare
	binding   mirror.Binding
}

func decodeQueueMethod(key uint32, args []byte) (queueMethod, error) {
	var q queueMethod
	switch key {
	case frames.QueueDeclareKey:
		d := &frames.QueueDeclare{}
		if err := d.Decode(args); err != nil {
			return q, err
		}
		q.queue, q.noWait, q.passive, q.exclusive, q.declare = d.Queue, d.NoWait, d.Passive, d.Exclusive, d
	case frames.QueueBindKey:
		var d frames.QueueBind
		if err := d.Decode(args); err != nil {
			return q, err
		}
		q.queue, q.noWait = d.Queue, d.NoWait
		q.binding = mirror.Binding{Exchange: d.Exchange, RoutingKey: d.RoutingKey, Arguments: encodeTable(d.Arguments)}
	case frames.QueueUnbindKey:
		var d frames.QueueUnbind
		if err := d.Decode(args); err != nil {
			return q, err
		}
		q.queue = d.Queue
		q.binding = mirror.Binding{Exchange: d.Exchange, RoutingKey: d.RoutingKey, Arguments: encodeTable(d.Arguments)}
	case frames.QueuePurgeKey:
		var d frames.QueuePurge
		if err := d.Decode(args); err != nil {
			return q, err
		}
		q.queue, q.noWait = d.Queue, d.NoWait
	case frames.QueueDeleteKey:
		var d frames.QueueDelete
		if err := d.Decode(args); err != nil {
			return q, err
		}
		q.queue, q.noWait = d.Queue, d.NoWait
	}
	return q, nil
}

func encodeTable(t frames.Table) []byte {
	if len(t) == 0 {
		return nil
	}
	b, err := frames.AppendTable(nil, t)
	if err != nil {
		return nil
	}
	return b
}

// queueMethod routes queue.declare, bind, unbind, purge and delete.
func (rt *router) queueMethod(ch *channelState, f frames.Frame, key uint32, args []byte) error {
	if rt.mirror == nil {
		rt.sendTo(ch, f, nil, rt.links.homeOnly(), true)
		return nil
	}
	q, err := decodeQueueMethod(key, args)
	if err != nil {
		return err
	}
	wantReply := !q.noWait
	if mirror.IsReplyTo(q.queue) {
		return rt.replyQueueMethod(ch, f, key, q, wantReply)
	}
	if q.queue == "" || q.exclusive && !q.passive {
		// Server-named and exclusive queues live where the client is. A
		// passive declare names a queue that exists, wherever it lives,
		// and the broker reads none of its other flags: its count is the
		// master's, exclusive flag or not.
		home := rt.links.homeOnly()
		after := rt.bindAtHome(ch, key, q, wantReply)
		if key == frames.QueueDeclareKey && !q.passive && len(home) > 0 {
			after = rt.declaredAt(home[0], q, wantReply)
		}
		rt.sendTo(ch, f, after, home, wantReply)
		return nil
	}
	id := mirror.QueueID{VHost: rt.vhost, Name: q.queue}
	meta, found := rt.locator.locate(q.queue)
	if !found {
		if key != frames.QueueDeclareKey || q.passive {
			// The home broker answers 404 as RabbitMQ would (or binds a
			// queue it has that could not be located).
			rt.sendTo(ch, f, rt.bindAtHome(ch, key, q, wantReply), rt.links.homeOnly(), wantReply)
			return nil
		}
		return rt.declareNew(ch, f, q, wantReply)
	}
	meta, master := rt.locator.reachMaster(ch, meta)
	if len(master) == 0 {
		rt.locator.masterDown(ch, meta, f)
		return nil
	}
	masterLink := master[0]
	if key == frames.QueueDeclareKey && !q.passive && meta.ForwardsDeadLetters {
		// Its copies dead-letter into the proxy's exchange, so the broker
		// cannot compare the client's dead-letter arguments with those
		// declared first: the record can.
		if text := mirror.DeadLetterEquivalence(q.queue, rt.vhost, meta.Arguments, encodeTable(q.declare.Arguments)); text != "" {
			rt.closeChannel(ch, frames.PreconditionFailed, text, 50, 10)
			return nil
		}
		d := *q.declare
		d.Arguments = mirror.BrokerTable(d.Arguments)
		f = frames.Frame{Type: frames.FrameMethod, Channel: f.Channel, Payload: d.Append(nil)}
	}
	switch key {
	case frames.QueueDeclareKey, frames.QueuePurgeKey:
		var after func([]byte) []byte
		if key == frames.QueuePurgeKey && len(meta.Slaves) > 0 {
			after = func(reply []byte) []byte {
				ctx, cancel := mirrorContext(rt.ctx)
				defer cancel()
				rt.mirror.Purged(ctx, id)
				return reply
			}
		}
		rt.sendTo(ch, f, after, []*link{masterLink}, wantReply)
	case frames.QueueDeleteKey:
		rt.deleteQueue(ch, f, meta, masterLink, wantReply)
	default: // bind, unbind: every copy
		targets := append([]*link{masterLink}, rt.reach(ch, slaveNames(meta)...)...)
		after := func(reply []byte) []byte {
			ctx, cancel := mirrorContext(rt.ctx)
			defer cancel()
			var err error
			switch {
			case key == frames.QueueBindKey && meta.Version == 0:
				// A queue the log does not record (exclusive, or
				// server-named): its binding is not in the log either.
				err = rt.boundUnrecorded(q.binding.Exchange, meta.Master)
			case key == frames.QueueBindKey:
				err = rt.mirror.Bound(ctx, id, q.binding, true)
			case key == frames.QueueUnbindKey:
				// Left in the log, a removed binding only widens routes.
				_ = rt.mirror.Bound(ctx, id, q.binding, false)
			}
			if err != nil {
				rt.bindingNotRecorded(ch, key, err)
				return nil
			}
			return reply
		}
		if !wantReply {
			after(nil)
			after = nil
		}
		rt.sendTo(ch, f, after, targets, wantReply)
	}
	return nil
}

// bindAtHome returns, for a queue.bind sent to the home backend only (a
// queue the log does not record: the channel's last declared one, or one
// that could not be located), what records that the exchange's publishes
// must reach the home backend; nil for other methods. With no-wait it
// records at once and returns nil.
func (rt *router) bindAtHome(ch *channelState, key uint32, q queueMethod, wantReply bool) func([]byte) []byte {
	home := rt.links.home()
	if home == nil || key != frames.QueueBindKey {
		return nil
	}
	after := func(reply []byte) []byte {
		if err := rt.boundUnrecorded(q.binding.Exchange, home.name); err != nil {
			rt.bindingNotRecorded(ch, key, err)
			return nil
		}
		return reply
	}
	if !wantReply {
		after(nil)
		return nil
	}
	return after
}

// deleteQueue deletes a queue: the client's queue.delete goes to the master,
// whose answer the client gets (if-unused and if-empty are the master's to
// judge: the proxy's own consumer sits on every slave). Once the master's
// copy is gone, the engine forgets the queue and a plain queue.delete goes
// to every other backend, a slave or not: deleting a missing queue is
// harmless in RabbitMQ, and a copy the engine was adding at that moment
// goes too.
func (rt *router) deleteQueue(ch *channelState, f frames.Frame, meta mirror.QueueMeta, master *link, wantReply bool) {
	var others []*link
	for _, l := range rt.reachAll(ch) {
		if l != master {
			others = append(others, l)
		}
	}
	deleteCopies := func(reply []byte) []byte {
		ctx, cancel := mirrorContext(rt.ctx)
		rt.mirror.Deleted(ctx, meta.ID)
		cancel()
		rt.declared.forget(meta.ID.Name)
		for _, l := range others {
			l.expect(ch.id, nil)
			if err := l.sock.WriteMethod(ch.id, &frames.QueueDelete{Queue: meta.ID.Name}); err != nil {
				rt.writeFailed(l, err)
				continue
			}
			l.sock.Flush()
		}
		return reply
	}
	if !wantReply {
		rt.sendTo(ch, f, nil, []*link{master}, false)
		deleteCopies(nil)
		return
	}
	rt.sendTo(ch, f, deleteCopies, []*link{master}, true)
}

func slaveNames(m mirror.QueueMeta) []string {
	out := make([]string, len(m.Slaves))
	for i, s := range m.Slaves {
		out[i] = s.Backend
	}
	return out
}

// declareNew places a new queue and declares it on its master and every
// slave; the client gets the master's declare-ok once every copy exists and
// the engine recorded the queue.
func (rt *router) declareNew(ch *channelState, f frames.Frame, q queueMethod, wantReply bool) error {
	d := q.declare
	meta := mirror.QueueMeta{
		ID:         mirror.QueueID{VHost: rt.vhost, Name: q.queue},
		Durable:    d.Durable,
		AutoDelete: d.AutoDelete,
		Arguments:  encodeTable(d.Arguments),
	}
	ctx, cancel := mirrorContext(rt.ctx)
	placed, err := rt.mirror.Place(ctx, meta, rt.srv.opts.ClientNode)
	cancel()
	if err != nil {
		code, text := uint16(frames.InternalError), "INTERNAL_ERROR - cannot place queue: "+err.Error()
		if errors.Is(err, mirror.ErrUnknownLocator) {
			code, text = frames.PreconditionFailed, "PRECONDITION_FAILED - "+err.Error()
		}
		rt.closeChannel(ch, code, text, 50, 10)
		return nil
	}
	master := rt.reach(ch, placed.Master)
	if len(master) == 0 {
		rt.closeChannel(ch, frames.InternalError,
			"INTERNAL_ERROR - backend "+placed.Master+" for the queue's master is unreachable", 50, 10)
		return nil
	}
	masterLink := master[0]
	slaves := rt.reach(ch, slaveNames(placed)...)
	// The copies of a queue that drops its head dead-letter into the
	// proxy's exchange (mirror.BrokerArguments).
	arguments := d.Arguments
	if placed.ForwardsDeadLetters {
		arguments = mirror.BrokerTable(arguments)
	}
	// Slaves are never auto-delete: the proxy's own consumer on a slave
	// comes and goes, and the engine removes slaves when the master goes.
	slaveDecl := *d
	slaveDecl.AutoDelete = false
	slaveDecl.NoWait = false
	slaveDecl.Arguments = arguments
	kept := placed.Slaves[:0]
	for _, s := range placed.Slaves {
		for _, l := range slaves {
			if l.name == s.Backend {
				kept = append(kept, s)
			}
		}
	}
	placed.Slaves = kept
	var g *rpcGroup
	g = &rpcGroup{pending: 1 + len(slaves), primary: masterLink.idx, after: func(reply []byte) []byte {
		ctx, cancel := mirrorContext(rt.ctx)
		defer cancel()
		if _, err := rt.mirror.Declared(ctx, placed); err != nil {
			rt.log.Warn("queue declared but not recorded", "queue", q.queue, "err", err)
		}
		if !wantReply {
			return nil
		}
		return reply
	}}
	masterLink.expect(ch.id, g)
	noWaitOff := *d
	noWaitOff.NoWait = false
	noWaitOff.Arguments = arguments
	if err := masterLink.sock.WriteMethod(ch.id, &noWaitOff); err != nil {
		rt.writeFailed(masterLink, err)
	}
	for _, l := range slaves {
		l.expect(ch.id, g)
		if err := l.sock.WriteMethod(ch.id, &slaveDecl); err != nil {
			rt.writeFailed(l, err)
		}
	}
	return nil
}

// consume starts a consumer on the queue's master.
func (rt *router) consume(ch *channelState, f frames.Frame, args []byte) error {
	d := &ch.clientConsume
	if err := d.Decode(args); err != nil {
		return err
	}
	if d.Queue == mirror.ReplyToQueue && rt.mirror != nil {
		return rt.consumeReplyTo(ch, f, d)
	}
	target, ref, ok := rt.locator.masterOf(ch, d.Queue, f)
	if !ok {
		return nil
	}
	targets := []*link{target}
	cons := consumer{noAck: d.NoAck, link: targets[0].idx, queue: ref, queueName: d.Queue, exclusive: d.Exclusive, arguments: d.Arguments}
	if ch.qos != nil && !ch.qos.Global {
		cons.prefetch = ch.qos.PrefetchCount
	}
	if ref != nil {
		cons.args = append([]byte(nil), args...)
		if v, ok := d.Arguments.Get("x-cancel-on-ha-failover"); ok {
			cons.cancelOnFailover, _ = v.(bool)
		}
	}
	tag := d.ConsumerTag
	if tag != "" || d.NoWait {
		// With no tag and no-wait, the server picks a tag the client never
		// learns; deliveries with an unknown tag take this consumer's mode.
		ch.addConsumer(tag, cons)
	}
	var after func([]byte) []byte
	if tag == "" && !d.NoWait {
		after = func(reply []byte) []byte {
			var ok frames.BasicConsumeOk
			if decodeArgs(reply, &ok) == nil {
				ch.addConsumer(ok.ConsumerTag, cons)
			}
			return reply
		}
	}
	rt.sendTo(ch, f, after, targets, !d.NoWait)
	return nil
}

// get asks the queue's master for a message.
func (rt *router) get(ch *channelState, f frames.Frame, args []byte) error {
	d := &ch.clientGet
	if err := d.Decode(args); err != nil {
		return err
	}
	target, ref, ok := rt.locator.masterOf(ch, d.Queue, f)
	if !ok {
		return nil
	}
	g := &rpcGroup{pending: 1, primary: target.idx, get: &pendingGet{noAck: d.NoAck, queue: ref}}
	target.expect(ch.id, g)
	if err := target.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
		rt.writeFailed(target, err)
	}
	return nil
}

// cancel ends a consumer on the link it consumes on.
func (rt *router) cancel(ch *channelState, f frames.Frame, args []byte) error {
	var d frames.BasicCancel
	if err := d.Decode(args); err != nil {
		return err
	}
	cons, known := ch.clientCancels(d.ConsumerTag)
	targets := rt.links.homeOnly()
	if known {
		// A broker answers the cancel of a tag it does not know with
		// cancel-ok, so the cancel of an orphan goes to its old master
		// whether or not that still has it.
		if l := rt.links.at(cons.link); l != nil && l.channelOpen(ch.id) {
			targets = []*link{l}
		}
	}
	forget := func(reply []byte) []byte {
		ch.removeConsumer(d.ConsumerTag)
		return reply
	}
	if d.NoWait {
		forget(nil)
		forget = nil
	}
	rt.cancelReplyTo(ch, d.ConsumerTag, targets)
	rt.sendTo(ch, f, forget, targets, !d.NoWait)
	return nil
}

// returnCounts counts, per message identity, the backends that returned a
// mandatory publish sent to several of them: the client gets the return
// only when every one did (no backend routed it). Entries of messages that
// were routed somewhere are never completed, so the oldest are forgotten
// beyond a bound.
type returnCounts struct {
	want  map[mirror.MessageID]int
	order []mirror.MessageID
}

const maxReturnCounts = 4096

func (r *returnCounts) expect(id mirror.MessageID, backends int) {
	if r.want == nil {
		r.want = make(map[mirror.MessageID]int)
	}
	if len(r.order) >= maxReturnCounts {
		delete(r.want, r.order[0])
		r.order = r.order[1:]
	}
	r.want[id] = backends
	r.order = append(r.order, id)
}

// arrived counts one backend's return of id and reports whether the client
// gets it now.
func (r *returnCounts) arrived(id mirror.MessageID) bool {
	n, ok := r.want[id]
	if !ok {
		return true
	}
	if n--; n > 0 {
		r.want[id] = n
		return false
	}
	delete(r.want, id)
	return true
}
