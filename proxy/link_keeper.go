package proxy

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// linkKeeper carries a client connection's links through their lives: it
// dials a link and starts its read loop (openLink, runLink), reads each
// link until it ends (linkLoop), ends a link that failed and settles what
// the link had in flight (linkFailed, linkLost, channelLostLink), drops
// the links to backends the engine counts down (checkLinks), and says
// goodbye to the links when the connection ends (closeLinks). The set of
// links (linkSet) decides when a link opens and which one serves; the
// keeper does the I/O and the settling around it. clientConn holds it by
// value.
//
// Who uses it: the client loop and every goroutine that writes to a link,
// which hand it the links whose writes failed (writeFailed); the link
// loops, which it runs; the heartbeat timer and the server's watcher, which
// hand it the links that went silent or whose backend is counted down;
// the router, which opens links through it (linkSet.ensure's dial and
// run); and teardown (closeLinks). Its fields but log and channels are set
// by newClientConn before any of these run; log and channels are set by
// clientConn.open under clientConn.mu before the connection counts as
// open. All of them are only read after. loops counts the goroutines that
// must end before the connection does; orphansMu serialises the losses of
// links, so that one loss's orphans are handed to the consumerMover whole.
type linkKeeper struct {
	srv    *Server // the backends, DialTimeout, HandshakeTimeout, CloseTimeout
	mirror Mirror  // nil without mirroring
	ctx    context.Context
	links  *linkSet
	closer *closer
	// out is the connection's clientOut, a copy: it keeps no state.
	out clientOut
	// terms are the client's credentials, vhost and limits, which further
	// links open with (clientConn.terms).
	terms *terms
	// The connection's parts that settle what a lost link had in flight:
	// the router its replies, the settler its confirms, the mover its
	// consumers of mirrored queues.
	router  *router
	settler *settler
	mover   *consumerMover
	// The connection's own work: fromLink handles a frame from a link
	// (backend_loop.go); backendLost ends the connection when its home
	// link is lost and no other backend takes over; teardown ends it.
	fromLink    func(l *link, f frames.Frame) error
	backendLost func(err error)
	teardown    func(reason CloseReason, detail string)

	log      *slog.Logger
	channels *channelTable

	// loops counts the link read loops running and the goroutines that
	// move consumers (consumerMover.running).
	loops sync.WaitGroup
	// orphans collects, under orphansMu, the consumers of a lost link
	// (see failover.go).
	orphansMu sync.Mutex
	orphans   []orphan
}

// openLink connects to backend i and opens an AMQP connection on it with
// the client's credentials, vhost and the limits negotiated with the client
// (linkSet.ensure's dial).
func (k *linkKeeper) openLink(i int) (*wire.Socket, error) {
	b := k.srv.backends[i]
	// The client's frames wait while a link opens: bounded by the dial
	// timeout, not the client handshake's.
	deadline := time.Now().Add(min(k.srv.opts.HandshakeTimeout, k.srv.opts.DialTimeout))
	s, err := logIn(k.ctx, b, k.terms, deadline)
	if err != nil {
		k.log.Warn("cannot open a link to backend", "backend", b.Name, "err", err)
		return nil, err
	}
	return s, nil
}

// runLink starts the read loop of a link that opened (linkSet.ensure's
// run).
func (k *linkKeeper) runLink(l *link) {
	k.log.Debug("link opened", "backend", l.name, "generation", l.gen)
	k.start(l)
}

// start starts l's read loop, counted in loops.
func (k *linkKeeper) start(l *link) {
	k.loops.Add(1)
	go k.linkLoop(l)
}

// wait blocks until the link loops and the goroutines moving consumers
// ended.
func (k *linkKeeper) wait() {
	k.loops.Wait()
}

// linkLoop reads a link's frames and passes them to the client. After
// teardown it keeps reading only until the backend confirms the proxy's
// connection.close.
func (k *linkKeeper) linkLoop(l *link) {
	defer k.loops.Done()
	defer close(l.done)
	defer l.sock.Conn().Close()
	l.sock.WhenDry(func() { k.out.flush() })
	for {
		f, err := l.sock.ReadFrame()
		if err != nil {
			if k.closer.tornDown() {
				return
			}
			if k.links.home() == l {
				if k.closer.inProgress() == closeByClient {
					// The backend hung up instead of sending close-ok: the
					// client asked to close, so that is what happened.
					reason, detail := k.closer.outcome()
					k.closer.backendDone()
					k.teardown(reason, detail)
					return
				}
			}
			k.linkFailed(l, err)
			return
		}
		if k.closer.tornDown() {
			if f.Type == frames.FrameMethod && f.Channel == 0 && isMethod(f.Payload, frames.ConnectionCloseOkKey, frames.ConnectionCloseKey) {
				return
			}
			continue
		}
		if err := k.fromLink(l, f); err != nil {
			if errors.Is(err, errBackendDone) {
				return
			}
			k.linkFailed(l, err)
			return
		}
	}
}

// linkFailed ends a link that failed or sent what the proxy cannot read,
// and reports whether the client connection goes on. Without mirroring the
// home link's loss ends the client connection with 320; with mirroring
// another backend becomes home (linkSet.rehome), and only when none can
// does the client connection end.
func (k *linkKeeper) linkFailed(l *link, err error) bool {
	if k.links.home() != l {
		k.linkLost(l, err)
		return true
	}
	if k.mirror == nil {
		k.backendLost(err)
		return false
	}
	next, ok := k.links.rehome(l, k.openLink, k.runLink)
	if !ok {
		k.backendLost(err)
		return false
	}
	if next != nil {
		k.log.Warn("home backend lost; another backend serves the connection", "lost", l.name, "home", next.name)
	}
	k.linkLost(l, err)
	return true
}

// writeFailed handles a failed write to a link: the home link's loss ends
// the connection; another link's loss is noticed by its read loop too.
func (k *linkKeeper) writeFailed(l *link, err error) {
	k.linkFailed(l, err)
}

// linkLost handles the loss of a link other than the home link: the client
// connection goes on. What was in flight on the link is settled: its
// consumers are cancelled (as RabbitMQ cancels the consumers of a queue whose
// node went down), the confirms it owed stop counting, and a request whose
// answer only it could give closes its channel with 541.
func (k *linkKeeper) linkLost(l *link, err error) {
	if !k.links.drop(l) {
		return
	}
	chans := l.lose()
	// A reset, not a FIN behind what is still unsent: a link cut off by a
	// partition would otherwise deliver its buffered publishes when the
	// network heals, to copies that were purged and resynchronised since.
	resetOnClose(l.sock.Conn())
	l.sock.Conn().Close()
	k.log.Warn("backend link lost", "backend", l.name, "generation", l.gen, "err", err)

	k.orphansMu.Lock()
	defer k.orphansMu.Unlock()
	k.orphans = nil
	for id, lc := range chans {
		ch := k.channels.get(id)
		if ch == nil {
			continue
		}
		k.channelLostLink(ch, l, lc)
	}
	if len(k.orphans) > 0 && !k.closer.tornDown() {
		k.mover.move(l.name, k.orphans)
	}
	k.orphans = nil
	// What the loss settled (confirms, cancels) must leave now: the
	// goroutine that noticed it may be no read loop, whose flush would
	// follow.
	k.out.flush()
}

// channelLostLink settles what a client channel had in flight on a link that
// was lost: consumers there are cancelled, confirms owed by the link stop
// counting, a request also sent to other links takes their answer, a
// basic.get on a mirrored queue gets get-empty, other requests it alone
// could answer close the channel with 541, and a close waiting for its
// close-ok goes on without it. The caller holds orphansMu.
func (k *linkKeeper) channelLostLink(ch *channelState, l *link, lc *linkChannel) {
	for _, g := range lc.replies {
		switch {
		case g == nil:
		case g.own:
			g.after(nil)
		default:
			k.router.settleLostReply(ch, g, l)
		}
	}
	ch.outMu.Lock()
	var cancelled []string
	var confirms []ledger.ClientConfirm
	var missed []ledger.MissedCopy
	k.orphans, cancelled, confirms, missed = ch.lostLink(l.idx, k.mirror != nil, time.Now(), k.orphans)
	k.settler.passConfirms(ch, confirms)
	if len(missed) > 0 && !k.mirror.BackendDown(l.name) {
		// A backend counted down loses its slaves anyway; one still up
		// kept its copies while this client's link to it broke.
		k.settler.reportMissed(missed, "link lost")
	}
	for _, tag := range cancelled {
		k.out.method(ch.id, &frames.BasicCancel{ConsumerTag: tag, NoWait: true})
	}
	ch.outMu.Unlock()
	if ch.closing.Load() == chanBackendClosing {
		// The client's close-ok has nowhere to go; the channel is closed
		// once the client sends it.
		ch.forgetCloser(l)
	}
}

// checkLinks drops the links to backends the engine counts down: a frozen
// broker is counted down after failover_grace, but its sockets stay open
// until it wakes or heartbeats give up, and nothing it sends after its
// queues were promoted away may reach a client. Dropping the link settles
// its confirms from the other copies and moves its consumers.
func (k *linkKeeper) checkLinks() {
	for i := range k.links.len() {
		l := k.links.at(i)
		if l != nil && k.mirror.BackendDown(l.name) {
			k.linkFailed(l, errors.New("counted down by the proxy's probe (no answer within failover_grace)"))
		}
	}
}

// closeLinks says goodbye to every link but the home one (teardown does that
// one): connection.close, and the read loop waits for close-ok until
// CloseTimeout.
func (k *linkKeeper) closeLinks(reason CloseReason) {
	home := k.links.home()
	links := k.links.snapshot()
	text := "client connection closed"
	if reason == ReasonShutdown {
		text = "proxy shutting down"
	}
	for _, l := range links {
		if l == nil || l == home {
			continue
		}
		if reason == ReasonPaused {
			// A paused proxy cannot tell which brokers the majority still
			// reaches: what it sent them and they have not received must
			// not arrive after the healing (see linkLost).
			resetOnClose(l.sock.Conn())
			l.sock.Conn().Close()
			continue
		}
		l.sock.Conn().SetDeadline(time.Now().Add(k.srv.opts.CloseTimeout))
		if err := l.sock.SendMethod(0, &frames.ConnectionClose{ReplyCode: frames.ReplySuccess, ReplyText: text}); err != nil {
			l.sock.Conn().Close()
		}
	}
}
