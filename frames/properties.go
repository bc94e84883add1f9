package frames

import "encoding/binary"

// Content header frame payload (spec 4.2.6.1):
//
//	0        2        4                 12       14
//	+--------+--------+-----------------+--------+---------------------+
//	| class  | weight | body size       | flags  | properties ...      |
//	| short  | short  | longlong        | short  | present ones only   |
//	+--------+--------+-----------------+--------+---------------------+
//
// Flag bit 15 is the first property (content-type), bit 2 the fourteenth
// (cluster-id, "reserved" in the XML). Bit 0 would announce another flag
// word; basic has only 14 properties, so a second word could only describe
// properties that do not exist, and Decode rejects it, as it rejects bit 1.
const (
	FlagContentType     uint16 = 1 << 15
	FlagContentEncoding uint16 = 1 << 14
	FlagHeaders         uint16 = 1 << 13
	FlagDeliveryMode    uint16 = 1 << 12
	FlagPriority        uint16 = 1 << 11
	FlagCorrelationID   uint16 = 1 << 10
	FlagReplyTo         uint16 = 1 << 9
	FlagExpiration      uint16 = 1 << 8
	FlagMessageID       uint16 = 1 << 7
	FlagTimestamp       uint16 = 1 << 6
	FlagType            uint16 = 1 << 5
	FlagUserID          uint16 = 1 << 4
	FlagAppID           uint16 = 1 << 3
	FlagClusterID       uint16 = 1 << 2

	flagsDefined    = 0xFFFC
	contentHeaderID = 60 // only basic carries content
	propertiesStart = 14
)

// ContentHeader is a decoded content header frame.
type ContentHeader struct {
	ClassID    uint16
	Weight     uint16 // unused by the spec, must be 0; kept for byte-exact round trips
	BodySize   uint64
	Properties Properties
}

// Properties are basic's 14 message properties. Flags says which are present
// and is the only source of truth for presence: an absent property and an
// empty present one both have the zero value, and differ only in Flags.
// Set the matching Flag* bit when setting a property.
type Properties struct {
	Flags           uint16 // property flags as on the wire
	ContentType     string
	ContentEncoding string
	Headers         Table
	DeliveryMode    uint8
	Priority        uint8
	CorrelationID   string
	ReplyTo         string
	Expiration      string
	MessageID       string
	Timestamp       Timestamp
	Type            string
	UserID          string
	AppID           string
	ClusterID       string
}

// Has reports whether every property in flag is present.
func (p *Properties) Has(flag uint16) bool { return p.Flags&flag == flag }

func checkFlags(flags uint16) *Error {
	if flags&^flagsDefined != 0 {
		return syntaxError("content header: property flags 0x%04x set bits 0x%04x that basic does not define (bit 0 continuation, bit 1 unused)",
			flags, flags&^flagsDefined)
	}
	return nil
}

// Decode decodes a content header payload. Decoding into a reused value
// keeps strings and header values that did not change, so a stream of
// similar messages allocates nothing. Absent properties are zeroed.
func (h *ContentHeader) Decode(payload []byte) error {
	if len(payload) < propertiesStart {
		return syntaxError("content header is %d bytes, want at least %d", len(payload), propertiesStart)
	}
	h.ClassID = binary.BigEndian.Uint16(payload)
	h.Weight = binary.BigEndian.Uint16(payload[2:])
	h.BodySize = binary.BigEndian.Uint64(payload[4:])
	flags := binary.BigEndian.Uint16(payload[12:])
	if h.ClassID != contentHeaderID {
		return syntaxError("content header for class %d: only basic (60) carries content", h.ClassID)
	}
	if err := checkFlags(flags); err != nil {
		return err
	}
	p := &h.Properties
	p.Flags = flags
	d := decoder{args: payload, off: propertiesStart, method: "content header", classID: h.ClassID}
	shortstr := func(flag uint16, dst *string, name string) {
		if flags&flag != 0 {
			d.shortstr(dst, name)
		} else {
			*dst = ""
		}
	}
	octet := func(flag uint16, name string) uint8 {
		if flags&flag != 0 {
			return d.octet(name)
		}
		return 0
	}
	shortstr(FlagContentType, &p.ContentType, "content-type")
	shortstr(FlagContentEncoding, &p.ContentEncoding, "content-encoding")
	if flags&FlagHeaders != 0 {
		d.table(&p.Headers, "headers")
	} else {
		p.Headers = nil
	}
	p.DeliveryMode = octet(FlagDeliveryMode, "delivery-mode")
	p.Priority = octet(FlagPriority, "priority")
	shortstr(FlagCorrelationID, &p.CorrelationID, "correlation-id")
	shortstr(FlagReplyTo, &p.ReplyTo, "reply-to")
	shortstr(FlagExpiration, &p.Expiration, "expiration")
	shortstr(FlagMessageID, &p.MessageID, "message-id")
	if flags&FlagTimestamp != 0 {
		p.Timestamp = Timestamp(d.longlong("timestamp"))
	} else {
		p.Timestamp = 0
	}
	shortstr(FlagType, &p.Type, "type")
	shortstr(FlagUserID, &p.UserID, "user-id")
	shortstr(FlagAppID, &p.AppID, "app-id")
	shortstr(FlagClusterID, &p.ClusterID, "cluster-id")
	return d.finish()
}

// Append appends the encoded header. It fails, leaving buf as it was, when
// Flags has undefined bits, a present shortstr is over 255 bytes or the
// headers table holds a value AppendTable rejects.
func (h *ContentHeader) Append(buf []byte) ([]byte, error) {
	start := len(buf)
	p := &h.Properties
	if err := checkFlags(p.Flags); err != nil {
		return buf, err
	}
	buf = binary.BigEndian.AppendUint16(buf, h.ClassID)
	buf = binary.BigEndian.AppendUint16(buf, h.Weight)
	buf = binary.BigEndian.AppendUint64(buf, h.BodySize)
	buf = binary.BigEndian.AppendUint16(buf, p.Flags)
	var err error
	shortstr := func(flag uint16, s, name string) {
		if p.Flags&flag == 0 || err != nil {
			return
		}
		if err = checkShortstr(s, "content header", name); err == nil {
			buf = appendShortstr(buf, s)
		}
	}
	octet := func(flag uint16, v uint8) {
		if p.Flags&flag != 0 {
			buf = append(buf, v)
		}
	}
	shortstr(FlagContentType, p.ContentType, "content-type")
	shortstr(FlagContentEncoding, p.ContentEncoding, "content-encoding")
	if p.Flags&FlagHeaders != 0 && err == nil {
		buf, err = AppendTable(buf, p.Headers)
	}
	octet(FlagDeliveryMode, p.DeliveryMode)
	octet(FlagPriority, p.Priority)
	shortstr(FlagCorrelationID, p.CorrelationID, "correlation-id")
	shortstr(FlagReplyTo, p.ReplyTo, "reply-to")
	shortstr(FlagExpiration, p.Expiration, "expiration")
	shortstr(FlagMessageID, p.MessageID, "message-id")
	if p.Flags&FlagTimestamp != 0 {
		buf = binary.BigEndian.AppendUint64(buf, uint64(p.Timestamp))
	}
	shortstr(FlagType, p.Type, "type")
	shortstr(FlagUserID, p.UserID, "user-id")
	shortstr(FlagAppID, p.AppID, "app-id")
	shortstr(FlagClusterID, p.ClusterID, "cluster-id")
	if err != nil {
		return buf[:start], err
	}
	return buf, nil
}

// HasExpiration reports whether a content header payload sets the
// expiration property, without decoding it: it is on the delivery path.
// A payload too short to hold the property flags has none.
func HasExpiration(payload []byte) bool {
	// The first property-flags word, after class-id, weight and body-size,
	// holds expiration's bit.
	const flagsAt = propertiesStart - 2
	return len(payload) >= propertiesStart && binary.BigEndian.Uint16(payload[flagsAt:])&FlagExpiration != 0
}

// HeaderBodySize reads the body size of a content header payload without
// decoding any property: all a forwarding proxy needs to count body frames.
func HeaderBodySize(payload []byte) (uint64, error) {
	if len(payload) < propertiesStart {
		return 0, syntaxError("content header is %d bytes, want at least %d", len(payload), propertiesStart)
	}
	return binary.BigEndian.Uint64(payload[4:]), nil
}

// HeadersField finds the headers table (including its 4-byte size) inside a
// content header payload, skipping only content-type and content-encoding,
// which precede it. When the table is absent, start == end is where it
// would go.
func HeadersField(payload []byte) (start, end int, present bool, err error) {
	if len(payload) < propertiesStart {
		return 0, 0, false, syntaxError("content header is %d bytes, want at least %d", len(payload), propertiesStart)
	}
	flags := binary.BigEndian.Uint16(payload[12:])
	if e := checkFlags(flags); e != nil {
		return 0, 0, false, e
	}
	off := propertiesStart
	for _, flag := range [...]uint16{FlagContentType, FlagContentEncoding} {
		if flags&flag == 0 {
			continue
		}
		if off >= len(payload) || int(payload[off]) > len(payload)-off-1 {
			return 0, 0, false, syntaxError("content header: shortstr property before headers runs past the payload end")
		}
		off += 1 + int(payload[off])
	}
	if flags&FlagHeaders == 0 {
		return off, off, false, nil
	}
	if len(payload)-off < 4 {
		return 0, 0, false, syntaxError("content header: headers table size needs 4 bytes, only %d left", len(payload)-off)
	}
	size := binary.BigEndian.Uint32(payload[off:])
	if uint64(size) > uint64(len(payload)-off-4) {
		return 0, 0, false, syntaxError("content header: headers table size %d exceeds the %d bytes left", size, len(payload)-off-4)
	}
	return off, off + 4 + int(size), true, nil
}

// ReplaceHeaders appends to dst a copy of payload in which only the headers
// table is replaced: a nil headers removes it and clears its flag, a non-nil
// (even empty) one sets the flag. Every other byte is copied untouched, so
// properties the proxy does not understand pass through exactly.
func ReplaceHeaders(dst, payload []byte, headers Table) ([]byte, error) {
	start, end, _, err := HeadersField(payload)
	if err != nil {
		return dst, err
	}
	base := len(dst)
	dst = append(dst, payload[:start]...)
	flags := binary.BigEndian.Uint16(payload[12:])
	if headers != nil {
		flags |= FlagHeaders
		if dst, err = AppendTable(dst, headers); err != nil {
			return dst[:base], err
		}
	} else {
		flags &^= FlagHeaders
	}
	binary.BigEndian.PutUint16(dst[base+12:], flags)
	return append(dst, payload[end:]...), nil
}
