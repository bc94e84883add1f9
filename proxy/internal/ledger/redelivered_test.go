package ledger

import (
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

func TestDeliveredIDs(t *testing.T) {
	q := mirror.QueueID{VHost: "/", Name: "q"}
	id := func(n byte) mirror.MessageID { return mirror.MessageID{n} }
	start := time.Unix(1000, 0)
	// A step delivers message msg of q at epoch, at offset after start, and
	// expects whether it counts as delivered before.
	type step struct {
		after    time.Duration
		epoch    uint64
		mirrored bool
		msg      byte
		before   bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a second delivery is a redelivery", []step{
			{0, 1, true, 1, false},
			{time.Second, 1, true, 1, true},
			{time.Second, 1, true, 2, false},
		}},
		{"an unmirrored queue starts no record", []step{
			{0, 1, false, 1, false},
			{time.Second, 1, false, 1, false},
		}},
		{"a record outlives the queue's slaves", []step{
			{0, 1, true, 1, false},
			{time.Second, 2, false, 1, true},
		}},
		{"forgotten after keepRecent at one epoch", []step{
			{0, 1, true, 1, false},
			{keepRecent + time.Second, 1, true, 2, false},
			{keepRecent + 2*time.Second, 1, true, 1, false},
		}},
		{"kept past a promotion", []step{
			{0, 1, true, 1, false},
			{0, 1, true, 2, false},
			{time.Second, 2, true, 3, false},
			{keepRecent + 2*time.Second, 2, true, 1, true},
			{keepRecent + 3*time.Second, 2, true, 2, true},
		}},
		{"a promotion's set is forgotten after keepPromoted", []step{
			{0, 1, true, 1, false},
			{time.Second, 2, true, 3, false},
			{keepPromoted + 2*time.Second, 2, true, 1, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDeliveredIDs()
			for i, s := range tt.steps {
				if got := d.Delivering(q, s.epoch, s.mirrored, id(s.msg), start.Add(s.after)); got != s.before {
					t.Fatalf("step %d (%+v): delivered before = %v, want %v", i, s, got, s.before)
				}
			}
		})
	}
}

func TestDeliveredIDsBounded(t *testing.T) {
	q := mirror.QueueID{VHost: "/", Name: "q"}
	d := NewDeliveredIDs()
	now := time.Unix(1000, 0)
	var first mirror.MessageID
	first[15] = 1
	d.Delivering(q, 1, true, first, now)
	for i := range maxRecent {
		var id mirror.MessageID
		id[0], id[1], id[2] = byte(i), byte(i>>8), byte(i>>16)
		d.Delivering(q, 1, true, id, now)
	}
	if d.Delivering(q, 1, true, first, now) {
		t.Fatal("the oldest of more than maxRecent deliveries is still remembered")
	}
	r := d.queues[q]
	if n := len(r.recent); n > maxRecent+1 {
		t.Fatalf("%d deliveries remembered, want at most %d", n, maxRecent+1)
	}
}

func TestDeliveredIDsSweep(t *testing.T) {
	deleted := mirror.QueueID{VHost: "/", Name: "deleted"}
	promoted := mirror.QueueID{VHost: "/", Name: "promoted"}
	idle := mirror.QueueID{VHost: "/", Name: "idle"}
	d := NewDeliveredIDs()
	now := time.Unix(1000, 0)
	msg := mirror.MessageID{1}
	for _, q := range []mirror.QueueID{deleted, promoted, idle} {
		d.Delivering(q, 1, true, msg, now)
	}
	lookup := func(q mirror.QueueID) (mirror.QueueMeta, bool) {
		switch q {
		case promoted:
			return mirror.QueueMeta{Epoch: 2}, true
		case idle:
			return mirror.QueueMeta{Epoch: 1}, true
		}
		return mirror.QueueMeta{}, false
	}
	// Past keepRecent, with no delivery in between: the promotion seen by
	// the sweep keeps what came before it.
	now = now.Add(keepRecent + time.Second)
	d.Sweep(lookup, now)
	if _, ok := d.queues[deleted]; ok {
		t.Error("a deleted queue's record survived the sweep")
	}
	if _, ok := d.queues[idle]; ok {
		t.Error("an idle queue's record survived the sweep past keepRecent")
	}
	if !d.Delivering(promoted, 2, true, msg, now) {
		t.Error("a delivery before the promotion was forgotten by the sweep")
	}
}

func TestDeadLettered(t *testing.T) {
	header := func(p frames.Properties) []byte {
		h := frames.ContentHeader{ClassID: 60, BodySize: 1, Properties: p}
		b, err := h.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name  string
		props frames.Properties
		want  bool
	}{
		{"no headers", frames.Properties{}, false},
		{"other headers", frames.Properties{Flags: frames.FlagHeaders, Headers: frames.Table{{Key: "k", Value: "v"}}}, false},
		{"x-death", frames.Properties{Flags: frames.FlagHeaders, Headers: frames.Table{
			{Key: "x-first-death-reason", Value: "expired"},
			{Key: "x-death", Value: []any{frames.Table{{Key: "count", Value: int64(1)}}}},
		}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DeadLettered(header(tt.props)); got != tt.want {
				t.Fatalf("deadLettered = %v, want %v", got, tt.want)
			}
		})
	}
}

// BenchmarkDeliveredIDs is the cost the record adds to each delivery of a
// mirrored queue, at a steady rate that keeps keepRecent's worth of entries.
func BenchmarkDeliveredIDs(b *testing.B) {
	q := mirror.QueueID{VHost: "/", Name: "q"}
	d := NewDeliveredIDs()
	now := time.Unix(1000, 0)
	step := keepRecent / 100_000 // 100 000 entries kept
	var id mirror.MessageID
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id[0], id[1], id[2], id[3] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
		now = now.Add(step)
		d.Delivering(q, 1, true, id, now)
	}
}
