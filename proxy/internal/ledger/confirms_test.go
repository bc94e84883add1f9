package ledger

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

func TestPublisherConfirms(t *testing.T) {
	type backendConfirm struct {
		backend        int
		seq            uint64
		multiple, nack bool
		want           []ClientConfirm
	}
	tests := []struct {
		name      string
		publishes [][]int // backends of each publish
		confirms  []backendConfirm
		wantLeft  int
	}{
		{
			name:      "single backend in order passes through",
			publishes: [][]int{{0}, {0}, {0}},
			confirms: []backendConfirm{
				{backend: 0, seq: 1, want: []ClientConfirm{{Seq: 1}}},
				{backend: 0, seq: 3, multiple: true, want: []ClientConfirm{{Seq: 3, Multiple: true}}},
			},
		},
		{
			name:      "single backend out of order",
			publishes: [][]int{{0}, {0}, {0}},
			confirms: []backendConfirm{
				{backend: 0, seq: 2, want: []ClientConfirm{{Seq: 2}}},
				{backend: 0, seq: 1, want: []ClientConfirm{{Seq: 1}}},
				{backend: 0, seq: 3, nack: true, want: []ClientConfirm{{Seq: 3, Nack: true}}},
			},
		},
		{
			name:      "a publish on two backends waits for both",
			publishes: [][]int{{0, 1}, {0, 1}},
			confirms: []backendConfirm{
				{backend: 0, seq: 2, multiple: true},
				{backend: 1, seq: 1, want: []ClientConfirm{{Seq: 1}}},
				{backend: 1, seq: 2, want: []ClientConfirm{{Seq: 2}}},
			},
		},
		{
			name:      "any nack among the copies nacks the publish",
			publishes: [][]int{{0, 1}},
			confirms: []backendConfirm{
				{backend: 0, seq: 1, nack: true},
				{backend: 1, seq: 1, want: []ClientConfirm{{Seq: 1, Nack: true}}},
			},
		},
		{
			name:      "backends number their own sequences",
			publishes: [][]int{{0}, {1}, {0, 1}},
			confirms: []backendConfirm{
				{backend: 1, seq: 2, multiple: true, want: []ClientConfirm{{Seq: 2}}},
				// 2 was confirmed alone already; one multiple ack of 3 covers 1
				// and 3, and repeats 2, which a client ignores (RabbitMQ does the same).
				{backend: 0, seq: 2, multiple: true, want: []ClientConfirm{{Seq: 3, Multiple: true}}},
			},
		},
		{
			name:      "a confirm for an unknown sequence changes nothing",
			publishes: [][]int{{0}},
			confirms:  []backendConfirm{{backend: 0, seq: 9}, {backend: 3, seq: 1}},
			wantLeft:  1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p PublisherConfirms
			for i, backends := range tt.publishes {
				if got := p.PublishTo(CopySet{Quorum: backends, Master: -1}, time.Time{}); got != uint64(i+1) {
					t.Fatalf("publish %d: got seq %d, want %d", i, got, i+1)
				}
			}
			for i, c := range tt.confirms {
				got := p.Confirm(c.backend, c.seq, c.multiple, c.nack, nil, nil)
				if !reflect.DeepEqual(got, c.want) {
					t.Errorf("confirm %d (backend %d seq %d): got %+v, want %+v", i, c.backend, c.seq, got, c.want)
				}
			}
			if got := p.Unconfirmed(); got != tt.wantLeft {
				t.Errorf("unconfirmed: got %d, want %d", got, tt.wantLeft)
			}
		})
	}
}

func TestPublisherConfirmsSteadyStateDoesNotAllocate(t *testing.T) {
	var p PublisherConfirms
	var out []ClientConfirm
	step := func() {
		seq := p.Publish(0)
		out = p.Confirm(0, seq, false, false, out[:0], nil)
	}
	for i := 0; i < 100; i++ {
		step()
	}
	if allocs := testing.AllocsPerRun(1000, step); allocs != 0 {
		t.Errorf("publish+confirm allocates %.1f times per message, want 0", allocs)
	}
}

// TestPublisherConfirmsQuorum: backends outside a publish's quorum (an
// unsynchronised slave) are numbered but not waited for, and a lost backend
// stops counting: a publish some quorum backend acked is acked, one none
// acked is nacked.
func TestPublisherConfirmsQuorum(t *testing.T) {
	type step struct {
		lost           bool // the backend's link was lost
		backend        int
		seq            uint64
		multiple, nack bool
		want           []ClientConfirm
	}
	tests := []struct {
		name      string
		publishes [][2][]int // quorum, extra
		steps     []step
		wantLeft  int
	}{
		{
			name:      "an unsynchronised slave is not waited for",
			publishes: [][2][]int{{{0, 1}, {2}}, {{0, 1}, {2}}},
			steps: []step{
				{backend: 2, seq: 2, multiple: true},
				{backend: 0, seq: 2, multiple: true},
				{backend: 1, seq: 1, want: []ClientConfirm{{Seq: 1}}},
				{backend: 1, seq: 2, want: []ClientConfirm{{Seq: 2}}},
			},
		},
		{
			name:      "the master lost after the slave acked: acked",
			publishes: [][2][]int{{{0, 1}, nil}},
			steps: []step{
				{backend: 1, seq: 1},
				{lost: true, backend: 0, want: []ClientConfirm{{Seq: 1}}},
			},
		},
		{
			name:      "every copy lost before acking: nacked",
			publishes: [][2][]int{{{0}, nil}, {{0}, nil}},
			steps: []step{
				{backend: 0, seq: 1, want: []ClientConfirm{{Seq: 1}}},
				{lost: true, backend: 0, want: []ClientConfirm{{Seq: 2, Nack: true}}},
			},
		},
		{
			name:      "a lost extra backend changes nothing",
			publishes: [][2][]int{{{0}, {1}}},
			steps: []step{
				{lost: true, backend: 1},
				{backend: 0, seq: 1, want: []ClientConfirm{{Seq: 1}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p PublisherConfirms
			for _, pub := range tt.publishes {
				p.PublishTo(CopySet{Quorum: pub[0], Extra: pub[1], Master: -1}, time.Time{})
			}
			for i, s := range tt.steps {
				var got []ClientConfirm
				if s.lost {
					got = p.BackendLost(s.backend, time.Time{}, nil, nil)
				} else {
					got = p.Confirm(s.backend, s.seq, s.multiple, s.nack, nil, nil)
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Errorf("step %d: got %+v, want %+v", i, got, s.want)
				}
			}
			if got := p.Unconfirmed(); got != tt.wantLeft {
				t.Errorf("unconfirmed: got %d, want %d", got, tt.wantLeft)
			}
		})
	}
}

// TestPublisherConfirmsMissedCopies: a slave's nack, or its link lost before
// it confirmed, names the slave copies that may lack a publish (once per
// queue); the master's copy and an unsynchronised slave's are not named.
func TestPublisherConfirmsMissedCopies(t *testing.T) {
	orders := &mirror.QueueID{VHost: "/", Name: "orders"}
	tests := []struct {
		name string
		lost bool
		// backend's confirm (or loss) of publishes up to seq, multiple
		backend int
		nack    bool
		want    []MissedCopy
	}{
		{name: "a slave's nack", backend: 1, nack: true, want: []MissedCopy{{Backend: 1, Queue: orders}}},
		{name: "a slave's ack", backend: 1},
		{name: "the master's nack", backend: 0, nack: true},
		{name: "an unsynchronised slave's nack", backend: 2, nack: true},
		{name: "a slave's link lost", lost: true, backend: 1, want: []MissedCopy{{Backend: 1, Queue: orders}}},
		{name: "the master's link lost", lost: true, backend: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p PublisherConfirms
			for range 3 {
				p.PublishTo(CopySet{Quorum: []int{0, 1}, Extra: []int{2}, Queue: orders, Master: 0}, time.Time{})
			}
			var missed []MissedCopy
			if tt.lost {
				p.BackendLost(tt.backend, time.Time{}, nil, &missed)
			} else {
				p.Confirm(tt.backend, 3, true, tt.nack, nil, &missed)
			}
			if !reflect.DeepEqual(missed, tt.want) {
				t.Errorf("missed: got %+v, want %+v", missed, tt.want)
			}
		})
	}
	t.Run("an exchange publish's lost link names any queue", func(t *testing.T) {
		var p PublisherConfirms
		p.PublishTo(CopySet{Quorum: []int{0, 1}, Queue: AnyQueue, Master: -1}, time.Time{})
		var missed []MissedCopy
		p.BackendLost(0, time.Time{}, nil, &missed)
		if want := []MissedCopy{{Backend: 0, Queue: AnyQueue}}; !reflect.DeepEqual(missed, want) {
			t.Errorf("missed: got %+v, want %+v", missed, want)
		}
	})
}

// TestPublisherConfirmsRefused: the master's nack of a publish to a
// mirrored queue names the message, whose slave copies are then removed;
// a slave's nack, an ack, an exchange publish's nack and a publish whose
// content never went out (no identity) name nothing.
func TestPublisherConfirmsRefused(t *testing.T) {
	orders := &mirror.QueueID{VHost: "/", Name: "orders"}
	id := func(n byte) mirror.MessageID { return mirror.MessageID{15: n} }
	tests := []struct {
		name     string
		queue    *mirror.QueueID
		identify bool
		// backend's confirm of publishes up to 2, multiple
		backend int
		nack    bool
		want    []RefusedPublish
	}{
		{name: "the master's nack", queue: orders, identify: true, backend: 0, nack: true,
			want: []RefusedPublish{{Queue: orders, ID: id(1)}, {Queue: orders, ID: id(2)}}},
		{name: "the master's ack", queue: orders, identify: true, backend: 0},
		{name: "a slave's nack", queue: orders, identify: true, backend: 1, nack: true},
		{name: "an unsynchronised slave's nack", queue: orders, identify: true, backend: 2, nack: true},
		{name: "an exchange publish's nack", queue: AnyQueue, identify: true, backend: 0, nack: true},
		{name: "no identity", queue: orders, backend: 0, nack: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p PublisherConfirms
			for n := range byte(2) {
				seq := p.PublishTo(CopySet{Quorum: []int{0, 1}, Extra: []int{2}, Queue: tt.queue, Master: 0}, time.Time{})
				if tt.identify {
					p.Identify(seq, id(n+1))
				}
			}
			p.Confirm(tt.backend, 2, true, tt.nack, nil, nil)
			if got := p.TakeRefused(nil); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("refused: got %+v, want %+v", got, tt.want)
			}
			if got := p.TakeRefused(nil); len(got) != 0 {
				t.Errorf("refused a second time: got %+v, want none", got)
			}
		})
	}
}

// TestPublisherConfirmsClientSelectsLater: publishes the proxy numbered in
// its own confirm mode are never confirmed to the client, whose sequence
// starts at 1 with its confirm.select.
func TestPublisherConfirmsClientSelectsLater(t *testing.T) {
	var p PublisherConfirms
	p.PublishTo(CopySet{Quorum: []int{0, 1}, Master: -1}, time.Time{}) // the proxy's own: 1
	p.PublishTo(CopySet{Quorum: []int{0, 1}, Master: -1}, time.Time{}) // the proxy's own: 2
	p.ClientSelected()
	p.PublishTo(CopySet{Quorum: []int{0, 1}, Master: -1}, time.Time{}) // the client's 1
	p.PublishTo(CopySet{Quorum: []int{0, 1}, Master: -1}, time.Time{}) // the client's 2
	steps := []struct {
		backend  int
		seq      uint64
		multiple bool
		nack     bool
		want     []ClientConfirm
	}{
		{backend: 0, seq: 3, multiple: true},
		{backend: 1, seq: 1}, // own 1 done: nothing to say
		{backend: 1, seq: 3, multiple: true, want: []ClientConfirm{{Seq: 1, Multiple: true}}}, // own 2 and client 1
		{backend: 0, seq: 4, nack: true},
		{backend: 1, seq: 4, want: []ClientConfirm{{Seq: 2, Nack: true}}},
	}
	for i, s := range steps {
		got := p.Confirm(s.backend, s.seq, s.multiple, s.nack, nil, nil)
		if !reflect.DeepEqual(got, s.want) {
			t.Errorf("step %d: got %+v, want %+v", i, got, s.want)
		}
	}
	if got := p.Unconfirmed(); got != 0 {
		t.Errorf("unconfirmed: got %d, want 0", got)
	}
}

// TestPublisherConfirmsLostCopiesWaitForTheMetadata: a mirrored queue's
// quorum copy lost before it confirmed (its link lost, or never reached)
// keeps its publish waiting while the metadata still counts the backend;
// once it does not, the publish is answered from the other copies; if it
// still does after the failover wait, the publish is nacked.
func TestPublisherConfirmsLostCopiesWaitForTheMetadata(t *testing.T) {
	orders := &mirror.QueueID{VHost: "/", Name: "orders"}
	start := time.Unix(1000, 0)
	type step struct {
		ack, lost int // a backend acks publish 1, or its link is lost (-1: none)
		// release with the metadata counting these backends, at this offset
		release bool
		holds   []int
		at      time.Duration
		want    []ClientConfirm
	}
	const wait = 10 * time.Second
	tests := []struct {
		name      string
		unreached []int
		steps     []step
	}{
		{
			name: "a slave lost: answered once the metadata dropped it",
			steps: []step{
				{ack: 0, lost: -1},
				{ack: 2, lost: -1},
				{ack: -1, lost: 1},
				{ack: -1, lost: -1, release: true, holds: []int{0, 1, 2}, at: time.Second},
				{ack: -1, lost: -1, release: true, holds: []int{0, 2}, at: 2 * time.Second, want: []ClientConfirm{{Seq: 1}}},
			},
		},
		{
			name: "the master lost and never replaced: nacked after the wait",
			steps: []step{
				{ack: 1, lost: -1},
				{ack: 2, lost: -1},
				{ack: -1, lost: 0},
				{ack: -1, lost: -1, release: true, holds: []int{0, 1, 2}, at: wait - time.Second},
				{ack: -1, lost: -1, release: true, holds: []int{0, 1, 2}, at: wait + time.Second, want: []ClientConfirm{{Seq: 1, Nack: true}}},
			},
		},
		{
			name:      "a slave the publish could not reach counts until dropped",
			unreached: []int{2},
			steps: []step{
				{ack: 0, lost: -1},
				{ack: 1, lost: -1},
				{ack: -1, lost: -1, release: true, holds: []int{0, 1, 2}},
				{ack: -1, lost: -1, release: true, holds: []int{0, 1}, want: []ClientConfirm{{Seq: 1}}},
			},
		},
		{
			name: "every copy lost before acking: nacked once dropped",
			steps: []step{
				{ack: -1, lost: 0},
				{ack: -1, lost: 1},
				{ack: -1, lost: 2},
				{ack: -1, lost: -1, release: true, holds: nil, want: []ClientConfirm{{Seq: 1, Nack: true}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p PublisherConfirms
			quorum := []int{0, 1, 2}
			if len(tt.unreached) > 0 {
				quorum = []int{0, 1}
			}
			p.PublishTo(CopySet{Quorum: quorum, Unreached: tt.unreached, Queue: orders, Master: 0}, start)
			for i, s := range tt.steps {
				var got []ClientConfirm
				switch {
				case s.ack >= 0:
					got = p.Confirm(s.ack, 1, false, false, nil, nil)
				case s.lost >= 0:
					got = p.BackendLost(s.lost, start, nil, nil)
				case s.release:
					held := func(b int, q *mirror.QueueID) bool {
						if q != orders {
							t.Errorf("step %d: held asked about %v, want orders", i, q)
						}
						return slices.Contains(s.holds, b)
					}
					got = p.Release(held, start.Add(s.at-wait), nil)
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Errorf("step %d: got %+v, want %+v", i, got, s.want)
				}
			}
			if got := p.Unconfirmed(); got != 0 {
				t.Errorf("unconfirmed: got %d, want 0", got)
			}
		})
	}
}
