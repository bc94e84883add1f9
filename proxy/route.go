package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
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
//     link the channel is open on, and repeated on links it opens on later.

// publishing is the publish whose content the client is sending.
type publishing struct {
	targets  []*link
	identify bool // add the identity header: the message has several copies, or may have later
	returns  int  // a mandatory publish sent to several backends: how many
	// inContent is set from the publish method to its last content frame:
	// nothing else may be written on the channel's links meanwhile.
	inContent bool
	remaining uint64 // body bytes still to come
	// seq is the publish's number in the channel's confirms when it is a
	// mirrored queue's (its master's nack then removes the slaves' copies),
	// 0 otherwise.
	seq uint64
}

// mirrorTimeout bounds a call to the engine made for a client request.
const mirrorTimeout = 10 * time.Second

func (c *clientConn) mirrorContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.ctx, mirrorTimeout)
}

// reach returns the links to the named backends with the channel open on
// each, opening what is missing; a backend that cannot be reached is left
// out (and logged by openLink).
func (c *clientConn) reach(ch *channelState, backends ...string) []*link {
	out := ch.reachable[:0]
	for _, name := range backends {
		i, ok := c.srv.backendIndex[name]
		if !ok {
			continue
		}
		l, err := c.links.ensure(i, c.openLink, c.runLink)
		if err != nil {
			continue
		}
		if err := c.ensureChannel(ch, l); err != nil {
			c.writeFailed(l, err)
			continue
		}
		out = append(out, l)
	}
	ch.reachable = out
	return out
}

// reachAll returns every backend's link with the channel open on it, in
// backend order.
func (c *clientConn) reachAll(ch *channelState) []*link {
	return c.reach(ch, c.srv.backendNames...)
}

// sendTo sends f to targets (the home link when there are none).
func (c *clientConn) sendTo(ch *channelState, f frames.Frame, after func([]byte) []byte, targets []*link, wantReply bool) {
	if len(targets) == 0 {
		if home := c.links.home(); home != nil {
			targets = c.reach(ch, home.name)
		}
		if len(targets) == 0 {
			return
		}
	}
	c.send(ch, f, targets, wantReply, after)
}

// onOpenLinks sends a channel-wide method to every link the channel is open
// on; the first answers. settingOk is the reply to a setting the proxy
// repeats on every link it opens later (basic.qos, confirm.select,
// tx.select: ensureChannel), nil for other methods: when no link can take
// the setting now, or every link asked is lost before it answers, the
// setting still holds, and the proxy answers it.
func (c *clientConn) onOpenLinks(ch *channelState, f frames.Frame, wantReply bool, settingOk frames.Method) error {
	targets := c.links.openOn(ch)
	if len(targets) > 1 && f.Type == frames.FrameMethod && isMethod(f.Payload, frames.ConfirmSelectKey) {
		for _, l := range targets {
			l.selectConfirm(ch.id)
		}
	}
	if len(targets) == 0 {
		if home := c.links.home(); home != nil {
			targets = c.reach(ch, home.name)
		}
	}
	switch {
	case len(targets) > 0:
		c.sendGroup(ch, f, targets, newGroup(targets, wantReply, nil, settingOk))
	case wantReply && settingOk != nil:
		c.toClientMethodOnChannel(ch, settingOk)
	}
	return nil
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

// locate returns where a queue lives: from the metadata log, or found on
// the backends (adopted). ok is false when no backend has it.
func (c *clientConn) locate(name string) (mirror.QueueMeta, bool) {
	if mirror.IsReplyTo(name) {
		// No backend holds it; a passive declare of it would count as found.
		return mirror.QueueMeta{}, false
	}
	id := mirror.QueueID{VHost: c.terms.vhost, Name: name}
	if m, ok := c.srv.opts.Mirror.Lookup(id); ok {
		return m, true
	}
	if m, ok := c.unrecorded[name]; ok {
		return m, true
	}
	ctx, cancel := c.mirrorContext()
	defer cancel()
	m, ok, err := c.srv.opts.Mirror.Resolve(ctx, id)
	if err != nil {
		c.log.Warn("cannot locate queue", "queue", name, "err", err)
		return m, false
	}
	if ok && m.Version == 0 {
		// An exclusive queue of some connection: never recorded, and it
		// never moves, so this connection remembers where it is (an RPC
		// server publishes every reply to one).
		if c.unrecorded == nil || len(c.unrecorded) >= maxUnrecorded {
			c.unrecorded = make(map[string]mirror.QueueMeta)
		}
		c.unrecorded[name] = m
	}
	return m, ok
}

// maxUnrecorded bounds a connection's memory of exclusive queues.
const maxUnrecorded = 1024

// queueMethod routes queue.declare, bind, unbind, purge and delete.
func (c *clientConn) queueMethod(ch *channelState, f frames.Frame, key uint32, args []byte) error {
	if c.srv.opts.Mirror == nil {
		c.sendTo(ch, f, nil, c.links.homeOnly(), true)
		return nil
	}
	q, err := decodeQueueMethod(key, args)
	if err != nil {
		return err
	}
	wantReply := !q.noWait
	if mirror.IsReplyTo(q.queue) {
		return c.replyQueueMethod(ch, f, key, q, wantReply)
	}
	if q.queue == "" || q.exclusive && !q.passive {
		// Server-named and exclusive queues live where the client is. A
		// passive declare names a queue that exists, wherever it lives,
		// and the broker reads none of its other flags: its count is the
		// master's, exclusive flag or not.
		home := c.links.homeOnly()
		after := c.bindAtHome(ch, key, q, wantReply)
		if key == frames.QueueDeclareKey && !q.passive && len(home) > 0 {
			after = c.declaredAt(home[0], q, wantReply)
		}
		c.sendTo(ch, f, after, home, wantReply)
		return nil
	}
	id := mirror.QueueID{VHost: c.terms.vhost, Name: q.queue}
	meta, found := c.locate(q.queue)
	if !found {
		if key != frames.QueueDeclareKey || q.passive {
			// The home broker answers 404 as RabbitMQ would (or binds a
			// queue it has that could not be located).
			c.sendTo(ch, f, c.bindAtHome(ch, key, q, wantReply), c.links.homeOnly(), wantReply)
			return nil
		}
		return c.declareNew(ch, f, q, wantReply)
	}
	meta, master := c.reachMaster(ch, meta)
	if len(master) == 0 {
		c.masterDown(ch, meta, f)
		return nil
	}
	masterLink := master[0]
	switch key {
	case frames.QueueDeclareKey, frames.QueuePurgeKey:
		var after func([]byte) []byte
		if key == frames.QueuePurgeKey && len(meta.Slaves) > 0 {
			after = func(reply []byte) []byte {
				ctx, cancel := c.mirrorContext()
				defer cancel()
				c.srv.opts.Mirror.Purged(ctx, id)
				return reply
			}
		}
		c.sendTo(ch, f, after, []*link{masterLink}, wantReply)
	case frames.QueueDeleteKey:
		c.deleteQueue(ch, f, meta, masterLink, wantReply)
	default: // bind, unbind: every copy
		targets := append([]*link{masterLink}, c.reach(ch, slaveNames(meta)...)...)
		after := func(reply []byte) []byte {
			ctx, cancel := c.mirrorContext()
			defer cancel()
			var err error
			switch {
			case key == frames.QueueBindKey && meta.Version == 0:
				// A queue the log does not record (exclusive, or
				// server-named): its binding is not in the log either.
				err = c.boundUnrecorded(q.binding.Exchange, meta.Master)
			case key == frames.QueueBindKey:
				err = c.srv.opts.Mirror.Bound(ctx, id, q.binding, true)
			case key == frames.QueueUnbindKey:
				// Left in the log, a removed binding only widens routes.
				_ = c.srv.opts.Mirror.Bound(ctx, id, q.binding, false)
			}
			if err != nil {
				c.bindingNotRecorded(ch, key, err)
				return nil
			}
			return reply
		}
		if !wantReply {
			after(nil)
			after = nil
		}
		c.sendTo(ch, f, after, targets, wantReply)
	}
	return nil
}

// bindAtHome returns, for a queue.bind sent to the home backend only (a
// queue the log does not record: the channel's last declared one, or one
// that could not be located), what records that the exchange's publishes
// must reach the home backend; nil for other methods. With no-wait it
// records at once and returns nil.
func (c *clientConn) bindAtHome(ch *channelState, key uint32, q queueMethod, wantReply bool) func([]byte) []byte {
	home := c.links.home()
	if home == nil || key != frames.QueueBindKey {
		return nil
	}
	after := func(reply []byte) []byte {
		if err := c.boundUnrecorded(q.binding.Exchange, home.name); err != nil {
			c.bindingNotRecorded(ch, key, err)
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
func (c *clientConn) deleteQueue(ch *channelState, f frames.Frame, meta mirror.QueueMeta, master *link, wantReply bool) {
	var others []*link
	for _, l := range c.reachAll(ch) {
		if l != master {
			others = append(others, l)
		}
	}
	deleteCopies := func(reply []byte) []byte {
		ctx, cancel := c.mirrorContext()
		c.srv.opts.Mirror.Deleted(ctx, meta.ID)
		cancel()
		c.declared.forget(meta.ID.Name)
		for _, l := range others {
			l.expect(ch.id, nil)
			if err := l.sock.WriteMethod(ch.id, &frames.QueueDelete{Queue: meta.ID.Name}); err != nil {
				c.writeFailed(l, err)
				continue
			}
			l.sock.Flush()
		}
		return reply
	}
	if !wantReply {
		c.sendTo(ch, f, nil, []*link{master}, false)
		deleteCopies(nil)
		return
	}
	c.sendTo(ch, f, deleteCopies, []*link{master}, true)
}

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
func (c *clientConn) reachMaster(ch *channelState, meta mirror.QueueMeta) (mirror.QueueMeta, []*link) {
	// The link to a master's backend counted down a moment ago may still
	// be open (checkLinks drops it within masterCheckInterval), and a
	// request sent there is lost with it: with a promotion on its way, the
	// request waits for the new master instead.
	pending := c.promotionPending(meta)
	if !pending || !c.srv.opts.Mirror.BackendDown(meta.Master) {
		if master := c.reach(ch, meta.Master); len(master) > 0 || !pending {
			return meta, master
		}
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(promotionWait)
	for {
		select {
		case <-c.ctx.Done():
			return meta, nil
		case <-deadline:
			return meta, nil
		case <-tick.C:
		}
		now, ok := c.srv.opts.Mirror.Lookup(meta.ID)
		if !ok {
			return meta, nil
		}
		// A new master, or the old one not (or no longer) counted down:
		// one more try. A backend counted down is not dialled again.
		if now.Master != meta.Master || !c.srv.opts.Mirror.BackendDown(now.Master) {
			return now, c.reach(ch, now.Master)
		}
	}
}

// promotionPending reports whether a synchronised slave of meta is live,
// which the engine promotes when it counts the master down.
func (c *clientConn) promotionPending(meta mirror.QueueMeta) bool {
	m := c.srv.opts.Mirror
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
func (c *clientConn) masterDown(ch *channelState, meta mirror.QueueMeta, f frames.Frame) {
	classID, methodID, _, _ := frames.ParseMethodID(f.Payload)
	c.closeChannelByProxy(ch, frames.NotFound, fmt.Sprintf(
		"NOT_FOUND - home node '%s' of durable queue '%s' in vhost '%s' is down or inaccessible", meta.Master, meta.ID.Name, meta.ID.VHost),
		classID, methodID)
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
func (c *clientConn) declareNew(ch *channelState, f frames.Frame, q queueMethod, wantReply bool) error {
	d := q.declare
	meta := mirror.QueueMeta{
		ID:         mirror.QueueID{VHost: c.terms.vhost, Name: q.queue},
		Durable:    d.Durable,
		AutoDelete: d.AutoDelete,
		Arguments:  encodeTable(d.Arguments),
	}
	ctx, cancel := c.mirrorContext()
	placed, err := c.srv.opts.Mirror.Place(ctx, meta, c.srv.opts.ClientNode)
	cancel()
	if err != nil {
		code, text := uint16(frames.InternalError), "INTERNAL_ERROR - cannot place queue: "+err.Error()
		if errors.Is(err, mirror.ErrUnknownLocator) {
			code, text = frames.PreconditionFailed, "PRECONDITION_FAILED - "+err.Error()
		}
		c.closeChannelByProxy(ch, code, text, 50, 10)
		return nil
	}
	master := c.reach(ch, placed.Master)
	if len(master) == 0 {
		c.closeChannelByProxy(ch, frames.InternalError,
			"INTERNAL_ERROR - backend "+placed.Master+" for the queue's master is unreachable", 50, 10)
		return nil
	}
	masterLink := master[0]
	slaves := c.reach(ch, slaveNames(placed)...)
	// Slaves are never auto-delete: the proxy's own consumer on a slave
	// comes and goes, and the engine removes slaves when the master goes.
	slaveDecl := *d
	slaveDecl.AutoDelete = false
	slaveDecl.NoWait = false
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
		ctx, cancel := c.mirrorContext()
		defer cancel()
		if _, err := c.srv.opts.Mirror.Declared(ctx, placed); err != nil {
			c.log.Warn("queue declared but not recorded", "queue", q.queue, "err", err)
		}
		if !wantReply {
			return nil
		}
		return reply
	}}
	masterLink.expect(ch.id, g)
	noWaitOff := *d
	noWaitOff.NoWait = false
	if err := masterLink.sock.WriteMethod(ch.id, &noWaitOff); err != nil {
		c.writeFailed(masterLink, err)
	}
	for _, l := range slaves {
		l.expect(ch.id, g)
		if err := l.sock.WriteMethod(ch.id, &slaveDecl); err != nil {
			c.writeFailed(l, err)
		}
	}
	return nil
}

// masterOf returns the link a consume or get of queue goes to: its master's
// with mirroring (and the queue to trim, ref), the home link otherwise or
// for a queue no backend has (the broker answers 404). ok is false when the
// request was answered already (the master is down: 404) or there is no
// link at all.
func (c *clientConn) masterOf(ch *channelState, queue string, f frames.Frame) (target *link, ref *ledger.QueueRef, ok bool) {
	if c.srv.opts.Mirror != nil && queue != "" {
		if meta, found := c.locate(queue); found {
			meta, master := c.reachMaster(ch, meta)
			if len(master) == 0 {
				c.masterDown(ch, meta, f)
				return nil, nil, false
			}
			return master[0], &ledger.QueueRef{ID: meta.ID}, true
		}
	}
	home := c.links.homeOnly()
	if len(home) == 0 {
		return nil, nil, false
	}
	return home[0], nil, true
}

// consume starts a consumer on the queue's master.
func (c *clientConn) consume(ch *channelState, f frames.Frame, args []byte) error {
	d := &ch.clientConsume
	if err := d.Decode(args); err != nil {
		return err
	}
	if d.Queue == mirror.ReplyToQueue && c.srv.opts.Mirror != nil {
		return c.consumeReplyTo(ch, f, d)
	}
	target, ref, ok := c.masterOf(ch, d.Queue, f)
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
	c.sendTo(ch, f, after, targets, !d.NoWait)
	return nil
}

// get asks the queue's master for a message.
func (c *clientConn) get(ch *channelState, f frames.Frame, args []byte) error {
	d := &ch.clientGet
	if err := d.Decode(args); err != nil {
		return err
	}
	target, ref, ok := c.masterOf(ch, d.Queue, f)
	if !ok {
		return nil
	}
	g := &rpcGroup{pending: 1, primary: target.idx, get: &pendingGet{noAck: d.NoAck, queue: ref}}
	target.expect(ch.id, g)
	if err := target.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
		c.writeFailed(target, err)
	}
	return nil
}

// cancel ends a consumer on the link it consumes on.
func (c *clientConn) cancel(ch *channelState, f frames.Frame, args []byte) error {
	var d frames.BasicCancel
	if err := d.Decode(args); err != nil {
		return err
	}
	cons, known := ch.clientCancels(d.ConsumerTag)
	targets := c.links.homeOnly()
	if known {
		if l := c.links.at(cons.link); l != nil {
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
	c.cancelReplyTo(ch, d.ConsumerTag, targets)
	c.sendTo(ch, f, forget, targets, !d.NoWait)
	return nil
}

// publish sends a basic.publish to the backends that hold the copies it
// can reach; its content frames follow to the same backends
// (publishContent). A publish to an exchange waits for its content header:
// where it goes may depend on the message's headers (a headers exchange,
// the CC and BCC headers).
func (c *clientConn) publish(ch *channelState, f frames.Frame, args []byte) error {
	c.srv.stats.Publishes.Add(1)
	if c.srv.opts.Mirror == nil {
		ch.pub = publishing{targets: c.links.homeOnly()}
		if ch.confirming.Load() {
			ch.numberPublish(ch.arrival())
		}
		c.toBackend(f)
		return nil
	}
	p := &ch.clientPublish
	if err := p.Decode(args); err != nil {
		return err
	}
	if p.Exchange != "" {
		ch.pub = publishing{inContent: true}
		ch.heldPublish = append(ch.heldPublish[:0], f.Payload...)
		return nil
	}
	return c.sendPublish(ch, f.Payload, c.queueRoute(ch, p))
}

// sendDeferred sends a publish to an exchange, held until its content
// header came (header), or nil when a method or a body came instead: that
// is the client's protocol error, and the home broker answers it as it
// would have.
func (c *clientConn) sendDeferred(ch *channelState, header []byte) error {
	// The buffer is not written again before the next publish method.
	method := ch.heldPublish
	ch.heldPublish = method[:0]
	if header == nil {
		if home := c.links.homeOnly(); len(home) > 0 {
			if err := home[0].sock.WriteFrame(frames.FrameMethod, ch.id, method); err != nil {
				c.writeFailed(home[0], err)
			}
		}
		// Whatever content follows goes there too.
		ch.pub = publishing{targets: c.links.homeOnly()}
		return nil
	}
	return c.sendPublish(ch, method, c.exchangeRoute(ch, &ch.clientPublish, header))
}

// sendPublish numbers a publish for the confirms and sends its method to
// the route's targets.
func (c *clientConn) sendPublish(ch *channelState, method []byte, r *publishRoute) error {
	p := &ch.clientPublish
	targets, identify := r.targets, r.identify
	ch.pub = publishing{targets: targets, identify: identify, inContent: len(targets) > 0}
	if p.Mandatory && len(targets) > 1 {
		ch.pub.returns = len(targets)
	}
	confirming := ch.confirming.Load()
	if !confirming && len(targets) > 1 && !ch.ownConfirms.Load() && !ch.transactional {
		c.selectOwnConfirms(ch)
	}
	if confirming || ch.ownConfirms.Load() {
		seq, out := ch.numberCopies(r.CopySet, ch.arrival(), func(cs *ledger.CopySet) time.Time {
			return withoutLostCopies(targets, cs)
		})
		if r.Queue != nil && r.Queue != ledger.AnyQueue {
			ch.pub.seq = seq
		}
		if !confirming {
			if len(out) > 0 {
				ch.outMu.Lock()
				c.ownConfirmsAnswered(ch, out)
				ch.outMu.Unlock()
			}
			out = nil
		}
		for _, cc := range out {
			ch.outMu.Lock()
			c.writeConfirm(ch.id, cc)
			ch.outMu.Unlock()
			c.client.Flush()
		}
	}
	if len(targets) == 0 {
		ch.dropContent = true
		return nil
	}
	for _, l := range targets {
		if err := l.sock.WriteFrame(frames.FrameMethod, ch.id, method); err != nil {
			c.writeFailed(l, err)
		}
	}
	return nil
}

// selectOwnConfirms puts the channel's backend sides in confirm mode at its
// first publish to several copies, the client having selected neither
// confirms nor transactions: a slave that nacks a publish, or whose link
// breaks before it confirmed, may lack it and must not count as
// synchronised. confirm.select goes with no-wait, so no reply comes back;
// links the channel opens on later get it with the channel (ensureChannel).
func (c *clientConn) selectOwnConfirms(ch *channelState) {
	ch.ownConfirms.Store(true)
	for _, l := range c.links.openOn(ch) {
		if l.selectConfirm(ch.id) {
			if err := l.sock.WriteMethod(ch.id, &frames.ConfirmSelect{NoWait: true}); err != nil {
				c.writeFailed(l, err)
			}
		}
	}
}

// publishRoute is where a channel's publishes to one exchange and routing
// key go. It is kept while the queue's metadata (for an exchange: the
// routing table) and the connection's links stay as they were, so that a
// stream of publishes to one queue or exchange decides once.
type publishRoute struct {
	exchange, key string
	version       uint64               // the queue's metadata version; 0 for an exchange
	table         *mirror.RoutingTable // the routing table of an exchange's route
	links         uint64               // linkSet.changes when decided
	confirming    bool
	targets       []*link
	identify      bool
	// CopySet says which backends' confirms count (by index), which the
	// publish could not reach, and for which queue.
	ledger.CopySet
}

// begin starts deciding the route of p afresh, for a channel in confirm
// mode or not, in the buffers of the route it replaces.
func (r *publishRoute) begin(p *frames.BasicPublish, confirming bool) *publishRoute {
	*r = publishRoute{exchange: p.Exchange, key: p.RoutingKey, confirming: confirming,
		CopySet: ledger.CopySet{Quorum: r.Quorum[:0], Extra: r.Extra[:0], Unreached: r.Unreached[:0], Master: -1}}
	return r
}

// queueRoute decides, or recalls, where a publish to the default exchange
// goes: every copy of the queue its routing key names.
func (c *clientConn) queueRoute(ch *channelState, p *frames.BasicPublish) *publishRoute {
	if mirror.IsReplyTo(p.RoutingKey) {
		return c.replyRoute(ch, p)
	}
	r := &ch.route
	meta, found := c.srv.opts.Mirror.Lookup(mirror.QueueID{VHost: c.terms.vhost, Name: p.RoutingKey})
	if r.targets != nil && r.exchange == "" && r.key == p.RoutingKey && r.confirming == ch.confirming.Load() &&
		r.links == c.links.changes() && found && meta.Version == r.version {
		return r
	}
	r = ch.route.begin(p, ch.confirming.Load())
	if !found {
		meta, found = c.locate(p.RoutingKey)
	}
	if !found {
		// Not kept: the queue may appear any moment.
		return c.decided(r, c.links.homeOnly(), false)
	}
	targets := c.reach(ch, meta.Backends()...)
	// Identified even without slaves: a policy may mirror the queue
	// later, and its messages are then copied to the new slaves, whose
	// trimmers tell them apart by this identity; by content alone, two
	// messages with equal bodies are one.
	r.identify = true
	r.version = meta.Version
	if len(meta.Slaves) > 0 {
		r.Queue = &mirror.QueueID{VHost: meta.ID.VHost, Name: meta.ID.Name}
	}
	r.Master = c.srv.backendIndex[meta.Master]
	for _, l := range targets {
		if i := meta.SlaveIndex(l.name); i >= 0 && !meta.Slaves[i].Synchronised {
			r.Extra = append(r.Extra, l.idx)
		} else {
			r.Quorum = append(r.Quorum, l.idx)
		}
	}
	if r.Queue != nil {
		r.Unreached = unreachedCopies(meta, targets, c.srv.backendIndex, r.Unreached)
	}
	return c.decided(r, targets, len(targets) == 1+len(meta.Slaves))
}

// exchangeRoute decides, or recalls, where a publish to an exchange goes:
// the backends holding a copy of a queue it routes to, by the routing
// table of the metadata log, or every backend when the table cannot say.
// header is the message's content header; its headers table is read only
// when the route needs it (a headers exchange) or names more routing keys
// (CC, BCC), and such a route is not kept.
func (c *clientConn) exchangeRoute(ch *channelState, p *frames.BasicPublish, header []byte) *publishRoute {
	r := &ch.route
	table := c.srv.opts.Mirror.Routing()
	var headers []byte // the encoded table, from its size
	if start, end, present, err := frames.HeadersField(header); err == nil && present {
		headers = header[start:end]
	}
	hasCC := bytes.Contains(headers, ccKey) || bytes.Contains(headers, bccKey)
	if !hasCC && r.targets != nil && r.exchange == p.Exchange && r.key == p.RoutingKey && r.table == table &&
		r.confirming == ch.confirming.Load() && r.links == c.links.changes() {
		return r
	}
	r = ch.route.begin(p, ch.confirming.Load())
	r.table = table
	route := mirror.Route{All: true}
	keep := !hasCC
	if table != nil {
		msg := mirror.RoutedMessage{VHost: c.terms.vhost, Exchange: p.Exchange, RoutingKey: p.RoutingKey}
		if hasCC {
			msg.Headers, msg.HeadersKnown = decodeHeaders(headers)
		}
		if !hasCC || msg.HeadersKnown {
			route = table.Route(msg)
		}
		if route.NeedHeaders {
			keep = false
			if msg.Headers, msg.HeadersKnown = decodeHeaders(headers); msg.HeadersKnown {
				route = table.Route(msg)
			}
		}
	}
	wanted := route.Backends
	if route.All || route.NeedHeaders {
		wanted = c.srv.backendNames
	}
	targets := c.reach(ch, wanted...)
	r.identify = len(c.srv.backends) > 1
	if len(c.srv.backends) > 1 {
		r.Queue = ledger.AnyQueue
		for _, name := range wanted {
			i := c.srv.backendIndex[name]
			if !slices.ContainsFunc(targets, func(l *link) bool { return l.idx == i }) && c.srv.opts.Mirror.Holds(name, nil) {
				r.Unreached = append(r.Unreached, i)
			}
		}
	}
	return c.decided(r, targets, keep && len(targets) == len(wanted))
}

// The keys of the headers that add routing keys to a publish, as they
// appear in an encoded table (length octet, then the name).
var ccKey, bccKey = []byte("\x02CC"), []byte("\x03BCC")

// decodeHeaders decodes a message's headers table for routing; ok is false
// when it does not decode (the route is then every backend, whose brokers
// judge the message).
func decodeHeaders(encoded []byte) (frames.Table, bool) {
	if encoded == nil {
		return nil, true
	}
	t, _, err := frames.DecodeTable(encoded)
	return t, err == nil
}

// decided completes a route with its targets and keeps it for the next
// publish when keep is set. A route is not kept when a copy's backend
// could not be reached: it is tried again with the next publish (a copy
// that misses publishes must not stay unnoticed behind a remembered
// route).
func (c *clientConn) decided(r *publishRoute, targets []*link, keep bool) *publishRoute {
	r.targets = append([]*link(nil), targets...) // reach's slice is scratch
	if len(r.Quorum) == 0 && len(r.Extra) == 0 {
		for _, l := range r.targets {
			r.Quorum = append(r.Quorum, l.idx)
		}
	}
	if len(r.Quorum) == 0 && len(r.Unreached) == 0 && len(r.Extra) > 0 {
		r.Quorum, r.Extra = r.Extra, r.Quorum
	}
	r.links = c.links.changes()
	if len(r.Unreached) > 0 {
		c.reportUnreached(r)
	}
	if !keep {
		route := *r
		r.targets = nil
		return &route
	}
	return r
}

// reportUnreached reports the slave copies a publish cannot reach
// (r.unreached but the master): a link that broke a moment ago and is not
// dialled again yet, or a backend this proxy counts down while the log
// still has its slave synchronised (the engine handles that report once
// the backend is up again, if the log still does). They miss the publish.
func (c *clientConn) reportUnreached(r *publishRoute) {
	m := c.srv.opts.Mirror
	queue := r.Queue
	if queue == ledger.AnyQueue {
		queue = nil // any queue with a slave there
	}
	for _, i := range r.Unreached {
		name := c.srv.backends[i].Name
		if i == r.Master {
			continue
		}
		c.log.Debug("a publish cannot reach a slave copy", "backend", name, "queue", queueName(queue))
		m.Missed(name, queue)
	}
}

// withoutLostCopies takes out of cs the copies whose link among targets was
// lost since the route was decided, and returns when the lost quorum copies
// of a mirrored queue, which keep counting until the metadata records their
// loss, were lost (zero for none). The caller holds the channel's mu
// (channelState.numberCopies).
func withoutLostCopies(targets []*link, cs *ledger.CopySet) time.Time {
	var now time.Time
	if cs.Queue != nil {
		cs.Quorum, cs.Unreached = withoutLost(targets, cs.Quorum, cs.Unreached)
		if len(cs.Unreached) > 0 {
			now = time.Now()
		}
	} else {
		cs.Quorum, _ = withoutLost(targets, cs.Quorum, nil)
	}
	cs.Extra, _ = withoutLost(targets, cs.Extra, nil)
	if len(cs.Quorum) == 0 && len(cs.Unreached) == 0 && len(cs.Extra) > 0 {
		cs.Quorum, cs.Extra = cs.Extra, nil
	}
	return now
}

// withoutLost returns idxs without the backends whose link among targets
// was lost, and appends those to lost. The caller holds the channel's mu,
// under which a lost link settles its confirms; idxs is returned as it is
// when none was lost.
func withoutLost(targets []*link, idxs, lost []int) ([]int, []int) {
	var out []int
	for i, idx := range idxs {
		isLost := false
		for _, l := range targets {
			if l.idx == idx {
				isLost = l.isLost()
				break
			}
		}
		if isLost {
			lost = append(lost, idx)
		}
		if isLost && out == nil {
			out = append(make([]int, 0, len(idxs)), idxs[:i]...)
		} else if !isLost && out != nil {
			out = append(out, idx)
		}
	}
	if out == nil {
		return idxs, lost
	}
	return out, lost
}

// unreachedCopies appends to out the indexes (backendIndex) of the queue's
// master and synchronised slaves that targets do not reach.
func unreachedCopies(meta mirror.QueueMeta, targets []*link, backendIndex map[string]int, out []int) []int {
	reached := func(name string) bool {
		return slices.ContainsFunc(targets, func(l *link) bool { return l.name == name })
	}
	if !reached(meta.Master) {
		if i, ok := backendIndex[meta.Master]; ok {
			out = append(out, i)
		}
	}
	for _, s := range meta.Slaves {
		if s.Synchronised && !reached(s.Backend) {
			if i, ok := backendIndex[s.Backend]; ok {
				out = append(out, i)
			}
		}
	}
	return out
}

// publishContent sends a publish's content frame where its method went,
// adding the identity header to the content header of a message with
// several copies.
func (c *clientConn) publishContent(ch *channelState, f frames.Frame) error {
	if len(ch.heldPublish) > 0 {
		var header []byte // nil for a body where the header belongs
		if f.Type == frames.FrameHeader {
			header = f.Payload
		}
		if err := c.sendDeferred(ch, header); err != nil {
			return err
		}
		if ch.dropContent {
			return nil
		}
	}
	payload := f.Payload
	if f.Type == frames.FrameHeader {
		size, err := frames.HeaderBodySize(f.Payload)
		if err != nil {
			return err
		}
		ch.pub.remaining = size
		ch.pub.inContent = size > 0
	} else if n := uint64(len(f.Payload)); n >= ch.pub.remaining {
		ch.pub.remaining, ch.pub.inContent = 0, false
	} else {
		ch.pub.remaining -= n
	}
	if f.Type == frames.FrameHeader && ch.pub.identify {
		stamped, id, err := c.identities.stamp(f.Payload)
		if err != nil {
			return err
		}
		payload = stamped
		if ch.pub.returns > 1 || ch.pub.seq != 0 {
			ch.identifyPublish(id)
		}
	}
	for _, l := range ch.pub.targets {
		if err := l.sock.WriteFrame(f.Type, f.Channel, payload); err != nil {
			c.writeFailed(l, err)
		}
	}
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
