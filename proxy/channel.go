package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// channelState is the proxy's view of one client channel. Two goroutines
// touch it: the client read loop (publishes, acks, consumes) and the backend
// read loop (deliveries, confirms). mu guards the fields below it; the
// decode scratch structs are each used by one loop only.
type channelState struct {
	id uint16

	// confirming is set once the client sent confirm.select; dropContent
	// while the content frames that follow belong to a method the proxy
	// discarded. Only the client read loop uses them.
	confirming  bool
	dropContent bool

	mu       sync.Mutex
	confirms publisherConfirms
	tags     deliveryTags
	// consumers maps consumer tags to whether they were declared no-ack:
	// deliveries to a no-ack consumer are never acked and get no tag entry.
	consumers map[string]bool
	// pendingConsumes holds the no-ack flag of each basic.consume that asked
	// the server to choose the tag, until its consume-ok names it.
	pendingConsumes []bool
	// pendingGets holds the no-ack flag of each basic.get in flight.
	pendingGets []bool
	// transactional is set once the client sent tx.select. txSettled holds
	// the deliveries the client settled in the open transaction, restored
	// if it rolls back (the broker never applied those acks).
	transactional bool
	txSettled     []tagEntry
	// unknownConsumerNoAck is the mode of a consumer whose tag the server
	// chose without telling (basic.consume with no tag and no-wait).
	unknownConsumerNoAck bool

	// closedByProxy is set once the proxy itself closed the channel (see
	// closeChannelByProxy); closedByBackend once the backend sent
	// channel.close. Either way the channel only waits for its close-ok.
	closedByProxy   atomic.Bool
	closedByBackend atomic.Bool

	// Scratch for the client read loop.
	clientAck     frames.BasicAck
	clientNack    frames.BasicNack
	clientReject  frames.BasicReject
	clientConsume frames.BasicConsume
	clientGet     frames.BasicGet
	acks          []backendAck

	// Scratch for the backend read loop.
	deliver   frames.BasicDeliver
	getOk     frames.BasicGetOk
	consumeOk frames.BasicConsumeOk
	cancel    frames.BasicCancel
	cancelOk  frames.BasicCancelOk
	backAck   frames.BasicAck
	backNack  frames.BasicNack
	confirmed []clientConfirm
}

func newChannelState(id uint16) *channelState {
	return &channelState{id: id, consumers: make(map[string]bool)}
}

// channelTable holds the open channels of one client connection. Lookups
// happen for every frame on both read loops, so they are lock-free: one
// atomic slot per channel id up to the negotiated channel_max.
type channelTable struct {
	slots []atomic.Pointer[channelState]

	// staleIDs counts the ids in closeOksToSwallow, so the per-frame check
	// costs one atomic load while no proxy-initiated close is in flight.
	staleIDs atomic.Int32
	mu       sync.Mutex
	// closeOksToSwallow counts, per channel id, the channel.close-ok frames
	// the backend still owes for closes the proxy itself sent; until they
	// arrive, the backend's frames on that id belong to the dead channel.
	closeOksToSwallow map[uint16]int
}

func newChannelTable(channelMax uint16) *channelTable {
	return &channelTable{
		slots:             make([]atomic.Pointer[channelState], int(channelMax)+1),
		closeOksToSwallow: make(map[uint16]int),
	}
}

// get returns the open channel with this id, or nil.
func (t *channelTable) get(id uint16) *channelState {
	if int(id) >= len(t.slots) {
		return nil
	}
	return t.slots[id].Load()
}

// open records a new channel; ids above channel_max are not tracked (the
// backend refuses them).
func (t *channelTable) open(id uint16) *channelState {
	ch := newChannelState(id)
	if int(id) < len(t.slots) {
		t.slots[id].Store(ch)
	}
	return ch
}

func (t *channelTable) remove(id uint16, ch *channelState) {
	if int(id) < len(t.slots) {
		t.slots[id].CompareAndSwap(ch, nil)
	}
}

// expectCloseOk records that the proxy sent channel.close to the backend.
func (t *channelTable) expectCloseOk(id uint16) {
	t.mu.Lock()
	if t.closeOksToSwallow[id] == 0 {
		t.staleIDs.Add(1)
	}
	t.closeOksToSwallow[id]++
	t.mu.Unlock()
}

// isStale reports whether backend frames on id belong to a channel the proxy
// closed and the backend has not confirmed closing yet.
func (t *channelTable) isStale(id uint16) bool {
	if t.staleIDs.Load() == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closeOksToSwallow[id] > 0
}

// swallowCloseOk consumes one expected close-ok and reports whether there was one.
func (t *channelTable) swallowCloseOk(id uint16) bool {
	if t.staleIDs.Load() == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.closeOksToSwallow[id]
	switch n {
	case 0:
		return false
	case 1:
		delete(t.closeOksToSwallow, id)
		t.staleIDs.Add(-1)
	default:
		t.closeOksToSwallow[id] = n - 1
	}
	return true
}
