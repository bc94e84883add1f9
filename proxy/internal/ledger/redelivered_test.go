package ledger

import (
	"math/rand/v2"
	"slices"
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
	if n := r.recent.Len(); n > maxRecent+1 {
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

// TestDeliveredIDsAskPeers: in a cluster, a record that starts at or rises to an epoch
// above zero asks the other proxies what they delivered before it, flags every delivery
// of that epoch until the answer, and then flags exactly what the answer names and its
// own repeats.
func TestDeliveredIDsAskPeers(t *testing.T) {
	q := mirror.QueueID{VHost: "/", Name: "q"}
	theirs, mine, fresh := mirror.MessageID{1}, mirror.MessageID{2}, mirror.MessageID{3}
	start := time.Unix(1000, 0)
	// deliver delivers msg at epoch after start and expects flagged.
	type deliver struct {
		after   time.Duration
		epoch   uint64
		msg     mirror.MessageID
		flagged bool
	}
	tests := []struct {
		name string
		// before is delivered first, then the question is (or is not) answered
		// at answerAfter with theirs, then steps run.
		before      []deliver
		asks        []PeerAsk
		answer      bool
		answerAfter time.Duration
		steps       []deliver
	}{
		{
			name:   "a record starting after a promotion asks, and flags until answered",
			before: []deliver{{0, 2, fresh, true}},
			asks:   []PeerAsk{{q, 2}},
			answer: true, answerAfter: time.Second,
			steps: []deliver{{2 * time.Second, 2, theirs, true}, {2 * time.Second, 2, mine, false}, {3 * time.Second, 2, fresh, true}},
		},
		{
			name:   "a record starting at epoch 0 asks nothing",
			before: []deliver{{0, 0, fresh, false}},
			steps:  []deliver{{time.Second, 0, theirs, false}},
		},
		{
			name:   "a rise asks again; own deliveries before it stay flagged",
			before: []deliver{{0, 1, mine, true}, {askBound + time.Second, 1, fresh, false}, {askBound + 2*time.Second, 2, mine, true}},
			asks:   []PeerAsk{{q, 1}, {q, 2}},
			answer: true, answerAfter: askBound + 3*time.Second,
			steps: []deliver{{askBound + 4*time.Second, 2, theirs, true}, {askBound + 5*time.Second, 2, fresh, true}},
		},
		{
			name:   "an unanswered question flags for askBound only",
			before: []deliver{{0, 3, mine, true}},
			asks:   []PeerAsk{{q, 3}},
			steps:  []deliver{{askBound - time.Millisecond, 3, fresh, true}, {askBound + time.Millisecond, 3, theirs, false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDeliveredIDs()
			asks := d.AskPeers(8)
			check := func(phase string, steps []deliver) {
				for i, s := range steps {
					if got := d.Delivering(q, s.epoch, true, s.msg, start.Add(s.after)); got != s.flagged {
						t.Fatalf("%s step %d (%+v): flagged %v, want %v", phase, i, s, got, s.flagged)
					}
				}
			}
			check("before", tt.before)
			var got []PeerAsk
			for len(asks) > 0 {
				got = append(got, <-asks)
			}
			if !slices.Equal(got, tt.asks) {
				t.Fatalf("asked %v, want %v", got, tt.asks)
			}
			if tt.answer {
				last := got[len(got)-1]
				d.Answered(q, last.Epoch, []mirror.MessageID{theirs}, start.Add(tt.answerAfter))
			}
			check("after", tt.steps)
		})
	}
}

// TestDeliveredBefore: the answer to another proxy names what this one delivered at
// epochs below the one asked about, not what it delivered since.
func TestDeliveredBefore(t *testing.T) {
	q := mirror.QueueID{VHost: "/", Name: "q"}
	d := NewDeliveredIDs()
	now := time.Unix(1000, 0)
	old, later := mirror.MessageID{1}, mirror.MessageID{2}
	d.Delivering(q, 1, true, old, now)
	if got := d.DeliveredBefore(q, 2); !slices.Equal(got, []mirror.MessageID{old}) {
		t.Fatalf("asked before the rise: %v, want %v", got, []mirror.MessageID{old})
	}
	d.Delivering(q, 2, true, later, now.Add(time.Second))
	if got := d.DeliveredBefore(q, 2); !slices.Equal(got, []mirror.MessageID{old}) {
		t.Fatalf("asked after the rise: %v, want %v", got, []mirror.MessageID{old})
	}
	if got := d.DeliveredBefore(mirror.QueueID{VHost: "/", Name: "other"}, 2); got != nil {
		t.Fatalf("a queue never delivered from: %v", got)
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
// mirrored queue, at a steady rate that keeps 100 000 entries: with the
// identities the proxy makes (two publishing connections, each numbering
// its publishes), and with every identity under a prefix of its own.
func BenchmarkDeliveredIDs(b *testing.B) {
	for _, bc := range []struct {
		name string
		id   func(i uint64) mirror.MessageID
	}{
		{"two publishers", func(i uint64) mirror.MessageID { return joinID(0xa1b2c3d4+i%2, i/2) }},
		{"a prefix each", func(i uint64) mirror.MessageID { return joinID(i*0x9e3779b97f4a7c15, 1) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			q := mirror.QueueID{VHost: "/", Name: "q"}
			d := NewDeliveredIDs()
			now := time.Unix(1000, 0)
			step := keepRecent / 100_000
			b.ReportAllocs()
			for i := uint64(0); b.Loop(); i++ {
				now = now.Add(step)
				d.Delivering(q, 1, true, bc.id(i), now)
			}
		})
	}
}

// TestDeliveredBeforeRoundTrip: what one proxy answers of its deliveries
// (identities of three publishing connections, and some of any shape)
// flags each of them when another proxy's new master delivers it again.
func TestDeliveredBeforeRoundTrip(t *testing.T) {
	q := mirror.QueueID{VHost: "/", Name: "q"}
	rng := rand.New(rand.NewPCG(3, 4))
	now := time.Unix(1000, 0)
	first := NewDeliveredIDs()
	prefixes := []uint64{rng.Uint64(), rng.Uint64(), rng.Uint64()}
	var ids []mirror.MessageID
	for i := range 50_000 {
		id := joinID(prefixes[i%3], uint64(30_000+i/3))
		if i%97 == 0 {
			id = joinID(rng.Uint64(), rng.Uint64())
		}
		ids = append(ids, id)
		first.Delivering(q, 1, true, id, now)
	}
	answer := first.DeliveredBefore(q, 2)
	if len(answer) != len(ids) {
		t.Fatalf("the answer holds %d identities, want %d", len(answer), len(ids))
	}
	second := NewDeliveredIDs()
	second.AskPeers(1)
	second.Answered(q, 2, answer, now)
	later := now.Add(askBound + time.Second) // flagged by the answer, not by the wait for it
	for _, id := range ids {
		if !second.Delivering(q, 2, true, id, later) {
			t.Fatalf("%s, delivered through the first proxy, is not flagged through the second", id)
		}
	}
}
