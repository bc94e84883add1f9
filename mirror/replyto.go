package mirror

import (
	"encoding/base64"
	"encoding/binary"
	"strings"
)

// Direct reply-to (RabbitMQ's amq.rabbitmq.reply-to): a client consumes the
// pseudo-queue ReplyToQueue with no-ack and publishes requests with
// reply_to=ReplyToQueue; the broker rewrites that reply_to to
// ReplyToPrefix + Suffix, and a publish to the default exchange with that
// routing key goes straight to the client's channel, on whichever of the
// broker's connections it lives. Suffix is
//
//	base64(pid) "." key
//
// where pid is the channel process's Erlang pid in the external term format
// and key is random per consumer:
//
//	131, then PID_EXT (103) or NEW_PID_EXT (88),
//	then the node atom: ATOM_EXT (100) or ATOM_UTF8_EXT (118) with a 2-octet
//	length, SMALL_ATOM_EXT (115) or SMALL_ATOM_UTF8_EXT (119) with a 1-octet
//	length, then the name,
//	then ID (4 octets), Serial (4) and Creation (1 for PID_EXT, 4 otherwise).
//
// The node names the broker that owns the pid. RabbitMQ 3.10 writes a
// synthetic one, "reply@" and a hash of the real node's name, and only a
// broker of that node can deliver the reply; another decodes the pid as a
// foreign node's and tries to reach it over Erlang distribution. So a reply
// must go to the backend whose probe (a reply-to of its own) named the same
// node, and nowhere else.

const (
	// ReplyToQueue is the pseudo-queue a client consumes for direct replies,
	// and the reply_to it publishes requests with.
	ReplyToQueue = "amq.rabbitmq.reply-to"
	// ReplyToPrefix begins the reply_to a broker writes in its place, and
	// the routing key of a reply.
	ReplyToPrefix = ReplyToQueue + "."
)

// IsReplyTo reports whether name is the direct reply-to pseudo-queue or one
// of the names a broker makes of it: neither is a queue any backend holds.
func IsReplyTo(name string) bool {
	return name == ReplyToQueue || strings.HasPrefix(name, ReplyToPrefix)
}

// Erlang external term format tags.
const (
	termVersion      = 131
	tagPid           = 103 // PID_EXT
	tagNewPid        = 88  // NEW_PID_EXT
	tagAtom          = 100 // ATOM_EXT
	tagSmallAtom     = 115 // SMALL_ATOM_EXT
	tagAtomUTF8      = 118 // ATOM_UTF8_EXT
	tagSmallAtomUTF8 = 119 // SMALL_ATOM_UTF8_EXT
)

// ReplyToNode returns the Erlang node named by a direct reply-to name
// (ReplyToPrefix, then the suffix); ok is false for anything else, including
// ReplyToQueue itself and a suffix that does not decode exactly.
func ReplyToNode(name string) (node string, ok bool) {
	suffix, found := strings.CutPrefix(name, ReplyToPrefix)
	if !found {
		return "", false
	}
	encoded, key, found := strings.Cut(suffix, ".")
	if !found || encoded == "" || key == "" || strings.Contains(key, ".") {
		return "", false
	}
	pid, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		if pid, err = base64.RawStdEncoding.DecodeString(encoded); err != nil {
			return "", false
		}
	}
	return pidNode(pid)
}

// pidNode decodes an Erlang pid in the external term format, with nothing
// after it, and returns its node's name.
func pidNode(b []byte) (string, bool) {
	if len(b) < 3 || b[0] != termVersion {
		return "", false
	}
	var rest int // octets after the node atom
	switch b[1] {
	case tagPid:
		rest = 4 + 4 + 1
	case tagNewPid:
		rest = 4 + 4 + 4
	default:
		return "", false
	}
	b = b[2:]
	var n int
	switch b[0] {
	case tagAtom, tagAtomUTF8:
		if len(b) < 3 {
			return "", false
		}
		n, b = int(binary.BigEndian.Uint16(b[1:])), b[3:]
	case tagSmallAtom, tagSmallAtomUTF8:
		if len(b) < 2 {
			return "", false
		}
		n, b = int(b[1]), b[2:]
	default:
		return "", false
	}
	if n == 0 || len(b) != n+rest {
		return "", false
	}
	return string(b[:n]), true
}
