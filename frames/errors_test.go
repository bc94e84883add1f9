package frames

import (
	"errors"
	"strings"
	"testing"
)

func TestErrorFormats(t *testing.T) {
	e := &Error{Code: FrameError, Text: "frame size 200000 exceeds negotiated frame_max 131072", Err: ErrFrameTooLarge}
	if got, want := e.Error(), "FRAME_ERROR (501): frame size 200000 exceeds negotiated frame_max 131072"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got, want := e.ReplyText(), "FRAME_ERROR - frame size 200000 exceeds negotiated frame_max 131072"; got != want {
		t.Errorf("ReplyText() = %q, want %q", got, want)
	}
	if !errors.Is(e, ErrFrameTooLarge) || !e.Hard() {
		t.Errorf("errors.Is / Hard wrong for %v", e)
	}
	long := &Error{Code: NotFound, Text: strings.Repeat("é", 200)}
	if got := long.ReplyText(); len(got) > 255 || !strings.HasPrefix(got, "NOT_FOUND - ") || !strings.HasSuffix(got, "é") {
		t.Errorf("ReplyText of a long text: %d bytes, %q", len(got), got)
	}
	if long.Hard() {
		t.Error("NOT_FOUND reported as a hard error")
	}
}

func TestReplyCodes(t *testing.T) {
	tests := []struct {
		code uint16
		name string
		hard bool
	}{
		{ReplySuccess, "REPLY_SUCCESS", false},
		{ContentTooLarge, "CONTENT_TOO_LARGE", false},
		{NoRoute, "NO_ROUTE", false},
		{NoConsumers, "NO_CONSUMERS", false},
		{ConnectionForced, "CONNECTION_FORCED", true},
		{InvalidPath, "INVALID_PATH", true},
		{AccessRefused, "ACCESS_REFUSED", false},
		{NotFound, "NOT_FOUND", false},
		{ResourceLocked, "RESOURCE_LOCKED", false},
		{PreconditionFailed, "PRECONDITION_FAILED", false},
		{FrameError, "FRAME_ERROR", true},
		{SyntaxError, "SYNTAX_ERROR", true},
		{CommandInvalid, "COMMAND_INVALID", true},
		{ChannelError, "CHANNEL_ERROR", true},
		{UnexpectedFrame, "UNEXPECTED_FRAME", true},
		{ResourceError, "RESOURCE_ERROR", true},
		{NotAllowed, "NOT_ALLOWED", true},
		{NotImplemented, "NOT_IMPLEMENTED", true},
		{InternalError, "INTERNAL_ERROR", true},
		{999, "UNKNOWN_REPLY_CODE_999", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ReplyCodeName(tt.code); got != tt.name {
				t.Errorf("ReplyCodeName(%d) = %q, want %q", tt.code, got, tt.name)
			}
			if got := IsHardError(tt.code); got != tt.hard {
				t.Errorf("IsHardError(%d) = %v, want %v", tt.code, got, tt.hard)
			}
		})
	}
}

func TestMethodErrors(t *testing.T) {
	tests := []struct {
		name     string
		payload  []byte
		wantErr  error
		wantCode uint16
	}{
		{name: "short payload", payload: []byte{0, 60}, wantErr: ErrMalformed, wantCode: SyntaxError},
		{name: "unknown class", payload: []byte{0, 30, 0, 10}, wantErr: ErrUnknownMethod, wantCode: NotImplemented},
		{name: "unknown method", payload: []byte{0, 60, 0, 99}, wantErr: ErrUnknownMethod, wantCode: NotImplemented},
		{name: "shortstr past end", payload: []byte{0, 60, 0, 30, 9, 'a'}, wantErr: ErrMalformed, wantCode: SyntaxError},
		{name: "longstr 4 GiB", payload: []byte{0, 10, 0, 21, 0xff, 0xff, 0xff, 0xff}, wantErr: ErrMalformed, wantCode: SyntaxError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeMethod(tt.payload)
			var e *Error
			if !errors.Is(err, tt.wantErr) || !errors.As(err, &e) || e.Code != tt.wantCode {
				t.Fatalf("DecodeMethod(%x) error %v, want code %d wrapping %v", tt.payload, err, tt.wantCode, tt.wantErr)
			}
			if len(tt.payload) >= 4 && tt.payload[1] == 60 && e.ClassID != 60 {
				t.Errorf("error names class %d method %d, want the method that failed", e.ClassID, e.MethodID)
			}
		})
	}
}

func TestSentBy(t *testing.T) {
	tests := []struct {
		name           string
		method         Method
		client, server bool
	}{
		{"connection.start", &ConnectionStart{}, false, true},
		{"connection.start-ok", &ConnectionStartOk{}, true, false},
		{"connection.close", &ConnectionClose{}, true, true},
		{"connection.blocked", &ConnectionBlocked{}, false, true},
		{"connection.update-secret", &ConnectionUpdateSecret{}, true, false},
		{"channel.flow", &ChannelFlow{}, true, true},
		{"basic.publish", &BasicPublish{}, true, false},
		{"basic.deliver", &BasicDeliver{}, false, true},
		{"basic.ack", &BasicAck{}, true, true},
		{"basic.nack", &BasicNack{}, true, true},
		{"basic.cancel", &BasicCancel{}, true, true},
		{"basic.reject", &BasicReject{}, true, false},
		{"confirm.select-ok", &ConfirmSelectOk{}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, m := tt.method.ID()
			if got := SentByClient(c, m); got != tt.client {
				t.Errorf("SentByClient = %v, want %v", got, tt.client)
			}
			if got := SentByServer(c, m); got != tt.server {
				t.Errorf("SentByServer = %v, want %v", got, tt.server)
			}
		})
	}
	if SentByClient(99, 99) || SentByServer(99, 99) {
		t.Error("an unknown method is said to be sendable")
	}
}

// TestReusedDecodeDoesNotAllocate: the hot-path methods decode into a
// reused value without allocating when their strings repeat.
func TestReusedDecodeDoesNotAllocate(t *testing.T) {
	tests := []struct {
		name   string
		method Method
		into   Method
	}{
		{"basic.deliver", &BasicDeliver{ConsumerTag: "amq.ctag-1", DeliveryTag: 99, Redelivered: true, Exchange: "ex", RoutingKey: "rk"}, &BasicDeliver{}},
		{"basic.publish", &BasicPublish{Exchange: "ex", RoutingKey: "rk", Mandatory: true}, &BasicPublish{}},
		{"basic.ack", &BasicAck{DeliveryTag: 1 << 40, Multiple: true}, &BasicAck{}},
		{"basic.nack", &BasicNack{DeliveryTag: 5, Requeue: true}, &BasicNack{}},
		{"queue.declare", &QueueDeclare{Queue: "q", Arguments: Table{{Key: "x-max-length", Value: int32(100000)}}}, &QueueDeclare{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.method.Append(nil)[4:]
			if err := tt.into.Decode(args); err != nil {
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(100, func() {
				if err := tt.into.Decode(args); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("%v allocs per reused decode, want 0", allocs)
			}
		})
	}
}
