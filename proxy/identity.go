package proxy

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// identities gives the messages a client connection publishes their
// identities, for the identity header that tells a message's copies apart
// from other messages (addIdentity at publish, stripIdentity at delivery).
// It belongs to the client read loop.
type identities struct {
	// prefix is random per connection; the counter fills its last 8 bytes.
	prefix mirror.MessageID
	count  uint64
	// header is the last stamped content header, reused by the next stamp.
	header []byte
}

func newIdentities() identities {
	var ids identities
	rand.Read(ids.prefix[:8])
	return ids
}

// stamp returns the content header payload with a new identity added, and
// the identity. The payload lives in a buffer the next stamp reuses.
func (ids *identities) stamp(payload []byte) ([]byte, mirror.MessageID, error) {
	ids.count++
	id := ids.prefix
	for i := 0; i < 8; i++ {
		id[8+i] = byte(ids.count >> (56 - 8*i))
	}
	var err error
	ids.header, err = addIdentity(ids.header[:0], payload, id)
	return ids.header, id, err
}

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
	if id, entry, noTable, ok := mirror.IdentityAtEnd(table); ok {
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
