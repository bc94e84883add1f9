package proxy

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
		want           []clientConfirm
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
				{backend: 0, seq: 1, want: []clientConfirm{{seq: 1}}},
				{backend: 0, seq: 3, multiple: true, want: []clientConfirm{{seq: 3, multiple: true}}},
			},
		},
		{
			name:      "single backend out of order",
			publishes: [][]int{{0}, {0}, {0}},
			confirms: []backendConfirm{
				{backend: 0, seq: 2, want: []clientConfirm{{seq: 2}}},
				{backend: 0, seq: 1, want: []clientConfirm{{seq: 1}}},
				{backend: 0, seq: 3, nack: true, want: []clientConfirm{{seq: 3, nack: true}}},
			},
		},
		{
			name:      "a publish on two backends waits for both",
			publishes: [][]int{{0, 1}, {0, 1}},
			confirms: []backendConfirm{
				{backend: 0, seq: 2, multiple: true},
				{backend: 1, seq: 1, want: []clientConfirm{{seq: 1}}},
				{backend: 1, seq: 2, want: []clientConfirm{{seq: 2}}},
			},
		},
		{
			name:      "any nack among the copies nacks the publish",
			publishes: [][]int{{0, 1}},
			confirms: []backendConfirm{
				{backend: 0, seq: 1, nack: true},
				{backend: 1, seq: 1, want: []clientConfirm{{seq: 1, nack: true}}},
			},
		},
		{
			name:      "backends number their own sequences",
			publishes: [][]int{{0}, {1}, {0, 1}},
			confirms: []backendConfirm{
				{backend: 1, seq: 2, multiple: true, want: []clientConfirm{{seq: 2}}},
				// 2 was confirmed alone already; one multiple ack of 3 covers 1
				// and 3, and repeats 2, which a client ignores (RabbitMQ does the same).
				{backend: 0, seq: 2, multiple: true, want: []clientConfirm{{seq: 3, multiple: true}}},
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
			var p publisherConfirms
			for i, backends := range tt.publishes {
				if got := p.publishTo(copySet{quorum: backends, master: -1}, time.Time{}); got != uint64(i+1) {
					t.Fatalf("publish %d: got seq %d, want %d", i, got, i+1)
				}
			}
			for i, c := range tt.confirms {
				got := p.confirm(c.backend, c.seq, c.multiple, c.nack, nil, nil)
				if !reflect.DeepEqual(got, c.want) {
					t.Errorf("confirm %d (backend %d seq %d): got %+v, want %+v", i, c.backend, c.seq, got, c.want)
				}
			}
			if got := p.unconfirmed(); got != tt.wantLeft {
				t.Errorf("unconfirmed: got %d, want %d", got, tt.wantLeft)
			}
		})
	}
}

func TestPublisherConfirmsSteadyStateDoesNotAllocate(t *testing.T) {
	var p publisherConfirms
	var out []clientConfirm
	step := func() {
		seq := p.publish(0)
		out = p.confirm(0, seq, false, false, out[:0], nil)
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
		want           []clientConfirm
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
				{backend: 1, seq: 1, want: []clientConfirm{{seq: 1}}},
				{backend: 1, seq: 2, want: []clientConfirm{{seq: 2}}},
			},
		},
		{
			name:      "the master lost after the slave acked: acked",
			publishes: [][2][]int{{{0, 1}, nil}},
			steps: []step{
				{backend: 1, seq: 1},
				{lost: true, backend: 0, want: []clientConfirm{{seq: 1}}},
			},
		},
		{
			name:      "every copy lost before acking: nacked",
			publishes: [][2][]int{{{0}, nil}, {{0}, nil}},
			steps: []step{
				{backend: 0, seq: 1, want: []clientConfirm{{seq: 1}}},
				{lost: true, backend: 0, want: []clientConfirm{{seq: 2, nack: true}}},
			},
		},
		{
			name:      "a lost extra backend changes nothing",
			publishes: [][2][]int{{{0}, {1}}},
			steps: []step{
				{lost: true, backend: 1},
				{backend: 0, seq: 1, want: []clientConfirm{{seq: 1}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p publisherConfirms
			for _, pub := range tt.publishes {
				p.publishTo(copySet{quorum: pub[0], extra: pub[1], master: -1}, time.Time{})
			}
			for i, s := range tt.steps {
				var got []clientConfirm
				if s.lost {
					got = p.backendLost(s.backend, time.Time{}, nil, nil)
				} else {
					got = p.confirm(s.backend, s.seq, s.multiple, s.nack, nil, nil)
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Errorf("step %d: got %+v, want %+v", i, got, s.want)
				}
			}
			if got := p.unconfirmed(); got != tt.wantLeft {
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
		want    []missedCopy
	}{
		{name: "a slave's nack", backend: 1, nack: true, want: []missedCopy{{backend: 1, queue: orders}}},
		{name: "a slave's ack", backend: 1},
		{name: "the master's nack", backend: 0, nack: true},
		{name: "an unsynchronised slave's nack", backend: 2, nack: true},
		{name: "a slave's link lost", lost: true, backend: 1, want: []missedCopy{{backend: 1, queue: orders}}},
		{name: "the master's link lost", lost: true, backend: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p publisherConfirms
			for range 3 {
				p.publishTo(copySet{quorum: []int{0, 1}, extra: []int{2}, queue: orders, master: 0}, time.Time{})
			}
			var missed []missedCopy
			if tt.lost {
				p.backendLost(tt.backend, time.Time{}, nil, &missed)
			} else {
				p.confirm(tt.backend, 3, true, tt.nack, nil, &missed)
			}
			if !reflect.DeepEqual(missed, tt.want) {
				t.Errorf("missed: got %+v, want %+v", missed, tt.want)
			}
		})
	}
	t.Run("an exchange publish's lost link names any queue", func(t *testing.T) {
		var p publisherConfirms
		p.publishTo(copySet{quorum: []int{0, 1}, queue: anyQueue, master: -1}, time.Time{})
		var missed []missedCopy
		p.backendLost(0, time.Time{}, nil, &missed)
		if want := []missedCopy{{backend: 0, queue: anyQueue}}; !reflect.DeepEqual(missed, want) {
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
		want    []refusedPublish
	}{
		{name: "the master's nack", queue: orders, identify: true, backend: 0, nack: true,
			want: []refusedPublish{{queue: orders, id: id(1)}, {queue: orders, id: id(2)}}},
		{name: "the master's ack", queue: orders, identify: true, backend: 0},
		{name: "a slave's nack", queue: orders, identify: true, backend: 1, nack: true},
		{name: "an unsynchronised slave's nack", queue: orders, identify: true, backend: 2, nack: true},
		{name: "an exchange publish's nack", queue: anyQueue, identify: true, backend: 0, nack: true},
		{name: "no identity", queue: orders, backend: 0, nack: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p publisherConfirms
			for n := range byte(2) {
				seq := p.publishTo(copySet{quorum: []int{0, 1}, extra: []int{2}, queue: tt.queue, master: 0}, time.Time{})
				if tt.identify {
					p.identify(seq, id(n+1))
				}
			}
			p.confirm(tt.backend, 2, true, tt.nack, nil, nil)
			if got := p.takeRefused(nil); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("refused: got %+v, want %+v", got, tt.want)
			}
			if got := p.takeRefused(nil); len(got) != 0 {
				t.Errorf("refused a second time: got %+v, want none", got)
			}
		})
	}
}

// TestPublisherConfirmsClientSelectsLater: publishes the proxy numbered in
// its own confirm mode are never confirmed to the client, whose sequence
// starts at 1 with its confirm.select.
func TestPublisherConfirmsClientSelectsLater(t *testing.T) {
	var p publisherConfirms
	p.publishTo(copySet{quorum: []int{0, 1}, master: -1}, time.Time{}) // the proxy's own: 1
	p.publishTo(copySet{quorum: []int{0, 1}, master: -1}, time.Time{}) // the proxy's own: 2
	p.clientSelected()
	p.publishTo(copySet{quorum: []int{0, 1}, master: -1}, time.Time{}) // the client's 1
	p.publishTo(copySet{quorum: []int{0, 1}, master: -1}, time.Time{}) // the client's 2
	steps := []struct {
		backend  int
		seq      uint64
		multiple bool
		nack     bool
		want     []clientConfirm
	}{
		{backend: 0, seq: 3, multiple: true},
		{backend: 1, seq: 1}, // own 1 done: nothing to say
		{backend: 1, seq: 3, multiple: true, want: []clientConfirm{{seq: 1, multiple: true}}}, // own 2 and client 1
		{backend: 0, seq: 4, nack: true},
		{backend: 1, seq: 4, want: []clientConfirm{{seq: 2, nack: true}}},
	}
	for i, s := range steps {
		got := p.confirm(s.backend, s.seq, s.multiple, s.nack, nil, nil)
		if !reflect.DeepEqual(got, s.want) {
			t.Errorf("step %d: got %+v, want %+v", i, got, s.want)
		}
	}
	if got := p.unconfirmed(); got != 0 {
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
		want    []clientConfirm
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
				{ack: -1, lost: -1, release: true, holds: []int{0, 2}, at: 2 * time.Second, want: []clientConfirm{{seq: 1}}},
			},
		},
		{
			name: "the master lost and never replaced: nacked after the wait",
			steps: []step{
				{ack: 1, lost: -1},
				{ack: 2, lost: -1},
				{ack: -1, lost: 0},
				{ack: -1, lost: -1, release: true, holds: []int{0, 1, 2}, at: wait - time.Second},
				{ack: -1, lost: -1, release: true, holds: []int{0, 1, 2}, at: wait + time.Second, want: []clientConfirm{{seq: 1, nack: true}}},
			},
		},
		{
			name:      "a slave the publish could not reach counts until dropped",
			unreached: []int{2},
			steps: []step{
				{ack: 0, lost: -1},
				{ack: 1, lost: -1},
				{ack: -1, lost: -1, release: true, holds: []int{0, 1, 2}},
				{ack: -1, lost: -1, release: true, holds: []int{0, 1}, want: []clientConfirm{{seq: 1}}},
			},
		},
		{
			name: "every copy lost before acking: nacked once dropped",
			steps: []step{
				{ack: -1, lost: 0},
				{ack: -1, lost: 1},
				{ack: -1, lost: 2},
				{ack: -1, lost: -1, release: true, holds: nil, want: []clientConfirm{{seq: 1, nack: true}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p publisherConfirms
			quorum := []int{0, 1, 2}
			if len(tt.unreached) > 0 {
				quorum = []int{0, 1}
			}
			p.publishTo(copySet{quorum: quorum, unreached: tt.unreached, queue: orders, master: 0}, start)
			for i, s := range tt.steps {
				var got []clientConfirm
				switch {
				case s.ack >= 0:
					got = p.confirm(s.ack, 1, false, false, nil, nil)
				case s.lost >= 0:
					got = p.backendLost(s.lost, start, nil, nil)
				case s.release:
					held := func(b int, q *mirror.QueueID) bool {
						if q != orders {
							t.Errorf("step %d: held asked about %v, want orders", i, q)
						}
						return slices.Contains(s.holds, b)
					}
					got = p.release(held, start.Add(s.at-wait), nil)
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Errorf("step %d: got %+v, want %+v", i, got, s.want)
				}
			}
			if got := p.unconfirmed(); got != 0 {
				t.Errorf("unconfirmed: got %d, want 0", got)
			}
		})
	}
}
