package mirror

import (
	"testing"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// encodeArguments encodes queue.declare arguments as they come on the wire.
func encodeArguments(t *testing.T, table frames.Table) []byte {
	t.Helper()
	b, err := frames.AppendTable(nil, table)
	if err != nil {
		t.Fatalf("encoding %v: %v", table, err)
	}
	return b
}

func TestRefusalDeadLettered(t *testing.T) {
	encode := func(table frames.Table) []byte { return encodeArguments(t, table) }
	dlx := frames.Field{Key: "x-dead-letter-exchange", Value: "dead"}
	tests := []struct {
		name      string
		arguments []byte
		want      bool
	}{
		{name: "no arguments", arguments: nil, want: false},
		{name: "drop-head with a dead-letter exchange", arguments: encode(frames.Table{{Key: "x-max-length", Value: int32(5)}, dlx}), want: false},
		{name: "reject-publish with a dead-letter exchange", arguments: encode(frames.Table{{Key: "x-overflow", Value: "reject-publish"}, dlx}), want: false},
		{name: "reject-publish-dlx without a dead-letter exchange", arguments: encode(frames.Table{{Key: "x-overflow", Value: "reject-publish-dlx"}}), want: false},
		{name: "reject-publish-dlx with a dead-letter exchange", arguments: encode(frames.Table{{Key: "x-overflow", Value: "reject-publish-dlx"}, dlx}), want: true},
		{name: "a table that does not decode", arguments: []byte{0, 0, 0, 9, 1}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RefusalDeadLettered(tt.arguments); got != tt.want {
				t.Errorf("RefusalDeadLettered = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSetsMessageTTL(t *testing.T) {
	encode := func(table frames.Table) []byte { return encodeArguments(t, table) }
	tests := []struct {
		name      string
		arguments []byte
		want      bool
	}{
		{name: "no arguments", arguments: nil, want: false},
		{name: "x-message-ttl", arguments: encode(frames.Table{{Key: "x-message-ttl", Value: int32(3000)}}), want: true},
		{name: "x-message-ttl among others", arguments: encode(frames.Table{{Key: "x-max-length", Value: int32(5)}, {Key: "x-message-ttl", Value: int64(10)}}), want: true},
		{name: "x-expires only", arguments: encode(frames.Table{{Key: "x-expires", Value: int32(3000)}}), want: false},
		{name: "the name as a value", arguments: encode(frames.Table{{Key: "x-queue-mode", Value: "x-message-ttlish"}}), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SetsMessageTTL(tt.arguments); got != tt.want {
				t.Errorf("SetsMessageTTL = %v, want %v", got, tt.want)
			}
		})
	}
}
