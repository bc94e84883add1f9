package mirror

import "errors"

// ErrQueueNotFound is what the engine's SyncQueue and CancelSyncQueue
// return (wrapped) for a queue the metadata log does not hold; the admin
// API answers it with 404.
var ErrQueueNotFound = errors.New("queue not found")

// QueueStatus is one row of `amqp-mirror ctl list_queues`: a queue's
// metadata with what its master's broker says about it now.
type QueueStatus struct {
	Meta QueueMeta `json:"meta"`
	// MessagesReady and Consumers are the master's counts
	// (queue.declare-ok); MessagesUnacked are the messages the proxies'
	// clients hold unacknowledged; Messages is the two together, as
	// RabbitMQ counts a queue's messages. -1 when unknown: the master could
	// not be asked, or a live proxy did not answer.
	Messages        int `json:"messages"`
	MessagesReady   int `json:"messages_ready"`
	MessagesUnacked int `json:"messages_unacknowledged"`
	Consumers       int `json:"consumers"`
	// Policy is the name of the effective policy, "" for none.
	Policy string `json:"policy"`
	// Syncing names the slaves a synchronisation is copying to now.
	Syncing []string `json:"syncing,omitempty"`
	// Refused names the backends that refuse the proxy's own account in the
	// queue's vhost (the vhost is missing there, or the account lacks
	// permissions in it): the policy places no copy there until they accept.
	Refused []string `json:"refused,omitempty"`
}
