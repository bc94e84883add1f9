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
	// Messages and Consumers are the master's counts (queue.declare-ok);
	// -1 when the master could not be asked.
	Messages  int `json:"messages"`
	Consumers int `json:"consumers"`
	// Policy is the name of the effective policy, "" for none.
	Policy string `json:"policy"`
	// Syncing names the slaves a synchronisation is copying to now.
	Syncing []string `json:"syncing,omitempty"`
}
