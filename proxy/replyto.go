package proxy

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Direct reply-to (amq.rabbitmq.reply-to, see mirror.ReplyToNode) with
// mirroring. A request published with reply_to=amq.rabbitmq.reply-to to a
// mirrored queue goes to every copy's broker, and each broker rewrites the
// reply_to to a name of the publishing channel of its own, or refuses the
// publish (406 "fast reply consumer does not exist") on a channel that does
// not consume amq.rabbitmq.reply-to. So a channel whose client consumes
// amq.rabbitmq.reply-to consumes it on every link the channel is open on,
// with the client's tag, and on each link it opens on later, before
// anything else is sent there: whichever copy a server reads, its reply_to
// names a channel of this client on that copy's broker, and a reply
// delivered there reaches the client under its one consumer tag. The client
// gets the home link's consume-ok and cancel-ok; the others are swallowed.
//
// A reply, a publish to the default exchange with routing key
// amq.rabbitmq.reply-to.<suffix>, goes to the backend that owns the name's
// pid (Mirror.ReplyBackend) and to no other, since another broker would try
// to reach that pid's node. A reply whose owner no live backend is, is
// dropped, as a broker drops a reply to a channel that is gone.

// consumeReplyTo starts the client's consumer of amq.rabbitmq.reply-to. A
// consume without a tag gets one made as RabbitMQ makes them, so that the
// consumer has one tag on every link, the one the client learns.
func (rt *router) consumeReplyTo(ch *channelState, f frames.Frame, d *frames.BasicConsume) error {
	home := rt.links.home()
	if home == nil {
		return nil
	}
	targets := rt.reach(ch, home.name)
	if len(targets) == 0 {
		return nil
	}
	home = targets[0]
	if !d.NoAck {
		// The broker refuses it with 406 and closes the channel.
		rt.sendTo(ch, f, nil, []*link{home}, !d.NoWait)
		return nil
	}
	if d.ConsumerTag == "" {
		d.ConsumerTag = newConsumerTag()
	}
	ch.addReplyConsumer(d.ConsumerTag, home.idx)
	client := frames.Frame{Type: frames.FrameMethod, Channel: ch.id, Payload: d.Append(nil)}
	rt.send(ch, client, []*link{home}, !d.NoWait, nil)
	for _, l := range rt.links.openOn(ch) {
		if l != home {
			l.expect(ch.id, nil) // consume-ok
			if err := l.sock.WriteMethod(ch.id, replyConsume(d.ConsumerTag)); err != nil {
				rt.writeFailed(l, err)
			}
		}
	}
	return nil
}

// replyConsume is the consume of amq.rabbitmq.reply-to the proxy sends on a
// link other than the home link, for the client's consumer tag.
func replyConsume(tag string) *frames.BasicConsume {
	return &frames.BasicConsume{Queue: mirror.ReplyToQueue, ConsumerTag: tag, NoAck: true}
}

// replyConsumerTag returns the tag of the channel's consumer of
// amq.rabbitmq.reply-to, "" when it has none.
func (ch *channelState) replyConsumerTag() string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.consumers.replyTag
}

// cancelReplyTo ends the consumer of amq.rabbitmq.reply-to on the links the
// channel is open on other than targets, where the client's cancel goes,
// when tag is that consumer's.
func (rt *router) cancelReplyTo(ch *channelState, tag string, targets []*link) {
	if !ch.takeReplyConsumer(tag) {
		return
	}
	for _, l := range rt.links.openOn(ch) {
		if containsLink(targets, l) {
			continue
		}
		l.expect(ch.id, nil) // cancel-ok
		if err := l.sock.WriteMethod(ch.id, &frames.BasicCancel{ConsumerTag: tag}); err != nil {
			rt.writeFailed(l, err)
		}
	}
}

func containsLink(links []*link, l *link) bool {
	for _, x := range links {
		if x == l {
			return true
		}
	}
	return false
}

// replyQueueMethod routes a queue method on amq.rabbitmq.reply-to or a
// name made of it. A passive declare of a made name asks whether its
// consumer is still there: its owner answers, and the proxy answers 404
// when no live backend owns it. Everything else the home broker answers
// (403 for a declare of an amq. name, 404 for a bind).
func (rt *router) replyQueueMethod(ch *channelState, f frames.Frame, key uint32, q queueMethod, wantReply bool) error {
	if key != frames.QueueDeclareKey || !q.passive || q.queue == mirror.ReplyToQueue {
		rt.sendTo(ch, f, nil, rt.links.homeOnly(), wantReply)
		return nil
	}
	var targets []*link
	if node, ok := mirror.ReplyToNode(q.queue); ok {
		ctx, cancel := mirrorContext(rt.ctx)
		backend, owned := rt.mirror.ReplyBackend(ctx, node)
		cancel()
		if owned {
			targets = rt.reach(ch, backend)
		}
	}
	if len(targets) == 0 {
		rt.closeChannel(ch, frames.NotFound,
			fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '%s'", q.queue, rt.vhost), 50, 10)
		return nil
	}
	rt.sendTo(ch, f, nil, targets, wantReply)
	return nil
}

// newConsumerTag makes a consumer tag as RabbitMQ does: "amq.ctag-" and 16
// random octets in URL-safe base64.
func newConsumerTag() string {
	var b [16]byte
	rand.Read(b[:])
	return "amq.ctag-" + base64.RawURLEncoding.EncodeToString(b[:])
}
