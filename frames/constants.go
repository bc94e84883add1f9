package frames

// Frame types and sizes from the spec's <constant> elements. They are written
// by hand (not generated) because they need precise Go types: frame types are
// octets on the wire, sizes are plain ints.
const (
	FrameMethod    uint8 = 1
	FrameHeader    uint8 = 2
	FrameBody      uint8 = 3
	FrameHeartbeat uint8 = 8
	FrameEnd       byte  = 0xCE
	FrameMinSize         = 4096 // spec frame-min-size: every peer accepts frames this large before tuning
	FrameOverhead        = 8    // 7-byte header + frame-end octet

	// DefaultMaxFrameSize is the limit a Reader applies until SetMaxFrameSize;
	// it is RabbitMQ's default frame_max (128 KiB).
	DefaultMaxFrameSize = 131072

	frameHeaderSize = 7
)

// ProtocolHeader is what an AMQP 0-9-1 client sends first, and what a server
// answers with before closing when it gets anything else.
var ProtocolHeader = []byte("AMQP\x00\x00\x09\x01")

// FrameTypeName is a short name for a frame type, for logs and error texts.
func FrameTypeName(typ uint8) string {
	switch typ {
	case FrameMethod:
		return "method"
	case FrameHeader:
		return "header"
	case FrameBody:
		return "body"
	case FrameHeartbeat:
		return "heartbeat"
	}
	return "unknown"
}
