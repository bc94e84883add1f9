package mirror

import "encoding/hex"

// IdentityHeader is the header the proxy adds to each message published to
// a mirrored queue, so that it can tell the copies of one message apart from
// those of another on every backend. It is removed again before a client
// sees the message.
const IdentityHeader = "x-amqp-mirror-id"

// MessageID identifies one published message across all its copies. It is
// carried as the 16 bytes of a long string in IdentityHeader.
type MessageID [16]byte

func (id MessageID) String() string { return hex.EncodeToString(id[:]) }

// ParseMessageID reads an identity from the header's value; false when the
// value is not one (a message published before the proxy was in front, or by
// someone writing to the broker directly).
func ParseMessageID(value string) (MessageID, bool) {
	var id MessageID
	if len(value) != len(id) {
		return id, false
	}
	copy(id[:], value)
	return id, true
}
