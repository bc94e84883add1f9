package mirror

import (
	"fmt"
	"slices"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// DeadLetterExchange names the internal fanout exchange, and the queue
// bound to it, into which every copy of a queue that drops its head
// (DropsHead) dead-letters, in each vhost of each backend. The proxy reads
// that queue and sends each message on where the client's own
// dead-letter arguments say (see "Dead-lettering" in doc.go): a broker
// dead-letters only into its own copies of the targets, and a drop must
// also be taken off the slaves.
const DeadLetterExchange = "amqp-mirror.dead-letters"

// DropsHead reports whether a queue declared with arguments (the
// queue.declare field table as it came on the wire) drops its oldest
// messages when full: x-max-length or x-max-length-bytes, with x-overflow
// absent or drop-head.
func DropsHead(arguments []byte) bool {
	table, ok := decodeArguments(arguments)
	if !ok {
		return false
	}
	return dropsHead(table)
}

func dropsHead(table frames.Table) bool {
	_, length := table.Get("x-max-length")
	_, bytes := table.Get("x-max-length-bytes")
	overflow, set := table.Get("x-overflow")
	return (length || bytes) && (!set || overflow == "drop-head")
}

// BrokerArguments returns the arguments the copies of a queue declared with
// arguments are declared with on the brokers: the same, but for a queue
// that drops its head, whose copies dead-letter into DeadLetterExchange
// whatever the client asked (the record keeps what it asked).
func BrokerArguments(arguments []byte) []byte {
	table, ok := decodeArguments(arguments)
	if !ok || !dropsHead(table) {
		return arguments
	}
	out, err := frames.AppendTable(nil, BrokerTable(table))
	if err != nil {
		return arguments
	}
	return out
}

// BrokerTable is BrokerArguments on a decoded table; it returns table
// itself when nothing changes, and never changes table.
func BrokerTable(table frames.Table) frames.Table {
	if !dropsHead(table) {
		return table
	}
	out := slices.Clone(table)
	out.Set("x-dead-letter-exchange", DeadLetterExchange)
	return out
}

// DeadLetterTarget returns the exchange and routing key a queue declared
// with arguments dead-letters to, as the client asked; ok is false when it
// dead-letters nowhere. key is "" when the message keeps its own routing
// keys.
func DeadLetterTarget(arguments []byte) (exchange, key string, ok bool) {
	table, decoded := decodeArguments(arguments)
	if !decoded {
		return "", "", false
	}
	x, ok := table.Get("x-dead-letter-exchange")
	if !ok {
		return "", "", false
	}
	exchange, ok = x.(string)
	if !ok {
		return "", "", false
	}
	if k, set := table.Get("x-dead-letter-routing-key"); set {
		key, _ = k.(string)
	}
	return exchange, key, true
}

// DeadLetterEquivalence checks the dead-letter arguments of a redeclare
// (declared) against the recorded ones, which the brokers' copies of a
// queue that drops its head do not carry (BrokerArguments), the way
// RabbitMQ checks them; "" when they match, otherwise the reply text of
// the 406 the channel is closed with.
func DeadLetterEquivalence(queue, vhost string, recorded, declared []byte) string {
	was, _ := decodeArguments(recorded)
	now, _ := decodeArguments(declared)
	for _, key := range []string{"x-dead-letter-exchange", "x-dead-letter-routing-key"} {
		current, hasCurrent := was.Get(key)
		received, hasReceived := now.Get(key)
		if hasCurrent == hasReceived && (!hasCurrent || fmt.Sprint(current) == fmt.Sprint(received)) {
			continue
		}
		return fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg '%s' for queue '%s' in vhost '%s': received %s but current is %s",
			key, queue, vhost, describeArgument(received, hasReceived), describeArgument(current, hasCurrent))
	}
	return ""
}

// describeArgument says an argument's value as RabbitMQ's inequivalence
// errors do.
func describeArgument(v any, present bool) string {
	if !present {
		return "none"
	}
	kind := "longstr"
	if _, ok := v.(string); !ok {
		kind = fmt.Sprintf("%T", v)
	}
	return fmt.Sprintf("the value '%v' of type '%s'", v, kind)
}

// decodeArguments decodes a queue's argument table; ok is false for a
// table that does not decode whole (nil decodes as empty).
func decodeArguments(arguments []byte) (frames.Table, bool) {
	if len(arguments) == 0 {
		return nil, true
	}
	table, n, err := frames.DecodeTable(arguments)
	if err != nil || n != len(arguments) {
		return nil, false
	}
	return table, true
}
