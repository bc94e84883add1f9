// Package ledger is the proxy's bookkeeping of one client channel's
// messages, with no I/O: the delivery tags the client sees, each mapped to
// the backend, link generation and backend tag it stands for
// (DeliveryTags); the publisher confirms the client is owed, counted per
// backend and quorum (PublisherConfirms); and, across connections, the
// record of recent deliveries of mirrored queues that flags a promoted
// slave's redeliveries (DeliveredIDs).
//
// DeliveryTags and PublisherConfirms are plain values, not safe for
// concurrent use: the channel that holds them guards them. DeliveredIDs is
// shared by every connection of a server and locks itself: DeliveredIDs.mu,
// then one queue's record lock, and nothing is taken under either.
package ledger
