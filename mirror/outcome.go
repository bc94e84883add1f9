package mirror

// Outcome is what became of the master's copies of messages, as the proxy
// tells the trimmers of the slaves' copies (and, in a sidecar cluster, the
// proxies beside the slaves).
type Outcome uint8

const (
	// Acked: the master's copies are gone; the slaves' copies are acked.
	Acked Outcome = iota
	// Rejected: a client rejected the master's copies without requeue,
	// and the master's broker dead-letters them; the slaves' copies are
	// rejected the same way, each broker dead-lettering its own.
	Rejected
	// Delivered: the master's copies are with a client that has not
	// settled them. A broker never expires such a delivery, so the
	// slaves' copies are not given back at their TTL meanwhile.
	Delivered
	// Requeued: the master's copies are back in its queue, where their
	// TTL applies again: the slaves' copies whose TTL passed are given
	// back, for their brokers to expire them as the master's does.
	Requeued
)

// String names the outcome for logs.
func (o Outcome) String() string {
	switch o {
	case Acked:
		return "acked"
	case Rejected:
		return "rejected"
	case Delivered:
		return "delivered"
	case Requeued:
		return "requeued"
	}
	return "unknown"
}
