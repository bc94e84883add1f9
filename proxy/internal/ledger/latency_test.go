package ledger

import (
	"testing"
	"time"
)

// TestPublisherConfirmsLatency: the acks of timed publishes are observed
// once each, with the time since arrival; nacks, untimed publishes and the
// proxy's own are not.
func TestPublisherConfirmsLatency(t *testing.T) {
	type confirm struct {
		backend        int
		seq            uint64
		multiple, nack bool
	}
	cases := []struct {
		name      string
		publishes int  // to backends 0 and 1, each timed unless untimed
		untimed   bool // no Arrived
		confirms  []confirm
		want      int // observations
	}{
		{name: "one publish, both copies ack", publishes: 1,
			confirms: []confirm{{0, 1, false, false}, {1, 1, false, false}}, want: 1},
		{name: "one copy acked: not yet", publishes: 1,
			confirms: []confirm{{0, 1, false, false}}, want: 0},
		{name: "multiple ack answers three", publishes: 3,
			confirms: []confirm{{0, 3, true, false}, {1, 3, true, false}}, want: 3},
		{name: "out of order: the later publish first", publishes: 2,
			confirms: []confirm{{0, 2, false, false}, {1, 2, false, false}, {0, 1, false, false}, {1, 1, false, false}}, want: 2},
		{name: "a nack is not observed", publishes: 2,
			confirms: []confirm{{0, 2, true, false}, {1, 1, false, true}, {1, 2, false, false}}, want: 1},
		{name: "untimed publishes are not observed", publishes: 2, untimed: true,
			confirms: []confirm{{0, 2, true, false}, {1, 2, true, false}}, want: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var observed []float64
			var p PublisherConfirms
			p.ObserveLatency(func(s float64) { observed = append(observed, s) })
			start := time.Now().Add(-time.Second)
			for range tc.publishes {
				p.PublishTo(CopySet{Quorum: []int{0, 1}, Master: -1}, time.Time{})
				if !tc.untimed {
					p.Arrived(start)
				}
			}
			for _, c := range tc.confirms {
				p.Confirm(c.backend, c.seq, c.multiple, c.nack, nil, nil)
			}
			if len(observed) != tc.want {
				t.Fatalf("observed %d latencies %v, want %d", len(observed), observed, tc.want)
			}
			for _, s := range observed {
				if s < 1 || s > 60 {
					t.Errorf("latency %fs, want about 1s (arrived a second before)", s)
				}
			}
		})
	}
}

// The proxy's own publishes, numbered before the client's confirm.select,
// are never observed, and Arrived without ObserveLatency changes nothing.
func TestPublisherConfirmsLatencyOwnPublishes(t *testing.T) {
	var p PublisherConfirms
	p.PublishTo(CopySet{Quorum: []int{0}, Master: -1}, time.Time{})
	p.Arrived(time.Now())
	if p.waiting[0].timed {
		t.Fatal("Arrived without ObserveLatency timed the publish")
	}
	observed := 0
	p.ObserveLatency(func(float64) { observed++ })
	p.ClientSelected()
	p.PublishTo(CopySet{Quorum: []int{0}, Master: -1}, time.Time{})
	p.Arrived(time.Now())
	if out := p.Confirm(0, 2, true, false, nil, nil); len(out) != 1 || out[0] != (ClientConfirm{Seq: 1, Multiple: true}) {
		t.Fatalf("confirms %v, want the client's 1", out)
	}
	if observed != 1 {
		t.Errorf("observed %d, want 1 (the client's publish alone)", observed)
	}
}

// BenchmarkPublisherConfirmsTimed is BenchmarkPublisherConfirms with each
// publish timed and its ack observed: the confirm histogram's cost on the
// data path.
func BenchmarkPublisherConfirmsTimed(b *testing.B) {
	var p PublisherConfirms
	var out []ClientConfirm
	var sum float64
	p.ObserveLatency(func(s float64) { sum += s })
	for i := 0; i < 100; i++ {
		p.Publish(0)
		p.Arrived(time.Now())
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := uint64(1); i <= uint64(b.N); i++ {
		p.Publish(0)
		p.Arrived(time.Now())
		out = p.Confirm(0, i, false, false, out[:0], nil)
	}
}
