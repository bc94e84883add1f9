package proxy

import (
	"github.com/amqp-mirror/amqp-mirror/frames"

	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// rpcGroup is one synchronous client request (queue.declare, basic.qos,
// tx.commit…) sent to one or more links: the client gets one reply, the
// primary link's, once every link answered. Each link answers its requests
// on a channel in order (AMQP), so a link's replies are matched to groups by
// a queue per link and channel (link.expect, link.nextReply).
//
// Replies reach the client as their groups complete. Clients wait for a
// synchronous reply before the next request on a channel, so groups complete
// in request order; the proxy's own requests on a link (channel.open and
// its replays) are swallowed and never reach the client.
type rpcGroup struct {
	pending int // replies still owed; guarded by the channel's mu
	// primary is the index of the link whose reply the client gets;
	// anyReply once that link was lost and another copy answers instead.
	// Guarded by the channel's mu: a link's loss changes it.
	primary int
	// own marks the proxy's own close of a channel on a link (its
	// close-ok is swallowed, and after runs at the end).
	own bool
	// reply is the primary's reply, kept when it arrives before the others.
	reply []byte
	// spare is the first reply of another link, the answer should the
	// primary's link be lost before it replies: every target got the same
	// request, so any copy's reply is one the client can take.
	spare []byte
	// after runs, on the read loop that completes the group, before the
	// reply is written: what the reply makes true (a queue's copies exist,
	// a consumer's tag is known) is recorded before the client can act on it.
	// It may return a replacement reply.
	after func(reply []byte) []byte
	// get carries what a basic.get needs when its get-ok arrives.
	get *pendingGet
	// settingOk answers a channel setting the proxy repeats on every link
	// it opens (onOpenLinks) when every link asked is lost unanswered.
	settingOk frames.Method
}

// anyReply is a group's primary once its primary link was lost: the
// first reply of another target is the client's.
const anyReply = -2

// pendingGet is a basic.get in flight.
type pendingGet struct {
	noAck bool
	queue *ledger.QueueRef
}

// isReply reports whether a method from a broker answers a client request.
func isReply(key uint32) bool {
	switch key {
	case frames.ChannelOpenOkKey, frames.ChannelFlowOkKey, frames.ChannelCloseOkKey,
		frames.ExchangeDeclareOkKey, frames.ExchangeDeleteOkKey, frames.ExchangeBindOkKey, frames.ExchangeUnbindOkKey,
		frames.QueueDeclareOkKey, frames.QueueBindOkKey, frames.QueuePurgeOkKey, frames.QueueDeleteOkKey, frames.QueueUnbindOkKey,
		frames.BasicQosOkKey, frames.BasicConsumeOkKey, frames.BasicCancelOkKey, frames.BasicGetOkKey, frames.BasicGetEmptyKey,
		frames.BasicRecoverOkKey, frames.TxSelectOkKey, frames.TxCommitOkKey, frames.TxRollbackOkKey, frames.ConfirmSelectOkKey:
		return true
	}
	return false
}

// send writes a client request to the links at targets, which must be open
// with the channel open on them (reach). With wantReply, the first target
// gives the client's reply, through a group, which it returns; after, when
// set, runs first.
func (rt *router) send(ch *channelState, f frames.Frame, targets []*link, wantReply bool, after func([]byte) []byte) *rpcGroup {
	g := newGroup(targets, wantReply, after, nil)
	rt.sendGroup(ch, f, targets, g)
	return g
}

// newGroup is the group for a request to targets, nil without wantReply.
func newGroup(targets []*link, wantReply bool, after func([]byte) []byte, settingOk frames.Method) *rpcGroup {
	if !wantReply {
		return nil
	}
	return &rpcGroup{pending: len(targets), primary: targets[0].idx, after: after, settingOk: settingOk}
}

// sendGroup writes a client request to targets, each expecting g's reply
// (none when g is nil).
func (rt *router) sendGroup(ch *channelState, f frames.Frame, targets []*link, g *rpcGroup) {
	for _, l := range targets {
		if g != nil {
			l.expect(ch.id, g)
		}
		if err := l.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
			rt.writeFailed(l, err)
		}
	}
}

// replyArrived matches a broker's reply to the request it answers and passes
// the group's reply to the client once every link answered.
func (rt *router) replyArrived(ch *channelState, l *link, f frames.Frame) {
	g, ok := l.nextReply(ch.id)
	if !ok {
		// Nothing the proxy sent asked for it: pass it on as it came.
		rt.out.frameOnChannel(ch, f)
		return
	}
	if g == nil {
		return // the reply to the proxy's own request
	}
	done, primary := ch.groupReplied(g, l.idx, f.Payload)
	if !done {
		return
	}
	if g.after == nil && primary {
		rt.out.frameOnChannel(ch, f)
		return
	}
	rt.finishGroup(ch, g)
}

// finishGroup runs a complete group's after and passes its reply on.
func (rt *router) finishGroup(ch *channelState, g *rpcGroup) {
	reply := g.reply
	if g.after != nil {
		reply = g.after(reply)
	}
	if reply == nil {
		return
	}
	rt.out.frameOnChannel(ch, frames.Frame{Type: frames.FrameMethod, Channel: ch.id, Payload: reply})
}

// abandonReply counts a reply that will never come (its link or channel
// closed) towards its group, and completes the group without it; a group
// whose primary reply is lost gives the client nothing.
func (rt *router) abandonReply(ch *channelState, g *rpcGroup) {
	if g == nil {
		return
	}
	if ch.groupAbandoned(g) && g.reply != nil {
		rt.finishGroup(ch, g)
	}
}

// settleLostReply settles what the lost link l owed to g: the client gets the
// answer of another copy, the proxy's answer to a setting, get-empty for a
// basic.get on a mirrored queue, or a 541 close when no copy can answer;
// or nothing yet, while other links still owe their replies.
func (rt *router) settleLostReply(ch *channelState, g *rpcGroup, l *link) {
	switch ch.groupLinkLost(g, l.idx) {
	case lostReply:
		rt.finishGroup(ch, g)
	case lostSetting:
		rt.out.methodOnChannel(ch, g.settingOk)
	case lostGet:
		// The lost master never answers; the queue is promoted to a
		// slave that still holds whatever message was on its way.
		// RabbitMQ's channel retries a get on a mirrored queue against
		// the new master rather than failing; get-empty is the answer
		// that leaves the client to ask again.
		rt.out.methodOnChannel(ch, &frames.BasicGetEmpty{})
	case lostUnanswered:
		rt.closeChannel(ch, frames.InternalError,
			"INTERNAL_ERROR - backend "+l.name+" connection lost", 0, 0)
	}
}
