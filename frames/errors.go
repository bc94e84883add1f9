package frames

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Sentinels for errors.Is. Every protocol error the package returns is a
// *Error wrapping one of them.
var (
	ErrFrameTooLarge     = errors.New("frame too large")
	ErrBadFrameEnd       = errors.New("bad frame-end octet")
	ErrBadProtocolHeader = errors.New("bad protocol header")
	ErrUnknownFrameType  = errors.New("unknown frame type")
	ErrMalformed         = errors.New("malformed frame payload")
	ErrUnknownMethod     = errors.New("unknown method")
	ErrBadHeartbeat      = errors.New("bad heartbeat frame")
	// ErrUnencodable is returned when a Go value cannot be put on the wire
	// (a shortstr over 255 bytes, a table value of an unsupported type). It
	// is the caller's bug, not the peer's, hence INTERNAL_ERROR.
	ErrUnencodable = errors.New("value cannot be encoded")
)

// Error is an AMQP protocol error: what went wrong, the reply code a peer
// should be told, and the method that caused it.
type Error struct {
	Code     uint16 // AMQP reply code
	Text     string // human text without the code-name prefix
	ClassID  uint16 // class/method that caused it, 0 if none
	MethodID uint16
	Err      error // wrapped sentinel, may be nil
}

// Error is "FRAME_ERROR (501): frame size ...".
func (e *Error) Error() string {
	return ReplyCodeName(e.Code) + " (" + strconv.Itoa(int(e.Code)) + "): " + e.Text
}

func (e *Error) Unwrap() error { return e.Err }

// Hard reports whether the error closes the connection (not just a channel).
func (e *Error) Hard() bool { return IsHardError(e.Code) }

// maxReplyText is the shortstr limit of connection.close/channel.close reply-text.
const maxReplyText = 255

// ReplyText is the RabbitMQ-style text for a close method's reply-text,
// "FRAME_ERROR - frame size ...", cut at 255 bytes (a shortstr) on a UTF-8
// boundary so that the close method itself is always encodable.
func (e *Error) ReplyText() string {
	s := ReplyCodeName(e.Code) + " - " + e.Text
	if len(s) <= maxReplyText {
		return s
	}
	cut := maxReplyText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

func newError(code uint16, sentinel error, format string, args ...any) *Error {
	return &Error{Code: code, Text: fmt.Sprintf(format, args...), Err: sentinel}
}

func frameError(sentinel error, format string, args ...any) *Error {
	return newError(FrameError, sentinel, format, args...)
}

func syntaxError(format string, args ...any) *Error {
	return newError(SyntaxError, ErrMalformed, format, args...)
}

func unencodable(format string, args ...any) *Error {
	return newError(InternalError, ErrUnencodable, format, args...)
}

// unknownMethodError answers a class/method pair the spec does not define.
//
// NOT_IMPLEMENTED (540) rather than COMMAND_INVALID (503): the spec defines
// 540 as "functionality that is not implemented in the server", which is
// what an undefined class or method is, while 503 is for a valid command in
// an invalid sequence. RabbitMQ 3.10 itself sends no code at all: its framing
// module cannot look such an id up, and the connection drops the socket
// without connection.close (measured; the proxy does the same, so for it the
// code only reaches logs).
func unknownMethodError(classID, methodID uint16) *Error {
	e := newError(NotImplemented, ErrUnknownMethod,
		"unknown method: class %d, method %d", classID, methodID)
	e.ClassID, e.MethodID = classID, methodID
	return e
}

func unknownMethodName(classID, methodID uint16) string {
	return "unknown(" + strconv.Itoa(int(classID)) + "," + strconv.Itoa(int(methodID)) + ")"
}

func unknownReplyCodeName(code uint16) string {
	return "UNKNOWN_REPLY_CODE_" + strconv.Itoa(int(code))
}
