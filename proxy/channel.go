package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/amqp-mirror/amqp-mirror/frames"

	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// channelState is the proxy's view of one client channel. The client read
// loop and the read loop of every link that serves the channel touch it; mu
// guards the fields below it, and the decode scratch structs are used by the
// client read loop only (each link has its own, see link).
type channelState struct {
	id uint16

	// confirming is set once the client sent confirm.select (the link read
	// loops read it for every confirm).
	confirming atomic.Bool
	// ownConfirms is set once the proxy put the channel's backend sides in
	// confirm mode itself, at its first publish to several copies, the
	// client having selected neither confirms nor transactions: the
	// backends' confirms then tell the proxy which slave copies may lack a
	// publish (Mirror.Missed) and never reach the client.
	ownConfirms atomic.Bool

	// Client read loop only.
	//
	// dropContent is set while the content frames that follow belong to a
	// method the proxy discarded; pub is the publish whose content frames
	// are coming.
	dropContent bool
	pub         publishing
	// heldPublish is the method of a publish to an exchange, held until
	// its content header says where it goes (empty otherwise; the buffer
	// is kept for the next one).
	heldPublish []byte
	route       publishRoute
	// qos is the client's last basic.qos, repeated on every link the
	// channel opens on later.
	qos *frames.BasicQos

	// outMu serialises what the link read loops write to the client on this
	// channel: a message's frames go out together, and delivery tags and
	// confirms in the order they were assigned. Taken before mu.
	outMu sync.Mutex

	mu       sync.Mutex
	confirms ledger.PublisherConfirms
	tags     ledger.DeliveryTags
	// consumers are the channel's consumers by tag; orphaned are those
	// whose link was lost, until they move (failover.go) or the client
	// cancels them.
	consumers map[string]consumer
	orphaned  map[string]bool
	// replyTag is the tag of the consumer of amq.rabbitmq.reply-to, which
	// consumes on every link the channel is open on (replyto.go).
	replyTag string
	// transactional is set once the client sent tx.select. txSettled holds
	// the deliveries the client settled in the open transaction, restored
	// if it rolls back (the broker never applied those acks).
	transactional bool
	txSettled     []ledger.TagEntry
	// txTrims says, for each of txSettled, what its commit does to the
	// slave copies.
	txTrims []trimKind
	// tx is the transaction the proxy keeps itself, on a channel in its own
	// confirm mode (txemulated.go).
	tx emulatedTx
	// The channel close in progress (see chanclose.go).
	closer    *link                // the link whose channel.close the client gets
	notice    *frames.ChannelClose // the close the client gets once closeWait is 0
	closeWait int                  // links that still owe close-ok for the proxy's close
	// crossed: the client closed the channel too before it saw the notice;
	// it gets close-ok instead, once closeWait is 0.
	crossed bool
	// returns counts, for mandatory publishes sent to several backends,
	// the backends that returned each (see returnArrived).
	returns returnCounts
	// confirmedLost is scratch for the confirms a lost link settles, missed
	// for the slave copies it leaves short of publishes.
	confirmedLost []ledger.ClientConfirm
	missed        []ledger.MissedCopy

	// closing is the channel's close state (chanClosing…), set under mu and
	// read on every frame.
	closing atomic.Uint32

	// Scratch for the client read loop.
	clientAck     frames.BasicAck
	clientNack    frames.BasicNack
	clientReject  frames.BasicReject
	clientConsume frames.BasicConsume
	clientGet     frames.BasicGet
	clientPublish frames.BasicPublish
	clientQueue   queueMethod
	acks          []ledger.BackendAck
	trims         []ledger.Trimmed
	reachable     []*link
}

// consumer is one consumer of a channel.
type consumer struct {
	noAck bool
	link  int              // the backend link it consumes on
	queue *ledger.QueueRef // the mirrored queue it consumes, nil without mirroring
	// args are its basic.consume's arguments, to consume again on a new
	// master; cancelOnFailover is its x-cancel-on-ha-failover.
	args             []byte
	cancelOnFailover bool
}

func newChannelState(id uint16) *channelState {
	return &channelState{id: id, consumers: make(map[string]consumer)}
}

// selectConfirms puts the channel in confirm mode for the client; on a
// channel the proxy already numbers publishes on, the client's first
// publish is 1.
func (ch *channelState) selectConfirms() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !ch.confirming.Load() {
		ch.confirms.ClientSelected()
	}
	ch.confirming.Store(true)
}

// selectTransactions records the client's tx.select: from now on the
// deliveries it settles are kept until the transaction ends.
func (ch *channelState) selectTransactions() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.transactional = true
}

// endTransaction applies tx.commit or tx.rollback to the deliveries the
// transaction settled: a rollback makes them outstanding again, a commit
// hands them to commit (which trims their slave copies) under the lock.
func (ch *channelState) endTransaction(rollback bool, commit func([]ledger.TagEntry, []trimKind)) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if rollback {
		ch.tags.Restore(ch.txSettled)
	} else {
		commit(ch.txSettled, ch.txTrims)
	}
	ch.txSettled = ch.txSettled[:0]
	ch.txTrims = ch.txTrims[:0]
}

// forgetDeliveries voids every outstanding delivery tag, after
// basic.recover-async.
func (ch *channelState) forgetDeliveries() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.tags.DropAll()
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
