package controllink

import (
	"container/heap"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Expiry. RabbitMQ never expires a message while it is delivered and
// unacknowledged, and the trimmer holds every message of its slave copy
// that way: left alone, a message that expired on the master (and was
// dropped or dead-lettered there) would stay on the slave for ever. So the
// trimmer works out when each held delivery expires and then gives it back
// to its broker (basic.nack with requeue). RabbitMQ expires a requeued
// message whose time is up and dead-letters it through the slave broker's
// own dead-letter exchange, into that broker's copy of the target queue:
// each broker dead-letters its own copy, so every copy of the target gets
// the message once.

// QueueTTL returns the x-message-ttl of a queue's declare arguments, zero
// when absent, not a number, or not positive. Zero means no queue TTL.
// (x-message-ttl=0, "expire unless delivered at once", is treated as none:
// a slave copy cannot tell whether its master delivered the message.)
func QueueTTL(args amqp.Table) time.Duration {
	var ms int64
	switch v := args["x-message-ttl"].(type) {
	case int8:
		ms = int64(v)
	case int16:
		ms = int64(v)
	case int32:
		ms = int64(v)
	case int64:
		ms = v
	case int:
		ms = int64(v)
	case uint8:
		ms = int64(v)
	case uint16:
		ms = int64(v)
	case uint32:
		ms = int64(v)
	case uint64:
		if v > uint64(maxTTL.Milliseconds()) {
			return 0
		}
		ms = int64(v)
	default:
		return 0
	}
	if ms <= 0 || ms > maxTTL.Milliseconds() {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// maxTTL is the longest TTL RabbitMQ accepts (2^32-1 ms, about 49 days);
// anything larger is not a TTL the broker would apply.
const maxTTL = (1<<32 - 1) * time.Millisecond

// expiresIn returns how long after its receipt a delivery expires: the
// smaller of the queue's TTL (zero: none) and the message's expiration
// property (milliseconds as a decimal string; "" or malformed: none,
// since RabbitMQ refuses a malformed one at publish). ok is false when
// the delivery never expires.
func expiresIn(queueTTL time.Duration, expiration string) (d time.Duration, ok bool) {
	if queueTTL > 0 {
		d, ok = queueTTL, true
	}
	if expiration == "" {
		return d, ok
	}
	ms, err := strconv.ParseUint(expiration, 10, 32)
	if err != nil {
		return d, ok
	}
	per := time.Duration(ms) * time.Millisecond
	if !ok || per < d {
		d, ok = per, true
	}
	return d, ok
}

// expirySlack is added to each expiry: the broker's clock counts in whole
// milliseconds, and a message given back a moment too early only comes
// straight back.
const expirySlack = 5 * time.Millisecond

// expiring is one held delivery with an expiry.
type expiring struct {
	at        time.Time
	tag       uint64
	id        mirror.MessageID
	byContent bool
}

// expiryQueue orders held deliveries by expiry, earliest first, so that
// one timer set to the front serves them all.
type expiryQueue []expiring

func (q expiryQueue) Len() int { return len(q) }
func (q expiryQueue) Less(i, j int) bool {
	if q[i].at.Equal(q[j].at) {
		return q[i].tag < q[j].tag
	}
	return q[i].at.Before(q[j].at)
}
func (q expiryQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *expiryQueue) Push(x any)   { *q = append(*q, x.(expiring)) }
func (q *expiryQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

func (q *expiryQueue) add(e expiring) { heap.Push(q, e) }

// next returns the earliest expiry, false when none.
func (q expiryQueue) next() (time.Time, bool) {
	if len(q) == 0 {
		return time.Time{}, false
	}
	return q[0].at, true
}

// due removes and returns the entries whose expiry is not after now.
func (q *expiryQueue) due(now time.Time) []expiring {
	var out []expiring
	for len(*q) > 0 && !(*q)[0].at.After(now) {
		out = append(out, heap.Pop(q).(expiring))
	}
	return out
}
