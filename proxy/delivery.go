package proxy

import (
	"github.com/amqp-mirror/amqp-mirror/frames"
)

// message is a delivery, get-ok or return being received from one link. Its
// frames reach the client together, once the last one arrived: several links
// may deliver on one client channel, and the frames of two messages must
// never interleave there (see channelState.outMu).
type message struct {
	active    bool
	key       uint32 // the method: basic.deliver, basic.get-ok or basic.return
	method    []byte // the method frame's payload
	header    []byte // the content header's payload, once it came
	body      []byte // the body frames' payloads, one after the other
	sizes     []int  // the size of each body frame
	remaining uint64 // body bytes still to come
	get       *pendingGet
}

func (m *message) begin(key uint32, payload []byte, get *pendingGet) {
	m.active = true
	m.key = key
	m.method = append(m.method[:0], payload...)
	m.header = m.header[:0]
	m.body = m.body[:0]
	m.sizes = m.sizes[:0]
	m.remaining = 0
	m.get = get
}

// content adds a content frame and reports whether the message is complete.
func (m *message) content(f frames.Frame) (complete bool, err error) {
	if f.Type == frames.FrameHeader {
		size, err := frames.HeaderBodySize(f.Payload)
		if err != nil {
			return false, err
		}
		m.header = append(m.header[:0], f.Payload...)
		m.remaining = size
		return size == 0, nil
	}
	m.body = append(m.body, f.Payload...)
	m.sizes = append(m.sizes, len(f.Payload))
	if uint64(len(f.Payload)) >= m.remaining {
		m.remaining = 0
		return true, nil
	}
	m.remaining -= uint64(len(f.Payload))
	return false, nil
}
