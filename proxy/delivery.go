package proxy

import (
	"encoding/binary"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
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

// writeContent writes the message's content frames to the client, with
// header as its content header.
func (c *clientConn) writeContent(ch uint16, m *message, header []byte) error {
	if err := c.client.WriteFrame(frames.FrameHeader, ch, header); err != nil {
		return err
	}
	off := 0
	for _, n := range m.sizes {
		if err := c.client.WriteFrame(frames.FrameBody, ch, m.body[off:off+n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// identityEntrySize is the size of the identity header field the proxy
// appends to a headers table: key, type octet, length, value.
const identityEntrySize = 1 + len(mirror.IdentityHeader) + 1 + 4 + len(mirror.MessageID{})

// addIdentity appends to dst the content header payload with the identity
// header added as the last field of the headers table (a table is made when
// there is none, and the value records that, so that the delivery drops it
// again). Nothing else in the header is decoded or changed.
func addIdentity(dst, payload []byte, id mirror.MessageID) ([]byte, error) {
	start, end, present, err := frames.HeadersField(payload)
	if err != nil {
		return dst, err
	}
	base := len(dst)
	dst = append(dst, payload[:end]...)
	valueLen := len(id)
	if !present {
		dst = append(dst, 0, 0, 0, 0) // an empty table, filled below
		valueLen++
	}
	entryStart := len(dst)
	dst = append(dst, byte(len(mirror.IdentityHeader)))
	dst = append(dst, mirror.IdentityHeader...)
	dst = append(dst, 'S', 0, 0, 0, byte(valueLen))
	dst = append(dst, id[:]...)
	if !present {
		dst = append(dst, mirror.IdentityNoTable)
		flags := binary.BigEndian.Uint16(dst[base+12:])
		binary.BigEndian.PutUint16(dst[base+12:], flags|frames.FlagHeaders)
	}
	tableSize := binary.BigEndian.Uint32(dst[base+start:])
	binary.BigEndian.PutUint32(dst[base+start:], tableSize+uint32(len(dst)-entryStart))
	return append(dst, payload[end:]...), nil
}

// stripIdentity returns the content header without the identity header, and
// the identity; ok is false when the message carries none (header is then
// payload itself). The common case, the field the proxy appended last, is
// cut out without decoding the table; otherwise the table is decoded and
// encoded again without it (a broker may reorder headers, e.g. when it
// dead-letters a message).
func stripIdentity(dst, payload []byte) (header []byte, id mirror.MessageID, ok bool, err error) {
	start, end, present, err := frames.HeadersField(payload)
	if err != nil || !present {
		return payload, id, false, err
	}
	table := payload[start+4 : end]
	for _, valueLen := range [2]int{len(id), len(id) + 1} {
		entry := identityEntrySize - len(id) + valueLen
		if len(table) < entry {
			continue
		}
		e := table[len(table)-entry:]
		if int(e[0]) != len(mirror.IdentityHeader) || string(e[1:1+len(mirror.IdentityHeader)]) != mirror.IdentityHeader {
			continue
		}
		v := e[1+len(mirror.IdentityHeader):]
		if v[0] != 'S' || binary.BigEndian.Uint32(v[1:]) != uint32(valueLen) {
			continue
		}
		value := v[5:]
		copy(id[:], value)
		noTable := valueLen == len(id)+1 && value[len(id)] == mirror.IdentityNoTable
		dst = append(dst[:0], payload[:start]...)
		if noTable && len(table) == entry {
			flags := binary.BigEndian.Uint16(dst[12:])
			binary.BigEndian.PutUint16(dst[12:], flags&^frames.FlagHeaders)
		} else {
			dst = binary.BigEndian.AppendUint32(dst, uint32(len(table)-entry))
			dst = append(dst, table[:len(table)-entry]...)
		}
		return append(dst, payload[end:]...), id, true, nil
	}
	// Slow path: the field is elsewhere in the table, or absent.
	t, _, derr := frames.DecodeTable(payload[start:end])
	if derr != nil {
		return payload, id, false, nil
	}
	v, found := t.Get(mirror.IdentityHeader)
	if !found {
		return payload, id, false, nil
	}
	s, _ := v.(string)
	parsed, valid := mirror.ParseMessageID(s)
	if !valid {
		return payload, id, false, nil
	}
	t.Delete(mirror.IdentityHeader)
	if len(s) == len(id)+1 && len(t) == 0 {
		t = nil
	}
	out, rerr := frames.ReplaceHeaders(dst[:0], payload, t)
	if rerr != nil {
		return payload, id, false, nil
	}
	return out, parsed, true, nil
}
