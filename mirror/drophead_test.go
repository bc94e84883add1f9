package mirror

import (
	"bytes"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

func TestDropsHead(t *testing.T) {
	encode := func(table frames.Table) []byte { return encodeArguments(t, table) }
	length := frames.Field{Key: "x-max-length", Value: int32(5)}
	tests := []struct {
		name      string
		arguments []byte
		want      bool
	}{
		{name: "no arguments", arguments: nil, want: false},
		{name: "x-max-length", arguments: encode(frames.Table{length}), want: true},
		{name: "x-max-length-bytes", arguments: encode(frames.Table{{Key: "x-max-length-bytes", Value: int64(1 << 20)}}), want: true},
		{name: "drop-head named", arguments: encode(frames.Table{length, {Key: "x-overflow", Value: "drop-head"}}), want: true},
		{name: "reject-publish", arguments: encode(frames.Table{length, {Key: "x-overflow", Value: "reject-publish"}}), want: false},
		{name: "reject-publish-dlx", arguments: encode(frames.Table{length, {Key: "x-overflow", Value: "reject-publish-dlx"}}), want: false},
		{name: "no limit", arguments: encode(frames.Table{{Key: "x-dead-letter-exchange", Value: "dead"}}), want: false},
		{name: "a table that does not decode", arguments: []byte{0, 0, 0, 9, 1}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DropsHead(tt.arguments); got != tt.want {
				t.Errorf("DropsHead = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBrokerArguments(t *testing.T) {
	encode := func(table frames.Table) []byte { return encodeArguments(t, table) }
	length := frames.Field{Key: "x-max-length", Value: int32(5)}
	key := frames.Field{Key: "x-dead-letter-routing-key", Value: "dead"}
	tests := []struct {
		name            string
		arguments, want []byte
	}{
		{name: "no arguments", arguments: nil, want: nil},
		{name: "no limit: unchanged", arguments: encode(frames.Table{{Key: "x-dead-letter-exchange", Value: "dead"}}),
			want: encode(frames.Table{{Key: "x-dead-letter-exchange", Value: "dead"}})},
		{name: "reject-publish: unchanged", arguments: encode(frames.Table{length, {Key: "x-overflow", Value: "reject-publish"}}),
			want: encode(frames.Table{length, {Key: "x-overflow", Value: "reject-publish"}})},
		{name: "drop-head without dead-lettering", arguments: encode(frames.Table{length}),
			want: encode(frames.Table{length, {Key: "x-dead-letter-exchange", Value: DeadLetterExchange}})},
		{name: "drop-head dead-lettering: the exchange replaced, the key kept",
			arguments: encode(frames.Table{length, {Key: "x-dead-letter-exchange", Value: "dead"}, key}),
			want:      encode(frames.Table{length, {Key: "x-dead-letter-exchange", Value: DeadLetterExchange}, key})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := BrokerArguments(tt.arguments); !bytes.Equal(got, tt.want) {
				t.Errorf("BrokerArguments = %x, want %x", got, tt.want)
			}
		})
	}
	t.Run("the decoded table is not changed", func(t *testing.T) {
		table := frames.Table{length, {Key: "x-dead-letter-exchange", Value: "dead"}}
		BrokerTable(table)
		if table[1].Value != "dead" {
			t.Errorf("BrokerTable changed its argument: %v", table)
		}
	})
}

func TestDeadLetterTarget(t *testing.T) {
	encode := func(table frames.Table) []byte { return encodeArguments(t, table) }
	tests := []struct {
		name          string
		arguments     []byte
		exchange, key string
		ok            bool
	}{
		{name: "none", arguments: nil},
		{name: "an exchange", arguments: encode(frames.Table{{Key: "x-dead-letter-exchange", Value: "dead"}}), exchange: "dead", ok: true},
		{name: "the default exchange and a key",
			arguments: encode(frames.Table{{Key: "x-dead-letter-exchange", Value: ""}, {Key: "x-dead-letter-routing-key", Value: "q"}}),
			exchange:  "", key: "q", ok: true},
		{name: "a key alone", arguments: encode(frames.Table{{Key: "x-dead-letter-routing-key", Value: "q"}})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exchange, key, ok := DeadLetterTarget(tt.arguments)
			if exchange != tt.exchange || key != tt.key || ok != tt.ok {
				t.Errorf("DeadLetterTarget = %q, %q, %v; want %q, %q, %v", exchange, key, ok, tt.exchange, tt.key, tt.ok)
			}
		})
	}
}

func TestDeadLetterEquivalence(t *testing.T) {
	encode := func(table frames.Table) []byte { return encodeArguments(t, table) }
	length := frames.Field{Key: "x-max-length", Value: int32(5)}
	dead := frames.Field{Key: "x-dead-letter-exchange", Value: "dead"}
	recorded := encode(frames.Table{length, dead})
	tests := []struct {
		name     string
		declared []byte
		want     string
	}{
		{name: "the same", declared: encode(frames.Table{dead, length}), want: ""},
		{name: "another exchange", declared: encode(frames.Table{length, {Key: "x-dead-letter-exchange", Value: "other"}}),
			want: "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'orders' in vhost 'prod': received the value 'other' of type 'longstr' but current is the value 'dead' of type 'longstr'"},
		{name: "none", declared: encode(frames.Table{length}),
			want: "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'orders' in vhost 'prod': received none but current is the value 'dead' of type 'longstr'"},
		{name: "a key added", declared: encode(frames.Table{length, dead, {Key: "x-dead-letter-routing-key", Value: "k"}}),
			want: "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-routing-key' for queue 'orders' in vhost 'prod': received the value 'k' of type 'longstr' but current is none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DeadLetterEquivalence("orders", "prod", recorded, tt.declared); got != tt.want {
				t.Errorf("DeadLetterEquivalence =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}
