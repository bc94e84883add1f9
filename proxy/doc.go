// Package proxy is amqp-mirror's client-facing AMQP 0-9-1 server. No client
// can tell it from the broker behind it: connection.start carries the
// broker's own properties, the broker authenticates the client's own
// credentials, and every method passes with its exact semantics.
//
// # Shape
//
// Each client connection (clientConn) has a link (link.go) to each backend it
// needs: the home link, opened during the handshake with the client's
// credentials and vhost to the first backend that answers (Options.Backend
// first, none the engine counts down), and, with mirroring (a Mirror is
// configured), links to the other backends, opened on first need with the
// same credentials.
// Client channel N is channel N on every link it is open on; it opens on a
// link when a method first needs it there, and the proxy repeats on it what
// the client set (prefetch, confirm or transaction mode). One goroutine reads
// the client (the client loop) and one reads each link; heartbeats are
// checked from a timer. A read loop queues frames on the sockets it writes to
// (wire.Socket, the socket layer in internal/wire) and flushes them when its
// own socket runs dry, so a burst of frames costs one system call, and
// flushes that meet a write in flight join it. A slow reader on either side slows the other side through TCP flow
// control: the proxy buffers at most two write buffers and one frame per
// direction, and sockets hold pooled buffers only while they have data.
//
// A client frame travels one way (client_loop.go, route.go): decoded as far
// as the proxy acts on it, applied to its channel's state, routed to the
// links the method must reach (a queue's copies, every backend for an
// exchange, the master for a consume), and written there. A synchronous
// method sent to several links gives the client one reply, the first
// link's, once all answered (rpc.go); a link's replies are matched to
// requests by a queue per link and channel, since a broker answers a
// channel's requests in order. Deliveries, gets and returns are assembled
// whole before they reach the client (delivery.go), so frames of messages
// from two links never interleave on a client channel, and each channel's
// output (channelState.outMu) keeps its delivery tags and confirms in order.
//
// The client sees the proxy's own delivery tags and confirm sequence
// numbers (deliveryTags, publisherConfirms), each mapped to a link, its
// generation and the backend's number. A client's ack is split per link; an
// ack of a delivery whose link was lost settles nothing (the broker requeued
// it). A publish to a mirrored queue carries an identity header, added at
// publish and removed at delivery; the client's ack of a message from a
// master tells the engine, which trims the slaves. The client's confirm
// waits for the master and the synchronised slaves.
//
// When a link is lost the client connection goes on (failover.go): a lost
// home link hands channel 0 to another backend's link, and consumers of
// mirrored queues move to the promoted master with their tags. Without
// mirroring, the home link's loss ends the client connection with 320.
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
// passes. teardown is the one way out and is idempotent. A channel closes
// on every link it is open on, and the client sees one close handshake, as
// from one broker (chanclose.go).
//
// # Locks
//
// Lock order: clientConn.sendMu (the client loop, per frame), then
// Server.mu, then clientConn.mu, then channelState.outMu, then
// channelState.mu, then link.mu, then the socket writer's lock (internal/wire),
// which is never held during a system call (the writer releases it around each
// write), and nothing else is taken under it; nor under boundaryQueue.mu,
// which guards the link loops' writes that wait for the client loop to be
// between messages (boundary.go), nor under declaredQueues.mu (declared.go).
// Per-frame state that both read loops check (close state, channel lookup)
// is atomic.
package proxy
