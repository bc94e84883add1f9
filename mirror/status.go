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
	// SyncCopied is how many messages that synchronisation copied so far,
	// as of its last progress report (every few seconds).
	SyncCopied int `json:"sync_copied,omitempty"`
	// Refused names the backends that refuse the proxy's own account in the
	// queue's vhost (the vhost is missing there, or the account lacks
	// permissions in it): the policy places no copy there until they accept.
	Refused []string `json:"refused,omitempty"`
	// Exclusive is set for an exclusive queue: it lives on its connection's
	// home backend alone, is never mirrored, and its broker tells only that
	// connection its counts (-1 here).
	Exclusive bool `json:"exclusive"`
}

// UnrecordedQueue is a queue declared through a proxy that the metadata
// log does not record: an exclusive queue, or a server-named one before a
// client names it (then it is adopted). It lives on one backend, the home
// of the connection that declared it, and is never mirrored. The proxies
// report theirs for list_queues as long as the declaring connection's
// link to that backend lasts.
type UnrecordedQueue struct {
	ID        QueueID `json:"id"`
	Backend   string  `json:"backend"`
	Exclusive bool    `json:"exclusive,omitempty"`
}
