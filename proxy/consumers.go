package proxy

import (
	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// channelConsumers are a channel's consumers: those consuming, by tag, those
// whose link was lost (orphans), as they were, until they move (failover.go)
// or the client cancels them, and the tag of the consumer of
// amq.rabbitmq.reply-to. The channel holds them by value and they are
// guarded by the channel's mu; their methods are called with it held, by
// channelState's methods only. The client loop adds and cancels consumers,
// the link loops look them up for every delivery and drop those of a lost
// link, and the failover goroutine moves the orphans.
type channelConsumers struct {
	byTag    map[string]consumer
	orphaned map[string]consumer
	// replyTag is the tag of the consumer of amq.rabbitmq.reply-to, which
	// consumes on every link the channel is open on (replyto.go).
	replyTag string
}

// consumer is one consumer of a channel.
type consumer struct {
	noAck bool
	link  int              // the backend link it consumes on
	queue *ledger.QueueRef // the mirrored queue it consumes, nil without mirroring
	// args are its basic.consume's arguments, to consume again on a new
	// master; cancelOnFailover is its x-cancel-on-ha-failover.
	args             []byte
	cancelOnFailover bool
	// What list_consumers shows (views.go): the queue as the client named
	// it, basic.consume's exclusive flag and arguments (a decoded table is
	// never changed, so holding it is safe), and the channel's per-consumer
	// prefetch at the consume.
	queueName string
	exclusive bool
	arguments frames.Table
	prefetch  uint16
}

// addReply records the consumer of amq.rabbitmq.reply-to, on link.
func (cs *channelConsumers) addReply(tag string, link int) {
	cs.byTag[tag] = consumer{noAck: true, link: link, queueName: mirror.ReplyToQueue}
	cs.replyTag = tag
}

// takeReply reports whether tag is the consumer of amq.rabbitmq.reply-to,
// and if so forgets that there is one.
func (cs *channelConsumers) takeReply(tag string) bool {
	mine := cs.isReply(tag)
	if mine {
		cs.replyTag = ""
	}
	return mine
}

// isReply reports whether tag is the consumer of amq.rabbitmq.reply-to,
// which every link delivers to.
func (cs *channelConsumers) isReply(tag string) bool {
	return tag != "" && tag == cs.replyTag
}

// clientCancels returns the consumer the client cancels, if known; one that
// waits for a new master (an orphan) ends here, and is returned as it was
// on its old master, which may still have it (orphan.uncancelled).
func (cs *channelConsumers) clientCancels(tag string) (consumer, bool) {
	cons, known := cs.byTag[tag]
	if !known {
		cons, known = cs.orphaned[tag]
	}
	delete(cs.orphaned, tag)
	return cons, known
}

// brokerCancels applies a broker's basic.cancel of tag on link, and reports
// whether the client is to see it: not when it comes from the old master
// of a consumer that moved.
func (cs *channelConsumers) brokerCancels(tag string, link int) bool {
	cons, known := cs.byTag[tag]
	if known && cons.link != link || !known && cs.isOrphan(tag) {
		return false
	}
	delete(cs.byTag, tag)
	return true
}

// forDelivery returns the consumer a delivery with tag from link is for
// (the one without a tag when tag is unknown), and whether the delivery is
// stale: from a link its consumer no longer consumes on.
func (cs *channelConsumers) forDelivery(tag string, link int) (cons consumer, stale bool) {
	cons, known := cs.byTag[tag]
	stale = known && cons.link != link && !cs.isReply(tag) || !known && cs.isOrphan(tag)
	if !known {
		cons = cs.byTag[""]
	}
	return cons, stale
}

// orphan makes the consumer with tag of channel ch an orphan, appended to
// orphans: it waits for its queue's new master.
func (cs *channelConsumers) orphan(ch *channelState, tag string, cons consumer, orphans []orphan) []orphan {
	delete(cs.byTag, tag)
	if cs.orphaned == nil {
		cs.orphaned = make(map[string]consumer)
	}
	cs.orphaned[tag] = cons
	return append(orphans, orphan{ch: ch, tag: tag, cons: cons})
}

// isOrphan reports whether the consumer with tag is an orphan.
func (cs *channelConsumers) isOrphan(tag string) bool {
	_, orphan := cs.orphaned[tag]
	return orphan
}

// orphanMoved makes the consumers of mirrored queues of channel ch for
// which moved reports true orphans, appended to orphans.
func (cs *channelConsumers) orphanMoved(ch *channelState, moved func(consumer) bool, orphans []orphan) []orphan {
	for tag, cons := range cs.byTag {
		if cons.queue != nil && moved(cons) {
			orphans = cs.orphan(ch, tag, cons, orphans)
		}
	}
	return orphans
}

// adoptOrphan records the orphan with tag as consuming again (moved), and
// reports false when the client cancelled it meanwhile.
func (cs *channelConsumers) adoptOrphan(tag string, moved consumer) bool {
	if !cs.isOrphan(tag) {
		return false
	}
	delete(cs.orphaned, tag)
	cs.byTag[tag] = moved
	return true
}

// dropOrphan forgets the consumer with tag for good, and reports whether it
// was still an orphan (false: the client cancelled it itself).
func (cs *channelConsumers) dropOrphan(tag string) bool {
	delete(cs.byTag, tag)
	wasOrphan := cs.isOrphan(tag)
	delete(cs.orphaned, tag)
	return wasOrphan
}

// lostLink forgets the consumers of channel ch on link: with keepMirrored,
// those of mirrored queues become orphans, appended to orphans; the others
// are returned in cancelled.
func (cs *channelConsumers) lostLink(ch *channelState, link int, keepMirrored bool, orphans []orphan) (_ []orphan, cancelled []string) {
	for tag, cons := range cs.byTag {
		if cons.link != link {
			continue
		}
		if cons.queue != nil && keepMirrored {
			orphans = cs.orphan(ch, tag, cons, orphans)
			continue
		}
		delete(cs.byTag, tag)
		cancelled = append(cancelled, tag)
	}
	return orphans, cancelled
}

// appendTo appends the consumers of channel id to out, the orphans
// inactive; backend names a link's backend.
func (cs *channelConsumers) appendTo(out []mirror.Consumer, id uint16, backend func(link int) string) []mirror.Consumer {
	add := func(tag string, cons consumer, active bool) {
		out = append(out, mirror.Consumer{
			Queue:         cons.queueName,
			Channel:       id,
			Tag:           tag,
			AckRequired:   !cons.noAck,
			Exclusive:     cons.exclusive,
			PrefetchCount: int(cons.prefetch),
			Active:        active,
			Arguments:     tableValues(cons.arguments),
			Backend:       backend(cons.link),
		})
	}
	for tag, cons := range cs.byTag {
		add(tag, cons, true)
	}
	for tag, cons := range cs.orphaned {
		add(tag, cons, false)
	}
	return out
}
