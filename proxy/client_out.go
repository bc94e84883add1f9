package proxy

import (
	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// clientOut is what a connection writes to its client while it serves: the
// frames the links send on (replies, deliveries, returns, confirms,
// cancels), whole messages, and the proxy's own answers. Its fields are
// set by newClientConn and only read after, and it keeps no state of its
// own, so clientConn, its router and its settler each hold a copy.
//
// Every goroutine that writes to the client uses it: the link read loops,
// the client loop (the proxy's own answers and channel closes), the
// failover goroutine (cancelled consumers), the server's watcher (released
// confirms) and whoever loses a link. The client socket's writer
// (internal/wire) takes its lock inside each write and never holds it
// over a system call, so any goroutine may write.
//
// What goes out on a channel goes under the channel's outMu, so that a
// message's frames, its delivery tag and the confirms reach the client in
// the order they were assigned: the methods named OnChannel take it;
// frame, method, content and confirm are called with it held (or on
// channel 0, which has none).
//
// Writes are queued, not flushed: the link loops flush the client when
// their socket runs dry, and a goroutine that is no read loop flushes what
// it wrote itself (flush). A failed write ends the connection (gone); the
// socket keeps its first write error, so every later write fails at once.
// The connection's close handshake and heartbeats write to the socket
// directly (clientConn.client), as they flush at once and handle their own
// failures.
type clientOut struct {
	sock *wire.Socket
	// gone ends the connection after a write to the client failed
	// (clientConn.teardown with ReasonClientGone).
	gone func(err error)
}

// frame passes a frame to the client as it came.
func (o *clientOut) frame(f frames.Frame) {
	if err := o.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
		o.gone(err)
	}
}

// method writes a method to the client on channel.
func (o *clientOut) method(channel uint16, m frames.Method) {
	if err := o.sock.WriteMethod(channel, m); err != nil {
		o.gone(err)
	}
}

// frameOnChannel passes a frame to the client on its channel's output.
func (o *clientOut) frameOnChannel(ch *channelState, f frames.Frame) {
	ch.outMu.Lock()
	o.frame(f)
	ch.outMu.Unlock()
}

// methodOnChannel writes a method to the client on its channel's output.
func (o *clientOut) methodOnChannel(ch *channelState, m frames.Method) {
	ch.outMu.Lock()
	o.method(ch.id, m)
	ch.outMu.Unlock()
}

// sendOnChannel writes a method to the client on its channel's output and
// flushes it.
func (o *clientOut) sendOnChannel(ch *channelState, m frames.Method) {
	o.methodOnChannel(ch, m)
	o.flush()
}

// content writes a message's content frames to the client, with header as
// its content header.
func (o *clientOut) content(channel uint16, m *message, header []byte) error {
	if err := o.sock.WriteFrame(frames.FrameHeader, channel, header); err != nil {
		return err
	}
	off := 0
	for _, n := range m.sizes {
		if err := o.sock.WriteFrame(frames.FrameBody, channel, m.body[off:off+n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// confirm writes one of the client's publisher confirms.
func (o *clientOut) confirm(channel uint16, cc ledger.ClientConfirm) {
	if cc.Nack {
		o.method(channel, &frames.BasicNack{DeliveryTag: cc.Seq, Multiple: cc.Multiple})
		return
	}
	o.method(channel, &frames.BasicAck{DeliveryTag: cc.Seq, Multiple: cc.Multiple})
}

// flush sends what was written (or leaves it to the write in flight).
func (o *clientOut) flush() { o.sock.Flush() }
