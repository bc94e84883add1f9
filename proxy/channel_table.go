package proxy

import "sync/atomic"

// channelTable holds the open channels of one client connection. Lookups
// happen for every frame on both read loops, so they are lock-free: one
// atomic slot per channel id up to the negotiated channel_max. The slots
// come in chunks of slotChunk ids, made when a channel in them first opens:
// a connection with a few channels holds a few hundred bytes, not a slot
// for each of channel_max ids (16 KiB at 2047).
type channelTable struct {
	chunks []atomic.Pointer[[slotChunk]atomic.Pointer[channelState]]
	limit  int // ids up to channel_max are tracked

}

// slotChunk is how many channel ids share one lazily made chunk of slots.
const slotChunk = 64

func newChannelTable(channelMax uint16) *channelTable {
	limit := int(channelMax) + 1
	return &channelTable{
		chunks: make([]atomic.Pointer[[slotChunk]atomic.Pointer[channelState]], (limit+slotChunk-1)/slotChunk),
		limit:  limit,
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

// each calls f for every open channel.
func (t *channelTable) each(f func(ch *channelState)) {
	for i := range t.chunks {
		slots := t.chunks[i].Load()
		if slots == nil {
			continue
		}
		for j := range slots {
			if ch := slots[j].Load(); ch != nil {
				f(ch)
			}
		}
	}
}

func (t *channelTable) remove(id uint16, ch *channelState) {
	if s := t.slot(id, false); s != nil {
		s.CompareAndSwap(ch, nil)
	}
}
