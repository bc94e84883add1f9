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
	// backendContentOpen is set while the content frames the backend sends
	// belong to a method the proxy passed to the client (a delivery, a
	// get-ok, a return), which must reach the client whole. Only the
	// backend read loop uses it.
	backendContentOpen bool

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
// atomic slot per channel id up to the negotiated channel_max. The slots
// come in chunks of slotChunk ids, made when a channel in them first opens:
// a connection with a few channels holds a few hundred bytes, not a slot
// for each of channel_max ids (16 KiB at 2047).
type channelTable struct {
	chunks []atomic.Pointer[[slotChunk]atomic.Pointer[channelState]]
	limit  int // ids up to channel_max are tracked

	// closingIDs counts the ids in proxyCloses, so the per-frame check
	// costs one atomic load while no proxy-initiated close is in flight.
	closingIDs atomic.Int32
	mu         sync.Mutex
	// proxyCloses holds, per channel id, the closes the proxy itself
	// started (see closeChannelByProxy); until the backend's close-ok
	// arrives, its frames on that id belong to the dead channel.
	proxyCloses map[uint16]*proxyClose
}

// proxyClose is a channel close the proxy started.
type proxyClose struct {
	// closeOks is how many channel.close-ok the backend still owes.
	closeOks int
	// notice is the channel.close for the client, sent by the backend loop
	// with the backend's close-ok (see fromBackendOnClosedChannel); nil once
	// sent or no longer wanted.
	notice *frames.ChannelClose
}

// slotChunk is how many channel ids share one lazily made chunk of slots.
const slotChunk = 64

func newChannelTable(channelMax uint16) *channelTable {
	limit := int(channelMax) + 1
	return &channelTable{
		chunks:      make([]atomic.Pointer[[slotChunk]atomic.Pointer[channelState]], (limit+slotChunk-1)/slotChunk),
		limit:       limit,
		proxyCloses: make(map[uint16]*proxyClose),
	}
}

// slot is id's slot, or nil when id is beyond channel_max or its chunk was
// never needed (and create is false).
func (t *channelTable) slot(id uint16, create bool) *atomic.Pointer[channelState] {
	if int(id) >= t.limit {
		return nil
	}
	chunk := &t.chunks[int(id)/slotChunk]
	slots := chunk.Load()
	if slots == nil {
		if !create {
			return nil
		}
		// Only the client loop opens channels, but a CAS keeps this
		// correct for any caller.
		chunk.CompareAndSwap(nil, new([slotChunk]atomic.Pointer[channelState]))
		slots = chunk.Load()
	}
	return &slots[int(id)%slotChunk]
}

// get returns the open channel with this id, or nil.
func (t *channelTable) get(id uint16) *channelState {
	if s := t.slot(id, false); s != nil {
		return s.Load()
	}
	return nil
}

// open records a new channel; ids above channel_max are not tracked (the
// backend refuses them).
func (t *channelTable) open(id uint16) *channelState {
	ch := newChannelState(id)
	if s := t.slot(id, true); s != nil {
		s.Store(ch)
	}
	return ch
}

func (t *channelTable) remove(id uint16, ch *channelState) {
	if s := t.slot(id, false); s != nil {
		s.CompareAndSwap(ch, nil)
	}
}

// beginProxyClose records that the proxy sent channel.close to the backend
// and that the client is to receive notice.
func (t *channelTable) beginProxyClose(id uint16, notice *frames.ChannelClose) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pc := t.proxyCloses[id]
	if pc == nil {
		pc = &proxyClose{}
		t.proxyCloses[id] = pc
		t.closingIDs.Add(1)
	}
	pc.closeOks++
	pc.notice = notice
}

// isProxyClosing reports whether backend frames on id belong to a channel
// the proxy closed and the backend has not confirmed closing yet.
func (t *channelTable) isProxyClosing(id uint16) bool {
	if t.closingIDs.Load() == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.proxyCloses[id] != nil
}

// takeNotice returns the client's channel.close for id, once.
func (t *channelTable) takeNotice(id uint16) *frames.ChannelClose {
	t.mu.Lock()
	defer t.mu.Unlock()
	pc := t.proxyCloses[id]
	if pc == nil {
		return nil
	}
	notice := pc.notice
	pc.notice = nil
	return notice
}

// dropNotice forgets the client's notice: the client closed the channel
// itself meanwhile.
func (t *channelTable) dropNotice(id uint16) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pc := t.proxyCloses[id]; pc != nil {
		pc.notice = nil
	}
}

// closeOkArrived consumes one expected close-ok and reports whether there
// was one.
func (t *channelTable) closeOkArrived(id uint16) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	pc := t.proxyCloses[id]
	if pc == nil {
		return false
	}
	if pc.closeOks--; pc.closeOks == 0 {
		delete(t.proxyCloses, id)
		t.closingIDs.Add(-1)
	}
	return true
}
