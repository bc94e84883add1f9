package controllink

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Why a trimmer's deliveries bypass amqp091-go
//
// A trimmer receives every message of its slave copy once, and reads of it
// only the delivery tag, two headers (the identity and the sync marker),
// the expiration, and for a message without an identity its body.
// amqp091-go decodes each delivery whole (the method, every property, the
// headers table as a map, a fresh copy of the body) and hands it on
// through two goroutines: with two slave copies of every mirrored message,
// that was about a third of the proxy's CPU per message.
//
// So the connections of the proxy's own account (observedConn, which
// follows every frame the broker sends anyway) carry a Tap. A trimmer
// registers a sink for the consumer tag of each channel it consumes on,
// before it consumes; the Tap takes the deliveries for that tag out of
// the stream before amqp091-go reads it, reads what the trimmer needs in
// place, and queues it on the sink. Everything else, the consume-ok,
// cancel-ok and the broker's channel.close among it, reaches amqp091-go as
// before and in order: a delivery is on its sink before amqp091-go sees
// anything that came after it. A copy (CopyTo) consumes without a sink,
// since it publishes each message again whole.

// tapHoldLimit bounds the method and content header frames the Tap holds
// whole to look at; a larger one (no broker sends one) passes untouched.
const tapHoldLimit = 1 << 20

// Tap follows the frames of a broker connection: it keeps the broker's
// connection.close (closeframe.go), and takes the deliveries of registered
// consumers off the stream (see above). Its sinks are registered from any
// goroutine; the rest of its state belongs to the goroutine that reads the
// connection, under observedConn.mu.
type Tap struct {
	mu     sync.Mutex
	sinks  map[string]*deliverySink // by consumer tag
	active atomic.Int32             // len(sinks), read without mu per frame
	serial uint64                   // makes each registered consumer tag unique

	// The reader's state: the frame being read.
	header    [7]byte
	headerLen int
	channel   uint16
	size      uint32 // the frame's payload size
	left      uint32 // payload bytes still to come; then the frame-end octet
	mode      tapMode
	held      []byte // modeHold: the payload as far as read
	// content are the deliveries taken on each channel, the one whose
	// content frames are still to come marked taking; kept for the next.
	content map[uint16]*tappedContent
	// woken are the sinks given deliveries by the bytes being processed:
	// each is woken once, when they are all processed, not per delivery.
	woken []*deliverySink
	// brokerClose is the broker's connection.close, once seen.
	brokerClose *frames.ConnectionClose
	// broken: the stream lost its frame boundaries (a frame did not end
	// with the frame-end octet). From then on everything passes, and
	// amqp091-go fails the connection.
	broken bool
}

type tapMode int

const (
	modePass tapMode = iota // the frame goes on to amqp091-go as it comes
	modeHold                // a method or content header, held whole, then decided
	modeBody                // a body frame of a taken delivery
)

// tappedContent is a taken delivery whose content is being read while
// taking is set.
type tappedContent struct {
	taking bool
	sink   *deliverySink
	d      delivery
	// header is set once the content header was read; bodyLeft is how
	// many body bytes are still to come, keep whether they are kept (a
	// message without an identity is keyed by its body).
	header   bool
	bodyLeft uint64
	keep     bool
}

// register makes a consumer tag from prefix, unique on the connection, and
// returns it with the sink that receives its deliveries from now on.
func (t *Tap) register(prefix string) (string, *deliverySink) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sinks == nil {
		t.sinks = make(map[string]*deliverySink)
	}
	t.serial++
	tag := prefix + "." + strconv.FormatUint(t.serial, 10)
	sink := &deliverySink{tag: tag, queued: make(chan struct{}, 1)}
	t.sinks[tag] = sink
	t.active.Store(int32(len(t.sinks)))
	return tag, sink
}

// unregister stops taking the deliveries of sink's consumer tag; what is
// queued on it stays there.
func (t *Tap) unregister(sink *deliverySink) {
	if t == nil || sink == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sinks, sink.tag)
	t.active.Store(int32(len(t.sinks)))
}

func (t *Tap) sinkFor(tag []byte) *deliverySink {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sinks[string(tag)]
}

// process follows b, the next bytes the broker sent, takes the deliveries
// of registered consumers out, and appends the rest to out. The sinks that
// got deliveries are woken at the end: a read carries many deliveries
// under load, and their trimmer takes them in one go.
func (t *Tap) process(b, out []byte) []byte {
	out = t.follow(b, out)
	for _, sink := range t.woken {
		sink.wake()
	}
	clear(t.woken)
	t.woken = t.woken[:0]
	return out
}

// follow is process without the waking.
func (t *Tap) follow(b, out []byte) []byte {
	for len(b) > 0 {
		if t.broken {
			return append(out, b...)
		}
		if t.headerLen < len(t.header) {
			n := copy(t.header[t.headerLen:], b)
			t.headerLen += n
			b = b[n:]
			if t.headerLen < len(t.header) {
				return out
			}
			out = t.begin(out)
			continue
		}
		if t.left > 0 {
			n := min(uint32(len(b)), t.left)
			chunk := b[:n]
			b = b[n:]
			t.left -= n
			switch t.mode {
			case modePass:
				out = append(out, chunk...)
			case modeHold:
				t.held = append(t.held, chunk...)
			case modeBody:
				t.bodyChunk(chunk)
			}
			continue
		}
		end := b[0]
		b = b[1:]
		t.headerLen = 0
		out = t.end(end, out)
	}
	return out
}

// begin decides, from a frame's header, what becomes of the frame.
func (t *Tap) begin(out []byte) []byte {
	typ := t.header[0]
	t.channel = binary.BigEndian.Uint16(t.header[1:])
	t.size = binary.BigEndian.Uint32(t.header[3:])
	t.left = t.size
	if taking := t.content[t.channel]; taking != nil && taking.taking {
		switch {
		case typ == frames.FrameBody && taking.header:
			t.mode = modeBody
			return out
		case typ == frames.FrameHeader && !taking.header && t.size <= tapHoldLimit:
			t.mode = modeHold
			t.held = t.held[:0]
			return out
		}
		// Another frame where the delivery's content belongs: amqp091-go
		// will say what is wrong with the stream. The delivery is dropped;
		// the broker gives it back when the channel closes.
		taking.taking = false
	}
	// A method is held whole when it may be a delivery to take, or the
	// broker's connection.close (channel 0, small).
	if typ == frames.FrameMethod && (t.size <= tapHoldLimit && t.active.Load() > 0 ||
		t.channel == 0 && t.size <= maxClosePayload) {
		t.mode = modeHold
		t.held = t.held[:0]
		return out
	}
	t.mode = modePass
	return append(out, t.header[:]...)
}

// end finishes a frame at its frame-end octet.
func (t *Tap) end(end byte, out []byte) []byte {
	if end != frames.FrameEnd {
		t.broken = true
		if t.mode == modeHold {
			out = append(append(out, t.header[:]...), t.held...)
		}
		return append(out, end)
	}
	switch t.mode {
	case modePass:
		return append(out, end)
	case modeBody:
		t.bodyEnded()
		return out
	}
	if t.header[0] == frames.FrameHeader {
		t.contentHeader(t.held)
		return out
	}
	if t.channel == 0 {
		if m := decodeClose(t.held); m != nil && t.brokerClose == nil {
			t.brokerClose = m
		}
	} else if t.takeDeliver(t.held) {
		return out
	}
	return append(append(append(out, t.header[:]...), t.held...), end)
}

// takeDeliver starts taking the delivery if payload is a basic.deliver to
// a registered consumer.
func (t *Tap) takeDeliver(payload []byte) bool {
	var deliver frames.BasicDeliver
	wantClass, wantMethod := deliver.ID()
	classID, methodID, args, err := frames.ParseMethodID(payload)
	if err != nil || classID != wantClass || methodID != wantMethod {
		return false
	}
	// consumer-tag (shortstr), delivery-tag (longlong), then fields the
	// trimmer does not read.
	if len(args) < 1 || len(args) < 1+int(args[0])+8 {
		return false
	}
	tag := args[1 : 1+int(args[0])]
	sink := t.sinkFor(tag)
	if sink == nil {
		return false
	}
	if t.content == nil {
		t.content = make(map[uint16]*tappedContent)
	}
	c := t.content[t.channel]
	if c == nil {
		c = new(tappedContent)
		t.content[t.channel] = c
	}
	*c = tappedContent{taking: true, sink: sink, d: delivery{tag: binary.BigEndian.Uint64(args[1+len(tag):])}}
	return true
}

// contentHeader reads what the trimmer needs of a taken delivery's
// content header; a delivery without a body is complete with it.
func (t *Tap) contentHeader(payload []byte) {
	c := t.content[t.channel]
	c.header = true
	size, err := frames.HeaderBodySize(payload)
	if err == nil {
		c.d.id, c.d.identified, c.d.marker, c.d.expiration, err = readProperties(payload)
	}
	if err != nil {
		// amqp091-go would have failed the connection; the trimmer's
		// next consume sees it closed.
		c.taking = false
		t.broken = true
		return
	}
	c.bodyLeft, c.keep = size, !c.d.identified
	if c.keep {
		// The size is the broker's word: capacity for what a frame
		// holds at most, appends for the rest.
		c.d.body = make([]byte, 0, min(size, tapHoldLimit))
	}
	if size == 0 {
		t.deliver(c)
	}
}

func (t *Tap) bodyChunk(chunk []byte) {
	c := t.content[t.channel]
	if c.keep {
		c.d.body = append(c.d.body, chunk...)
	}
}

func (t *Tap) bodyEnded() {
	c := t.content[t.channel]
	c.bodyLeft -= min(c.bodyLeft, uint64(t.size))
	if c.bodyLeft == 0 {
		t.deliver(c)
	}
}

func (t *Tap) deliver(c *tappedContent) {
	c.taking = false
	c.sink.push(c.d)
	if !slices.Contains(t.woken, c.sink) {
		t.woken = append(t.woken, c.sink)
	}
}

// syncMarkerKey is SyncMarkerHeader as a table key is encoded: its length,
// then its bytes.
var syncMarkerKey = append([]byte{byte(len(SyncMarkerHeader))}, SyncMarkerHeader...)

// readProperties reads a content header payload's identity, sync marker
// and expiration. The identity is found where the proxy appends it, last
// in the headers table, without decoding the table; a table that may hold
// the marker, or whose identity is elsewhere, is decoded.
func readProperties(payload []byte) (id mirror.MessageID, identified, marker bool, expiration string, err error) {
	start, end, present, err := frames.HeadersField(payload)
	if err != nil {
		return id, false, false, "", err
	}
	if present {
		table := payload[start+4 : end]
		id, _, _, identified = mirror.IdentityAtEnd(table)
		if !identified || bytes.Contains(table, syncMarkerKey) {
			headers, _, err := frames.DecodeTable(payload[start:end])
			if err != nil {
				return id, false, false, "", err
			}
			value, _ := headers.Get(mirror.IdentityHeader)
			s, _ := value.(string)
			id, identified = mirror.ParseMessageID(s)
			_, marker = headers.Get(SyncMarkerHeader)
		}
	}
	if frames.HasExpiration(payload) {
		var h frames.ContentHeader
		if err := h.Decode(payload); err != nil {
			return id, false, false, "", err
		}
		expiration = h.Properties.Expiration
	}
	return id, identified, marker, expiration, nil
}

// deliverySink queues the deliveries the Tap took for one consumer, for
// the trimmer that consumes. It never blocks the connection's reader: the
// consumer's prefetch bounds what it holds.
type deliverySink struct {
	tag    string
	mu     sync.Mutex
	queue  []delivery
	queued chan struct{} // capacity one: something was queued
}

// push queues d; the Tap wakes the trimmer once it has pushed what one
// read brought.
func (s *deliverySink) push(d delivery) {
	s.mu.Lock()
	s.queue = append(s.queue, d)
	s.mu.Unlock()
}

// wake signals ready, unless it is signalled already.
func (s *deliverySink) wake() {
	select {
	case s.queued <- struct{}{}:
	default:
	}
}

// ready is signalled when deliveries were queued; nil for no sink, which
// a select never picks.
func (s *deliverySink) ready() <-chan struct{} {
	if s == nil {
		return nil
	}
	return s.queued
}

// take returns what is queued, oldest first, and queues what comes next
// into spare, emptied: the caller's batch before this one, done with, so
// that a busy sink allocates nothing. Nil for no sink.
func (s *deliverySink) take(spare []delivery) []delivery {
	if s == nil {
		return nil
	}
	// Drops what the old entries point to. Those past len(spare) are clear
	// already: the array was cleared up to len each time it was handed
	// back, and append zeroes what it grows.
	clear(spare)
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = spare[:0]
	return q
}
