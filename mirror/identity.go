package mirror

import (
	"encoding/binary"
	"encoding/hex"
	"hash"
	"hash/fnv"
)

// IdentityHeader is the header the proxy adds to each message published to
// a mirrored queue, so that it can tell the copies of one message apart from
// those of another on every backend. It is removed again before a client
// sees the message.
const IdentityHeader = "x-amqp-mirror-id"

// MessageID identifies one published message across all its copies. It is
// carried in IdentityHeader as a long string: the 16 bytes of the identity,
// followed by IdentityNoTable when the message was published without a
// headers table (the proxy then removes the whole table on delivery, so that
// the consumer sees exactly the properties that were published).
type MessageID [16]byte

// IdentityNoTable ends an identity value whose message had no headers table.
const IdentityNoTable = 'n'

func (id MessageID) String() string { return hex.EncodeToString(id[:]) }

// ParseMessageID reads an identity from the header's value; false when the
// value is not one (a message published before the proxy was in front, or by
// someone writing to the broker directly).
func ParseMessageID(value string) (MessageID, bool) {
	var id MessageID
	if len(value) == len(id)+1 && value[len(id)] == IdentityNoTable {
		value = value[:len(id)]
	}
	if len(value) != len(id) {
		return id, false
	}
	copy(id[:], value)
	return id, true
}

// IdentityAtEnd reads the identity header when it is the last field of a
// headers table (table is the table's bytes after its 4-byte size), where
// the proxy appends it, without decoding the table. entry is the field's
// length; noTable says the value ends with IdentityNoTable. An identity
// elsewhere in the table (a broker may reorder headers) needs the table
// decoded.
func IdentityAtEnd(table []byte) (id MessageID, entry int, noTable, ok bool) {
	for _, valueLen := range [2]int{len(id), len(id) + 1} {
		entry = 1 + len(IdentityHeader) + 1 + 4 + valueLen
		if len(table) < entry {
			continue
		}
		e := table[len(table)-entry:]
		if int(e[0]) != len(IdentityHeader) || string(e[1:1+len(IdentityHeader)]) != IdentityHeader {
			continue
		}
		v := e[1+len(IdentityHeader):]
		if v[0] != 'S' || binary.BigEndian.Uint32(v[1:]) != uint32(valueLen) {
			continue
		}
		value := v[5:]
		noTable = valueLen == len(id)+1
		if noTable && value[len(id)] != IdentityNoTable {
			continue
		}
		copy(id[:], value)
		return id, entry, noTable, true
	}
	return id, 0, false, false
}

// ContentHash identifies a message that carries no IdentityHeader (it was on
// a broker before the proxy was put in front, or was copied there by a
// sync of such a message) by its body: copies of one message have the same
// body, and two messages with the same body are interchangeable for
// trimming (dropping either copy leaves the same multiset of messages).
// Write the body in as many pieces as it came in; ID gives the identity.
type ContentHash struct{ h hash.Hash }

// NewContentHash starts a content identity.
func NewContentHash() ContentHash { return ContentHash{h: fnv.New128a()} }

// Write adds the next piece of the body.
func (c ContentHash) Write(p []byte) { c.h.Write(p) }

// ID returns the identity of the body written so far.
func (c ContentHash) ID() MessageID {
	var id MessageID
	c.h.Sum(id[:0])
	return id
}

// ContentID is the identity of a message without IdentityHeader whose body
// is body (see ContentHash).
func ContentID(body []byte) MessageID {
	c := NewContentHash()
	c.Write(body)
	return c.ID()
}
