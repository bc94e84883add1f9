// Package proxy is amqp-mirror's client-facing AMQP 0-9-1 server. No client
// can tell it from the broker behind it: connection.start carries the
// broker's own properties, the broker authenticates the client's own
// credentials, and every method passes with its exact semantics.
//
// # Shape
//
// Each client connection (clientConn) owns its backend connection, opened
// during the handshake with the client's credentials and vhost. Client
// channel N is backend channel N. Two goroutines run per connection: the
// client read loop (client → backend) and the backend read loop (backend →
// client); heartbeats are checked from a timer. A read loop queues frames on
// the opposite socket's writer (socketWriter) and flushes when its own socket
// runs dry, so a burst of frames costs one system call, and flushes that meet
// a write in flight join it. A slow reader on either side slows the other side through
// TCP flow control: the proxy buffers at most two write buffers and one frame
// per direction, and sockets hold pooled buffers only while they have data.
//
// The client sees the proxy's own delivery tags and confirm sequence
// numbers (deliveryTags, publisherConfirms), each mapped to a backend and
// the backend's number. With one backend they coincide and frames pass
// unchanged; the mapping is what lets mirroring merge several backends onto
// one client channel and move consumers between them.
//
// The proxy decodes only what it acts on: connection and channel lifecycle,
// basic.consume/get/deliver/ack/nack/reject/recover, confirm.select, tx.
// Everything else, content headers and bodies included, passes as it came.
//
// # Closing
//
// Every connection ends with a CloseReason. The connection-level close
// handshake runs through the proxy (closeState): a client's close goes to
// the backend and the backend's close-ok back; a backend's close goes to the
// client and its close-ok back; a close of the proxy's own (backend lost,
// protocol error, shutdown) ends when the client answers or CloseTimeout
// passes. teardown is the one way out and is idempotent.
//
// # Locks
//
// Lock order: Server.mu, then clientConn.mu, then channelState.mu, then
// channelTable.mu, then socketWriter.mu. socketWriter.mu is never held
// during a system call (the writer releases it around each write), and
// nothing else is taken under it.
// Per-frame state that both read loops check (close state, channel lookup)
// is atomic.
package proxy
