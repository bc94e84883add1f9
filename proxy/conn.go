package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// clientConn is one client connection and the backend connection that
// serves it. Two goroutines run per connection: the client read loop
// (client → backend, also the connection's main goroutine once open) and the
// backend read loop (backend → client); a timer checks heartbeats
// (heartbeats). Each read loop writes to the
// opposite socket (to the client through out); see wire.Socket for how
// writes are shared, and the package documentation for the lock order.
type clientConn struct {
	srv *Server
	id  uint64
	log *slog.Logger
	// client is the client's socket: the client loop reads it, teardown
	// closes it, and the connection's close handshake and heartbeats
	// write to it; out is what the connection writes to it otherwise.
	client *wire.Socket
	out    clientOut

	// ctx ends with the connection; calls to the engine run under it.
	ctx       context.Context
	cancelCtx context.CancelFunc

	// opening is the handshake until the connection serves (open); nil
	// after, under mu.
	opening *opening
	// terms and channels are what the handshake settled, set before the
	// connection serves and only read after.
	terms    terms
	channels *channelTable
	// started is when the client connected.
	started time.Time
	// links are the connection's backend links, the home link among them.
	links linkSet
	// router routes the client's methods and publishes to the links
	// (route.go), set before the connection serves.
	router router
	// settler settles the client's acks and the backends' confirms
	// (settle.go), set before the connection serves.
	settler settler
	// deliverer passes the links' deliveries, get-oks and returns to the
	// client (delivery.go), set under mu before the connection counts as
	// open.
	deliverer deliverer
	// mover moves consumers of mirrored queues to their queue's new master
	// (failover.go), set under mu before the connection counts as open.
	mover consumerMover
	// keeper carries the links through their lives: it opens them, runs
	// their read loops, settles what a lost one had in flight and closes
	// them at the end (link_keeper.go).
	keeper linkKeeper
	// heartbeats checks the connection's heartbeats from a timer
	// (heartbeat.go), set and started by run, and stopped once the
	// connection ended.
	heartbeats heartbeats

	// closer keeps where the connection's end stands: the close
	// handshake in progress, whether teardown began, and why it ends
	// (closer.go).
	closer closer

	// mu orders the connection's opening against its teardown. It guards
	// opening and opened; open sets what the server's watcher may use once
	// isOpen says the connection is open (terms, channels, deliverer,
	// mover) and hands the links their home link under it, and teardown
	// marks the closer ended, seals the links and reads which socket to
	// say goodbye on under it. closer.mu and linkSet.mu are taken under it.
	mu sync.Mutex
	// opened is when the handshake finished; zero before. From then on the
	// home link's read loop owns closing the home link's socket.
	opened time.Time
	// send is the gate the client loop holds while it handles a frame,
	// and the consumerMover while it writes to links for the client; the
	// link loops' writes on channels wait there for the client loop to be
	// between messages (boundary.go).
	send sendGate

	done chan struct{} // closed by teardown
}

func newClientConn(srv *Server, id uint64, conn net.Conn) *clientConn {
	c := &clientConn{
		srv:    srv,
		id:     id,
		client: wire.NewSocket(conn),
		done:   make(chan struct{}),
		links:  newLinkSet(srv.backendNames, srv.opts.Mirror),
	}
	c.out = clientOut{sock: c.client, gone: func(err error) {
		c.teardown(ReasonClientGone, fmt.Sprintf("writing to client: %v", err))
	}}
	c.ctx, c.cancelCtx = context.WithCancel(context.Background())
	c.keeper = linkKeeper{srv: srv, mirror: srv.opts.Mirror, ctx: c.ctx, links: &c.links, closer: &c.closer,
		out: c.out, terms: &c.terms, router: &c.router, settler: &c.settler, mover: &c.mover,
		fromLink: c.fromLink, backendLost: c.backendLost, teardown: c.teardown}
	if srv.opts.Mirror != nil {
		c.router.identities = newIdentities()
	}
	c.log = srv.log.With("conn", id, "client", conn.RemoteAddr().String())
	c.opening = newOpening(c.ctx, srv, c.client, c.log)
	return c
}

// open runs the handshake and reports whether the connection serves; when it
// does not, the connection has ended and reason says why. run serves it
// afterwards, on a goroutine of its own: the handshake (dialling, TLS,
// logging) grows a goroutine's stack to several KiB, which a goroutine that
// then waits for frames for hours would keep, for each connection.
func (c *clientConn) open() (ok bool, reason CloseReason) {
	c.started = time.Now()
	o := c.opening
	opened, err := o.handshake()
	if err != nil {
		var refused *unavailableError
		if errors.As(err, &refused) {
			// The client was told the backend is unavailable: that is
			// why the connection ended, whatever tore it down meanwhile.
			c.closer.setOutcome(ReasonBackendUnavailable, err.Error())
		}
		c.teardown(ReasonHandshakeFailed, err.Error())
		c.wait()
		reason, detail := c.closer.outcome()
		c.log.Info("connection refused", "reason", reason.String(), "detail", detail,
			"user", o.terms.user, "vhost", o.terms.vhost, "duration", time.Since(c.started).Round(time.Millisecond))
		return false, reason
	}
	home := opened.home
	log := c.log.With("user", opened.terms.user, "vhost", opened.terms.vhost)
	writeFailed, closeChannel := c.keeper.writeFailed, c.closeChannelByProxy
	c.mu.Lock()
	c.terms = opened.terms
	c.channels = newChannelTable(opened.terms.channelMax)
	// The server's watcher moves consumers, and may start a link's read
	// loop, once isOpen says the connection is open.
	c.deliverer = deliverer{ctx: c.ctx, mirror: c.srv.opts.Mirror, stats: &c.srv.stats,
		delivered: c.srv.delivered, out: c.out, linkFailed: writeFailed}
	c.mover = consumerMover{srv: c.srv, mirror: c.srv.opts.Mirror, links: &c.links, channels: c.channels,
		router: &c.router, locator: &c.router.locator, send: &c.send, out: c.out, log: log,
		cancelNotify: opened.terms.cancelNotify, done: c.done, running: &c.keeper.loops, writeFailed: writeFailed}
	// The router and the settler too: the mover reaches the router, and a
	// link loop the watcher starts reaches the settler.
	c.log = log
	c.keeper.log, c.keeper.channels = log, c.channels
	rt := &c.router
	rt.srv, rt.mirror, rt.links = c.srv, c.srv.opts.Mirror, &c.links
	rt.vhost, rt.log, rt.ctx = c.terms.vhost, log, c.ctx
	c.settler = settler{srv: c.srv, mirror: c.srv.opts.Mirror, links: &c.links, log: log, out: c.out,
		writeFailed: writeFailed, closeChannel: closeChannel}
	rt.out, rt.settler = c.out, &c.settler
	rt.dial, rt.run = c.keeper.openLink, c.keeper.runLink
	rt.writeFailed, rt.closeChannel, rt.atBoundary = writeFailed, closeChannel, c.send.atBoundary
	rt.locator = queueLocator{mirror: c.srv.opts.Mirror, vhost: c.terms.vhost, links: &c.links, log: log,
		ctx: c.ctx, reach: rt.reach, closeChannel: closeChannel}
	c.opened = time.Now()
	c.opening = nil
	c.links.begin(home, opened.failedAt)
	c.mu.Unlock()
	c.log.Info("connection opened", "backend", home.name,
		"frame_max", c.terms.frameMax, "heartbeat", c.terms.clientHeartbeat)
	return true, ReasonUnknown
}

// run serves an open connection to its end and returns why it ended.
func (c *clientConn) run() CloseReason {
	c.keeper.start(c.links.home())
	c.heartbeats = heartbeats{client: c.client, clientEvery: c.terms.clientHeartbeat,
		links: &c.links, backendEvery: c.terms.backendHeartbeat, done: c.done,
		teardown: c.teardown, linkFailed: c.keeper.linkFailed}
	c.heartbeats.start()
	c.clientLoop()
	c.wait()
	c.heartbeats.stop()

	c.logUnconfirmed()
	reason, detail := c.closer.outcome()
	c.log.Info("connection closed", "reason", reason.String(), "detail", detail,
		"duration", time.Since(c.started).Round(time.Millisecond))
	return reason
}

// logUnconfirmed says which backends still owed confirms for publishes of
// a client connection that ended.
func (c *clientConn) logUnconfirmed() {
	if c.channels == nil {
		return
	}
	c.channels.each(c.logChannelUnconfirmed)
}

// logChannelUnconfirmed logs a channel's publishes still unconfirmed, and
// which backends owe them, when the channel ends.
func (c *clientConn) logChannelUnconfirmed(ch *channelState) {
	n, owed := ch.confirms.unconfirmed()
	if n == 0 {
		return
	}
	byName := make(map[string]int, len(owed))
	for b, k := range owed {
		byName[c.srv.backends[b].Name] = k
	}
	c.log.Info("channel ended with publishes unconfirmed", "channel", ch.id, "unconfirmed", n, "owed_by_backend", byName)
}

// wait blocks until the sockets are closed and the link loops, and the
// goroutines moving consumers, ended.
func (c *clientConn) wait() {
	<-c.done
	c.keeper.wait()
}

// beginClosing moves from no close to st and reports whether it did: only
// one connection-level close handshake runs at a time (closer.begin). A
// close the peer does not answer within CloseTimeout tears the connection
// down.
func (c *clientConn) beginClosing(st closeState, reason CloseReason, detail string) bool {
	timeout := c.srv.opts.CloseTimeout
	return c.closer.begin(st, reason, detail, timeout, func() {
		c.teardown(reason, detail+" (no close-ok within "+timeout.String()+")")
	})
}

// teardown ends the connection: it closes the client socket, says goodbye to
// the backend with connection.close unless that handshake already happened,
// and lets the backend loop finish reading the backend's close-ok (bounded by
// CloseTimeout). It is idempotent; the first reason wins.
func (c *clientConn) teardown(reason CloseReason, detail string) {
	c.mu.Lock()
	first, backendClosed := c.closer.end(reason, detail)
	if !first {
		c.mu.Unlock()
		return
	}
	c.links.seal()
	// Only the home link's read loop can read the backend's close-ok;
	// before the connection serves (a handshake in progress or failed)
	// the handshake's socket is simply closed.
	pending := c.opening
	home := c.links.home()
	sayGoodbye := home != nil && !backendClosed
	// Set by open under c.mu once the handshake succeeded; nil before.
	settler, channels := c.settler, c.channels
	c.mu.Unlock()

	close(c.done)
	c.cancelCtx()
	c.client.Conn().Close()
	c.keeper.closeLinks(reason)
	// The brokers take back what the client had not settled.
	if channels != nil {
		channels.each(func(ch *channelState) { settler.takenBack(ch.outstandingMirrored()) })
	}
	if home == nil {
		if pending != nil {
			pending.abort(reason == ReasonPaused)
		}
		return
	}
	backend := home.sock
	if !sayGoodbye || reason == ReasonPaused {
		if reason == ReasonPaused {
			resetOnClose(backend.Conn()) // as closeLinks does
		}
		backend.Conn().Close()
		return
	}
	// The backend loop keeps reading until the close-ok or the deadline.
	backend.Conn().SetDeadline(time.Now().Add(c.srv.opts.CloseTimeout))
	text := "client connection closed"
	if reason == ReasonShutdown {
		text = "proxy shutting down"
	}
	if err := backend.SendMethod(0, &frames.ConnectionClose{ReplyCode: frames.ReplySuccess, ReplyText: text}); err != nil {
		backend.Conn().Close()
	}
}

// closeClient starts a proxy-initiated connection close: connection.close to
// the client, then teardown when the client answers or CloseTimeout passes.
func (c *clientConn) closeClient(reason CloseReason, code uint16, text string, classID, methodID uint16) {
	if !c.beginClosing(closeByProxy, reason, text) {
		return
	}
	closeFrame := &frames.ConnectionClose{ReplyCode: code, ReplyText: text, ClassID: classID, MethodID: methodID}
	if err := c.client.SendMethod(0, closeFrame); err != nil {
		c.teardown(reason, text)
	}
}

// shutdown asks the client to close, as RabbitMQ does when it stops.
func (c *clientConn) shutdown() {
	if c.isOpen() {
		c.closeClient(ReasonShutdown, frames.ConnectionForced,
			"CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", 0, 0)
		return
	}
	c.teardown(ReasonShutdown, "shutdown during handshake")
}

// isOpen reports whether the handshake finished and the connection serves.
func (c *clientConn) isOpen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.opened.IsZero() && !c.closer.tornDown()
}

// backendLost closes the client connection with 320 CONNECTION_FORCED
// because the backend connection failed. The client's text names the backend
// and the kind of failure; the log has the whole error.
func (c *clientConn) backendLost(err error) {
	if c.closer.tornDown() {
		return
	}
	c.closer.backendDone() // nothing to say goodbye to
	home := c.links.home()
	text := fmt.Sprintf("CONNECTION_FORCED - backend %s connection lost: %s", home.name, failureKind(err))
	if c.closer.inProgress() == closeNone {
		c.log.Warn("backend connection lost", "backend", home.name, "err", err)
	}
	// Close the socket only after the close began, so that the backend
	// loop's read error, which follows, does not replace this reason.
	c.closeClient(ReasonBackendLost, frames.ConnectionForced, text, 0, 0)
	home.sock.Conn().Close()
}

// errMissedHeartbeats is how the heartbeat checks report a silent backend.
var errMissedHeartbeats = errors.New("missed heartbeats")

// failureKind says in a few words how a connection failed, without the
// addresses and internals a client has no use for.
func failureKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, errMissedHeartbeats):
		return "missed heartbeats"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the broker closed the socket"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	}
	var fe *frames.Error
	if errors.As(err, &fe) {
		return "protocol error from the broker: " + fe.ReplyText()
	}
	return "network error"
}

// protocolError answers a client's framing or syntax error the way a broker
// does: connection.close with the error's code, then the connection ends.
func (c *clientConn) protocolError(fe *frames.Error) {
	if errors.Is(fe, frames.ErrMalformed) {
		// RabbitMQ answers a method frame it cannot decode (arguments cut
		// short or left over, a payload too short for the ids) with 501
		// FRAME_ERROR "cannot decode", not 502: give clients the broker's code.
		asBroker := *fe
		asBroker.Code = frames.FrameError
		fe = &asBroker
	}
	c.log.Warn("client protocol error", "code", fe.Code, "err", fe.Error())
	c.closeClient(ReasonProtocolError, fe.Code, fe.ReplyText(), fe.ClassID, fe.MethodID)
}
