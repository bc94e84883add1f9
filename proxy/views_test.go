package proxy

import (
	"fmt"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestTableValuesInJSONTerms: consume arguments are shown as JSON values.
func TestTableValuesInJSONTerms(t *testing.T) {
	tests := []struct {
		name  string
		table frames.Table
		want  map[string]any
	}{
		{"none", nil, map[string]any{}},
		{"scalars", frames.Table{{Key: "x-priority", Value: int32(10)}, {Key: "x-cancel-on-ha-failover", Value: true}},
			map[string]any{"x-priority": int32(10), "x-cancel-on-ha-failover": true}},
		{"bytes and decimals", frames.Table{{Key: "b", Value: []byte("raw")}, {Key: "d", Value: frames.Decimal{Scale: 2, Value: 150}}},
			map[string]any{"b": "raw", "d": 1.5}},
		{"nested", frames.Table{{Key: "t", Value: frames.Table{{Key: "k", Value: "v"}}}, {Key: "a", Value: []any{[]byte("x"), int8(1)}}},
			map[string]any{"t": map[string]any{"k": "v"}, "a": []any{"x", int8(1)}}},
		{"repeated key: the first wins", frames.Table{{Key: "k", Value: "first"}, {Key: "k", Value: "second"}},
			map[string]any{"k": "first"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tableValues(tc.table); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestChannelConsumersListed: a channel lists its consumers active and
// those that wait for a new master inactive, with the backend each
// consumes on.
func TestChannelConsumersListed(t *testing.T) {
	ch := newChannelState(3)
	ch.addConsumer("active", consumer{link: 0, queueName: "orders", prefetch: 20, arguments: frames.Table{{Key: "x-priority", Value: int32(5)}}})
	ch.addConsumer("moving", consumer{link: 1, queueName: "jobs", noAck: true, exclusive: true})
	ch.mu.Lock()
	ch.consumers.orphan(ch, "moving", ch.consumers.byTag["moving"], nil)
	ch.mu.Unlock()
	names := []string{"rabbit1", "rabbit2"}
	got := ch.appendConsumers(nil, func(link int) string { return names[link] })
	byTag := map[string]mirror.Consumer{}
	for _, c := range got {
		byTag[c.Tag] = c
	}
	want := map[string]mirror.Consumer{
		"active": {Queue: "orders", Channel: 3, Tag: "active", AckRequired: true, PrefetchCount: 20, Active: true,
			Arguments: map[string]any{"x-priority": int32(5)}, Backend: "rabbit1"},
		"moving": {Queue: "jobs", Channel: 3, Tag: "moving", Exclusive: true, Active: false, Arguments: map[string]any{}, Backend: "rabbit2"},
	}
	if len(got) != len(want) || fmt.Sprint(byTag) != fmt.Sprint(want) {
		t.Errorf("got %+v\nwant %+v", byTag, want)
	}
}
