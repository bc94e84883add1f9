package proxy

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// This file is a channel's publishing side. A channel's publisher decides
// where each publish goes, keeps the route for the next publish to the same
// queue or exchange, numbers the publish for the confirms and passes its
// method and content frames to the links the route reaches.

// publisher is a client channel's publishing side: the publish whose
// content is coming, the method of a publish to an exchange held for its
// content header, and the route kept for the next publish. The channel
// holds it by value; it belongs to the client loop (which holds the
// connection's send gate while it handles a frame, so that others who hold
// the gate may read inContent). What it uses of its connection comes with
// each call: the connection's router.
type publisher struct {
	// ch is the channel it publishes on, whose confirms it numbers: the
	// one pointer a publish follows from the publisher.
	ch *channelState
	// current is the publish whose content frames are coming.
	current publishing
	// held is the method of a publish to an exchange, held until its
	// content header says where it goes (empty otherwise; the buffer is
	// kept for the next one).
	held  []byte
	route publishRoute
	// decoded is scratch for the publish method.
	decoded frames.BasicPublish
}

// inContent reports whether the channel is between a publish's method and
// its last content frame, when nothing else may be written on its links.
// The client loop, or a goroutine holding the send gate, reads it.
func (p *publisher) inContent() bool { return p.current.inContent }

// toHome passes a frame to the home link as it came.
func (rt *router) toHome(f frames.Frame) {
	home := rt.links.home()
	if home == nil {
		return
	}
	if err := home.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
		rt.writeFailed(home, err)
	}
}

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

// publish sends a basic.publish to the backends that hold the copies it
// can reach; its content frames follow to the same backends
// (publishContent). A publish to an exchange waits for its content header:
// where it goes may depend on the message's headers (a headers exchange,
// the CC and BCC headers).
func (p *publisher) publish(rt *router, f frames.Frame, args []byte) error {
	ch := p.ch
	rt.srv.stats.Publishes.Add(1)
	if rt.mirror == nil {
		p.current = publishing{targets: rt.links.homeOnly()}
		if ch.confirming.Load() {
			ch.confirms.numberPublish(ch.arrival())
		}
		rt.toHome(f)
		return nil
	}
	m := &p.decoded
	if err := m.Decode(args); err != nil {
		return err
	}
	if m.Exchange != "" {
		p.current = publishing{inContent: true}
		p.held = append(p.held[:0], f.Payload...)
		return nil
	}
	return p.sendPublish(rt, f.Payload, p.queueRoute(rt, m))
}

// methodArrived sends a publish to an exchange held for its content header
// on to the home broker when a method comes where the header belongs.
func (p *publisher) methodArrived(rt *router) error {
	if len(p.held) == 0 {
		return nil
	}
	return p.sendDeferred(rt, nil)
}

// sendDeferred sends a publish to an exchange, held until its content
// header came (header), or nil when a method or a body came instead: that
// is the client's protocol error, and the home broker answers it as it
// would have.
func (p *publisher) sendDeferred(rt *router, header []byte) error {
	ch := p.ch
	// The buffer is not written again before the next publish method.
	method := p.held
	p.held = method[:0]
	if header == nil {
		if home := rt.links.homeOnly(); len(home) > 0 {
			if err := home[0].sock.WriteFrame(frames.FrameMethod, ch.id, method); err != nil {
				rt.writeFailed(home[0], err)
			}
		}
		// Whatever content follows goes there too.
		p.current = publishing{targets: rt.links.homeOnly()}
		return nil
	}
	return p.sendPublish(rt, method, p.exchangeRoute(rt, &p.decoded, header))
}

// sendPublish numbers a publish for the confirms and sends its method to
// the route's targets.
func (p *publisher) sendPublish(rt *router, method []byte, r *publishRoute) error {
	ch := p.ch
	m := &p.decoded
	targets, identify := r.targets, r.identify
	p.current = publishing{targets: targets, identify: identify, inContent: len(targets) > 0}
	if m.Mandatory && len(targets) > 1 {
		p.current.returns = len(targets)
	}
	confirming := ch.confirming.Load()
	if !confirming && len(targets) > 1 && !ch.ownConfirms.Load() && !ch.transactional {
		p.selectOwnConfirms(rt)
	}
	if confirming || ch.ownConfirms.Load() {
		seq, out := ch.confirms.numberCopies(r.CopySet, ch.arrival(), func(cs *ledger.CopySet) time.Time {
			return withoutLostCopies(targets, cs)
		})
		if r.Queue != nil && r.Queue != ledger.AnyQueue {
			p.current.seq = seq
		}
		if len(out) > 0 {
			rt.settler.confirmedAtPublish(ch, out)
		}
	}
	if len(targets) == 0 {
		ch.dropContent = true
		return nil
	}
	for _, l := range targets {
		if err := l.sock.WriteFrame(frames.FrameMethod, ch.id, method); err != nil {
			rt.writeFailed(l, err)
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
func (p *publisher) selectOwnConfirms(rt *router) {
	ch := p.ch
	ch.ownConfirms.Store(true)
	for _, l := range rt.links.openOn(ch) {
		if l.selectConfirm(ch.id) {
			if err := l.sock.WriteMethod(ch.id, &frames.ConfirmSelect{NoWait: true}); err != nil {
				rt.writeFailed(l, err)
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

// begin starts deciding the route of m afresh, for a channel in confirm
// mode or not, in the buffers of the route it replaces.
func (r *publishRoute) begin(m *frames.BasicPublish, confirming bool) *publishRoute {
	*r = publishRoute{exchange: m.Exchange, key: m.RoutingKey, confirming: confirming,
		CopySet: ledger.CopySet{Quorum: r.Quorum[:0], Extra: r.Extra[:0], Unreached: r.Unreached[:0], Master: -1}}
	return r
}

// queueRoute decides, or recalls, where a publish to the default exchange
// goes: every copy of the queue its routing key names.
func (p *publisher) queueRoute(rt *router, m *frames.BasicPublish) *publishRoute {
	ch := p.ch
	if mirror.IsReplyTo(m.RoutingKey) {
		return p.replyRoute(rt, m)
	}
	r := &p.route
	meta, found := rt.mirror.Lookup(mirror.QueueID{VHost: rt.vhost, Name: m.RoutingKey})
	if r.targets != nil && r.exchange == "" && r.key == m.RoutingKey && r.confirming == ch.confirming.Load() &&
		r.links == rt.links.changes() && found && meta.Version == r.version {
		return r
	}
	r = p.route.begin(m, ch.confirming.Load())
	if !found {
		meta, found = rt.locator.locate(m.RoutingKey)
	}
	if !found {
		// Not kept: the queue may appear any moment.
		return rt.decided(r, rt.links.homeOnly(), false)
	}
	targets := rt.reach(ch, meta.Backends()...)
	// Identified even without slaves: a policy may mirror the queue
	// later, and its messages are then copied to the new slaves, whose
	// trimmers tell them apart by this identity; by content alone, two
	// messages with equal bodies are one.
	r.identify = true
	r.version = meta.Version
	if len(meta.Slaves) > 0 {
		r.Queue = &mirror.QueueID{VHost: meta.ID.VHost, Name: meta.ID.Name}
	}
	r.Master = rt.srv.backendIndex[meta.Master]
	for _, l := range targets {
		if i := meta.SlaveIndex(l.name); i >= 0 && !meta.Slaves[i].Synchronised {
			r.Extra = append(r.Extra, l.idx)
		} else {
			r.Quorum = append(r.Quorum, l.idx)
		}
	}
	if r.Queue != nil {
		r.Unreached = unreachedCopies(meta, targets, rt.srv.backendIndex, r.Unreached)
	}
	return rt.decided(r, targets, len(targets) == 1+len(meta.Slaves))
}

// exchangeRoute decides, or recalls, where a publish to an exchange goes:
// the backends holding a copy of a queue it routes to, by the routing
// table of the metadata log, or every backend when the table cannot say.
// header is the message's content header; its headers table is read only
// when the route needs it (a headers exchange) or names more routing keys
// (CC, BCC), and such a route is not kept.
func (p *publisher) exchangeRoute(rt *router, m *frames.BasicPublish, header []byte) *publishRoute {
	ch := p.ch
	r := &p.route
	table := rt.mirror.Routing()
	var headers []byte // the encoded table, from its size
	if start, end, present, err := frames.HeadersField(header); err == nil && present {
		headers = header[start:end]
	}
	hasCC := bytes.Contains(headers, ccKey) || bytes.Contains(headers, bccKey)
	if !hasCC && r.targets != nil && r.exchange == m.Exchange && r.key == m.RoutingKey && r.table == table &&
		r.confirming == ch.confirming.Load() && r.links == rt.links.changes() {
		return r
	}
	r = p.route.begin(m, ch.confirming.Load())
	r.table = table
	route := mirror.Route{All: true}
	keep := !hasCC
	if table != nil {
		msg := mirror.RoutedMessage{VHost: rt.vhost, Exchange: m.Exchange, RoutingKey: m.RoutingKey}
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
		wanted = rt.srv.backendNames
	}
	targets := rt.reach(ch, wanted...)
	r.identify = len(rt.srv.backends) > 1
	if len(rt.srv.backends) > 1 {
		r.Queue = ledger.AnyQueue
		for _, name := range wanted {
			i := rt.srv.backendIndex[name]
			if !slices.ContainsFunc(targets, func(l *link) bool { return l.idx == i }) && rt.mirror.Holds(name, nil) {
				r.Unreached = append(r.Unreached, i)
			}
		}
	}
	return rt.decided(r, targets, keep && len(targets) == len(wanted))
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
func (rt *router) decided(r *publishRoute, targets []*link, keep bool) *publishRoute {
	r.targets = append([]*link(nil), targets...) // reach's slice is scratch
	if len(r.Quorum) == 0 && len(r.Extra) == 0 {
		for _, l := range r.targets {
			r.Quorum = append(r.Quorum, l.idx)
		}
	}
	if len(r.Quorum) == 0 && len(r.Unreached) == 0 && len(r.Extra) > 0 {
		r.Quorum, r.Extra = r.Extra, r.Quorum
	}
	r.links = rt.links.changes()
	if len(r.Unreached) > 0 {
		rt.reportUnreached(r)
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
func (rt *router) reportUnreached(r *publishRoute) {
	m := rt.mirror
	queue := r.Queue
	if queue == ledger.AnyQueue {
		queue = nil // any queue with a slave there
	}
	for _, i := range r.Unreached {
		name := rt.srv.backends[i].Name
		if i == r.Master {
			continue
		}
		rt.log.Debug("a publish cannot reach a slave copy", "backend", name, "queue", queueName(queue))
		m.Missed(name, queue)
	}
}

// withoutLostCopies takes out of cs the copies whose link among targets was
// lost since the route was decided, and returns when the lost quorum copies
// of a mirrored queue, which keep counting until the metadata records their
// loss, were lost (zero for none). The caller holds the channel's mu
// (channelConfirms.numberCopies).
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
func (p *publisher) publishContent(rt *router, f frames.Frame) error {
	ch := p.ch
	if len(p.held) > 0 {
		var header []byte // nil for a body where the header belongs
		if f.Type == frames.FrameHeader {
			header = f.Payload
		}
		if err := p.sendDeferred(rt, header); err != nil {
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
		p.current.remaining = size
		p.current.inContent = size > 0
	} else if n := uint64(len(f.Payload)); n >= p.current.remaining {
		p.current.remaining, p.current.inContent = 0, false
	} else {
		p.current.remaining -= n
	}
	if f.Type == frames.FrameHeader && p.current.identify {
		stamped, id, err := rt.identities.stamp(f.Payload)
		if err != nil {
			return err
		}
		payload = stamped
		if p.current.returns > 1 || p.current.seq != 0 {
			ch.confirms.identifyPublish(id, &p.current)
		}
	}
	for _, l := range p.current.targets {
		if err := l.sock.WriteFrame(f.Type, f.Channel, payload); err != nil {
			rt.writeFailed(l, err)
		}
	}
	return nil
}

// replyRoute decides where a publish to the default exchange with a direct
// reply-to name as its routing key goes: the backend that owns the name,
// nowhere when none does. A name that does not decode goes to the home
// broker, which answers it as it would without the proxy.
func (p *publisher) replyRoute(rt *router, m *frames.BasicPublish) *publishRoute {
	ch := p.ch
	r := p.route.begin(m, ch.confirming.Load())
	node, ok := mirror.ReplyToNode(m.RoutingKey)
	if !ok {
		return rt.decided(r, rt.links.homeOnly(), false)
	}
	ctx, cancel := context.WithTimeout(rt.ctx, mirrorTimeout)
	backend, ok := rt.mirror.ReplyBackend(ctx, node)
	cancel()
	if !ok {
		rt.log.Debug("a direct reply to a node no live backend runs is dropped", "node", node)
		return rt.decided(r, nil, false)
	}
	return rt.decided(r, rt.reach(ch, backend), false)
}
