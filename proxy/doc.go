// Package proxy is amqp-mirror's client-facing AMQP 0-9-1 server. No client
// can tell it from the broker behind it: connection.start carries the
// broker's own properties, the broker authenticates the client's own
// credentials, and every method passes with its exact semantics.
//
// # Shape
//
// Each client connection (clientConn) has a link (link.go) to each backend
// it needs: the home link, opened during the handshake with the client's
// credentials and vhost to the first backend that answers (Options.Backend
// first, none the engine counts down), and, with mirroring (a Mirror is
// configured), links to the other backends, opened on first need with the
// same credentials. Client channel N is channel N on every link it is open
// on; it opens on a link when a method first needs it there, and the proxy
// repeats on it what the client set (prefetch, confirm or transaction mode).
// One goroutine reads the client (the client loop) and one reads each link;
// heartbeats are checked from a timer (heartbeats). A read loop queues frames on the
// sockets it writes to (wire.Socket, the socket layer in internal/wire;
// the client's through the connection's clientOut) and flushes them when
// its own socket runs dry, so a burst of frames costs one system call,
// and flushes that meet a write in flight join it. The client loop tells
// the engine of the burst's acks then too, in one call per queue
// (settler.flushAcked). A slow reader on either
// side slows the other side through TCP flow control: the proxy buffers at
// most two write buffers and one frame per direction, and sockets hold
// pooled buffers only while they have data.
//
// A client frame travels one way (client_loop.go, client_methods.go,
// route.go, publish.go): decoded as far as the proxy acts on it, applied to its
// channel's state (channelState: its consumers, delivery tags, publisher
// confirms and close in progress, each a type of its own under the
// channel's one lock), routed by the connection's router to the links the method
// must reach (a queue's copies, every backend for an exchange, the master for
// a consume), and written there. A synchronous method sent to several links gives the client
// one reply, the first link's, once all answered (rpc.go); a link's replies
// are matched to requests by a queue per link and channel, since a broker
// answers a channel's requests in order. Deliveries, gets and returns are
// assembled whole before the connection's deliverer passes them to the
// client (delivery.go), so frames of messages from two links never
// interleave on a client channel, and each channel's output
// (channelState.outMu) keeps its delivery tags and confirms in order.
//
// The client sees the proxy's own delivery tags and confirm sequence numbers
// (ledger.DeliveryTags, ledger.PublisherConfirms), each mapped to a link,
// its generation and the backend's number; the connection's settler
// (settle.go) carries acks and confirms across. A client's ack is split
// per link; an ack of a delivery whose link was lost settles nothing (the
// broker requeued it). A publish to a mirrored queue carries an identity
// header, added at publish and removed at delivery; the client's ack of a
// message from a master tells the engine, which trims the slaves. The
// client's confirm waits for the master and the synchronised slaves.
//
// When a link is lost the client connection goes on: a lost home link
// hands channel 0 to another backend's link, and the connection's
// consumerMover (failover.go) moves consumers of mirrored queues to the
// promoted master with their tags. Without mirroring, the home link's
// loss ends the client connection with 320.
//
// The proxy decodes only what it acts on: connection and channel lifecycle,
// basic.consume/get/deliver/ack/nack/reject/recover, confirm.select, tx, and
// with mirroring the queue, exchange and publish methods it routes.
// Everything else, content bodies included, passes as it came.
//
// # Closing
//
// Every connection ends with a CloseReason. The connection-level close
// handshake runs through the proxy (closeState): a client's close goes to
// the backend and the backend's close-ok back; a backend's close goes to the
// client and its close-ok back; a close of the proxy's own (backend lost,
// protocol error, shutdown) ends when the client answers or CloseTimeout
// passes. teardown is the one way out and is idempotent. The connection's
// closer (closer.go) keeps where its end stands: the close in progress,
// whether teardown began, and why the connection ends (the first reason
// wins). A channel closes on every link it is open on, and the client sees
// one close handshake, as from one broker (chanclose.go).
//
// # Layout
//
// The package holds the connection logic; what needs none of it lives in
// leaf packages under internal/ that never import proxy:
//
//   - internal/wire: the socket layer. wire.Socket pairs a frame reader,
//     parsing in place in pooled buffers, with a coalescing writer shared by
//     the goroutines that produce frames for the socket; raw read(2) and
//     write(2) calls; buffers held only while they hold data.
//   - internal/ledger: bookkeeping without I/O. DeliveryTags maps the
//     client's delivery tags to links and backend tags; PublisherConfirms
//     counts the backends' confirms towards the client's; DeliveredIDs
//     remembers recent deliveries of mirrored queues, to flag a promoted
//     slave's redeliveries, and in a sidecar cluster learns the other
//     proxies' (the server asks them, watchMirror).
//   - internal/memory: the releaser that returns memory to the system after
//     a storm of closed connections.
//
// In proxy, by concern: server.go accepts connections; handshake.go opens
// them (opening, the handshake, which hands the connection its home link and
// its terms); conn.go is the client connection (clientConn) and its
// teardown, closer.go where its end stands (closer), client_out.go what it
// writes to its client (clientOut), heartbeat.go its heartbeats
// (heartbeats); client_loop.go reads the client and dispatches each frame
// (fromClient), client_methods.go has the handler of each client method it
// acts on, boundary.go the gate the client loop holds while it handles a
// frame, which other writes on its links pass through (sendGate); settle.go
// settles the client's acks and the backends' confirms (settler), and tells
// the engine what they mean for the slave copies; route.go is the
// connection's router (router), which holds what routing uses of the
// connection and routes queue and consume traffic, channelwide.go,
// exchanges.go and replyto.go its routing of channel-wide methods
// (channel.open, qos, confirm.select, tx, recover), exchange and direct
// reply-to traffic, queue_locator.go how it finds where a queue lives and
// reaches its master, waiting out a promotion (queueLocator), declared.go
// its record of the queues the metadata log does not record
// (declaredQueues), txemulated.go the transactions it keeps for channels in
// the proxy's own confirm mode (emulatedTx); publish.go is a channel's
// publishing side (publisher), which decides and keeps a publish's route
// through the router, numbers it for the confirms and sends its frames;
// link.go is a backend link (link) and how it logs in, links.go the
// connection's set of them (linkSet), link_keeper.go what carries them
// through their lives (linkKeeper: it opens them, runs their read loops,
// settles what a lost one had in flight and closes them), backend_loop.go
// what a link's loop does with each frame, delivery.go the assembly of
// messages and how the connection passes them to the client (deliverer),
// identity.go the identity header a mirrored message carries between publish
// and delivery (identities stamps it); rpc.go sends a routed request to its
// links (router.send) and matches the links' replies to it
// (router.replyArrived); channel.go is a client channel (channelState),
// consumers.go its consumers (channelConsumers), channel_tags.go its
// delivery tags (channelDeliveries), channel_confirms.go its publisher
// confirms (channelConfirms), and channel_table.go the lock-free table of
// channels; chanclose.go closes channels; failover.go moves consumers to
// their queue's new master (consumerMover) and drops the links to backends
// counted down, lostcopies.go lets go of the lost copies that keep publishes
// waiting; views.go copies what ctl list_connections and list_consumers
// show, through the types' own locks.
//
// # Who owns what
//
// The handshake (opening) owns what only it needs: the backend it is
// trying, whether the client has seen connection.start, its deadline, and
// the terms as they settle. It hands the connection its home link and its
// terms (user, vhost, frame_max, channel_max, heartbeats, what opens
// further links), which open sets once under clientConn.mu before the
// connection serves, with the home link as the first of the connection's
// links (linkSet); from then on the terms are only read. Until then
// teardown reaches the handshake only through opening.abort, which closes
// its backend socket under opening.mu.
//
// A channel's state (channelState) is touched by the client loop, by the
// read loop of every link that serves the channel, and by the failover
// goroutine; a link's (link) by the client loop, its own read loop and the
// failover goroutine; the set of links (linkSet) by all of these, the
// heartbeat timer and the views. Each keeps its shared state behind its own lock, taken
// only by its own methods, so a function that holds a *channelState, a
// *link or the linkSet can change only what those methods allow:
//
//   - channelState.mu guards the channel's consumers and orphaned
//     consumers (channelConsumers, consumers.go: added and cancelled by the
//     client loop, cancelled or orphaned by the link loops, moved by
//     failover), its delivery tags and what the transaction settled of
//     them (channelDeliveries, channel_tags.go: assigned by the link loops,
//     settled by the client loop), its publisher confirms
//     (channelConfirms, channel_confirms.go: numbered by the client loop,
//     answered by the link loops, released by failover), the close in
//     progress (closeHandshake, chanclose.go), and the reply counts of the
//     channel's requests. Each of those types is held by value in
//     channelState: one lock, since a lost link drops consumers and
//     settles confirms in one step, and a settlement in a transaction
//     changes the tags and the transaction's record together. The
//     confirms hold a pointer to channelState.mu and take it in their own
//     methods (channel_confirms.go); the other parts' methods are called
//     with it held, by channelState's methods only, which take the lock
//     and are in channel.go, chanclose.go (close state) and txemulated.go
//     (a kept transaction).
//   - link.mu guards the link's side of each channel (open, in confirm mode,
//     closing, the replies it owes) and whether the link is lost or closed;
//     its methods are in link.go.
//   - linkSet.mu guards which link serves each backend, the backends' link
//     generations and last failures, and whether the connection ended (no
//     link opens after: teardown seals the set). The home link and the
//     count of links opened and lost, read on every frame, are atomics
//     that change only in its methods; one backend's link opens at a time
//     (linkSet.opening). The connection's linkKeeper dials a link and
//     starts its read loop (openLink, runLink), which the router hands to
//     ensure (router.reach) and the keeper to rehome; the set's methods
//     are in links.go.
//   - The connection's router (router) is used by the client loop, which
//     routes every client method through it, by the link loops, which
//     match replies to routed requests through it and run what a request
//     does once answered, by whoever loses a link, which settles the
//     replies the link owed, and by the failover goroutine, which reaches
//     links through it holding the send gate.
//     What it uses of the connection is set before the connection serves
//     and only read. Its record of the queues the connection declared that
//     the log does not record (declaredQueues) is guarded by
//     declaredQueues.mu, taken only in its methods (declared.go); the rest
//     of its state belongs to the client loop (below).
//   - The connection's settler (settler) is used by the client loop,
//     which settles the client's acks through it, by the link loops,
//     which pass the backends' confirms on through it, and by whoever
//     loses a link or releases lost copies. What it uses of the
//     connection is set before the connection serves and only read; the
//     state it settles is the channel's (channelState.mu), and its trim
//     scratch the client loop's (below).
//   - The connection's deliverer is used by the link loops, each passing
//     its link's messages to the client through it. It keeps no state:
//     what it uses of the connection and the server (the engine, the
//     counters, the server's record of deliveries, ledger.DeliveredIDs,
//     with its own locks) is set under clientConn.mu before the
//     connection counts as open, and only read; the delivery tags it
//     assigns are the channel's (channelState.mu), and it writes each
//     message under the channel's outMu.
//   - The connection's consumerMover is used by the server's watcher,
//     which has it move the consumers whose queue's master moved, by
//     whoever loses a link, which hands it the link's consumers of
//     mirrored queues, and by the goroutines that move them. It keeps no
//     state: what it uses of the connection is set under clientConn.mu
//     before the connection counts as open, and only read; the consumers
//     it moves are the channel's (channelState.mu), and it writes to
//     links holding the send gate.
//   - A channel's publisher (the publish in progress, the publish held for
//     its content header, the kept route), the other fields of
//     channelState marked "client read loop only" (qos, decode scratch),
//     the router's identities, which number the published messages, and
//     its locator's memory of where other connections' exclusive queues
//     are (queueLocator.unrecorded), the settler's trim scratch and a link's
//     decode scratch belong to one goroutine and have no lock. Whoever
//     holds the send gate may read whether a channel is in a publish's
//     content (publisher.inContent).
//   - The connection's send gate (sendGate, boundary.go) is the lock the
//     client loop holds while it handles a frame, which the failover of
//     consumers takes to write to links for the client, and the link
//     loops' writes on a channel that wait for the client loop to be
//     between messages (guarded by sendGate.workMu, taken only in its
//     methods); whoever lets go of the lock runs what waits.
//
// The connection's linkKeeper is used by every goroutine that writes to a
// link, which hands it the links whose writes failed, by the link loops it
// runs, by the heartbeat timer and the server's watcher, which hand it the
// links that went silent or whose backend is counted down, by the router,
// which opens links through it, and by teardown, which closes them. What
// it uses of the connection is set before the connection counts as open
// and only read; linkKeeper.orphansMu, taken only in its methods,
// serialises the losses of links and guards the orphans a loss collects
// for the consumerMover, and its loops count the goroutines the
// connection's end waits for.
//
// The connection's closer is used by every goroutine of the connection:
// the read loops check on every frame whether a close is in progress and
// whether teardown began (atomics), and whoever begins a close or ends
// the connection changes them, and the reason, under closer.mu, in its
// methods. clientConn.mu guards the hand-over from the handshake to the
// connection (opening, opened) and what open sets before the connection
// counts as open; teardown marks the closer ended under it, so that
// what isOpen reads under it (opened, and whether teardown began) changes
// only while it is held.
//
// The connection's heartbeats are set up and started by its main
// goroutine once it serves, checked by their timer's goroutine, and
// stopped by the main goroutine once the connection ended. What they use of
// the connection is set before they start and only read; heartbeats.mu,
// taken only in their methods, guards whether they stopped and the timer.
//
// What the connection writes to its client goes through clientOut, which
// every goroutine that writes to the client uses: it is set before the
// connection serves and keeps no state of its own, and the socket's writer
// takes its own lock (internal/wire).
//
// One lock is taken outside its type's methods: channelState.outMu,
// which whoever writes to the client on a channel holds (clientOut's
// OnChannel methods take it; a message, a confirm and a channel's
// settled confirms are numbered and written under it), so that a
// message's frames, delivery tags and confirms go out in order.
//
// # Locks
//
// Lock order: sendGate.mu (the send gate: the client loop, per frame),
// then linkKeeper.orphansMu, then Server.mu, then clientConn.mu, then
// linkSet.mu, then channelState.outMu, then channelState.mu, then link.mu,
// then the socket writer's lock (internal/wire). opening.mu is taken with
// no other lock held. A backend's linkSet.opening is held while its link
// dials and logs in; it is taken with no lock held but the send gate, and
// of the locks above only linkSet.mu and the new socket's are taken under
// it.
// One exception: a write to the client that fails tears the connection
// down from under channelState.outMu (clientOut's gone, then teardown),
// which takes clientConn.mu and linkSet.mu; nothing takes outMu while it
// holds either of those, so the two orders never meet.
// The parts of a channel's state (channelConsumers, channelDeliveries,
// channelConfirms, closeHandshake) have no lock of their own: they are
// guarded by channelState.mu, which channelState's methods take, and
// channelConfirms' own, through its pointer to it.
// channelState.mu is held over link.mu in one place only,
// channelConfirms.numberCopies, which asks the links whether they were
// lost (a lost link settles its confirms under the channel's lock); the
// socket writer's lock is taken under channelState.mu when a crossing
// close answers its closer at once (clientCloseCrosses, which hands a
// failed write back to be reported once channelState.mu is released). The socket writer's lock is never held
// during a system call (the writer releases it around each write), and
// nothing else is taken under it; nor under linkSet.mu, nor under
// sendGate.workMu, which guards the link loops' writes that wait for the
// client loop to be between messages (boundary.go), nor under
// declaredQueues.mu (declared.go), nor under heartbeats.mu
// (heartbeat.go, taken with no other lock held), nor under closer.mu
// (closer.go, taken under clientConn.mu by teardown), nor under
// ledger.DeliveredIDs' own locks. Per-frame state that both read loops check (close state,
// channel lookup) is atomic.
package proxy
