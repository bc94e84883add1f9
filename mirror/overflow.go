package mirror

import "github.com/amqp-mirror/amqp-mirror/frames"

// RefusalDeadLettered reports whether a queue declared with arguments (the
// queue.declare field table as it came on the wire) dead-letters the
// publishes its overflow refuses: x-overflow reject-publish-dlx with an
// x-dead-letter-exchange. The master's broker then dead-letters a refused
// publish into its own copies of the targets, so the slaves' copies of it
// are rejected for their brokers to do the same (see "Dead-lettering");
// otherwise a refused publish is dropped, and so are the slaves' copies.
func RefusalDeadLettered(arguments []byte) bool {
	if len(arguments) == 0 {
		return false
	}
	table, n, err := frames.DecodeTable(arguments)
	if err != nil || n != len(arguments) {
		return false
	}
	overflow, _ := table.Get("x-overflow")
	_, deadLetters := table.Get("x-dead-letter-exchange")
	return overflow == "reject-publish-dlx" && deadLetters
}
