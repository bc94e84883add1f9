package proxy

import (
	"reflect"
	"testing"
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
				if got := p.publish(backends...); got != uint64(i+1) {
					t.Fatalf("publish %d: got seq %d, want %d", i, got, i+1)
				}
			}
			for i, c := range tt.confirms {
				got := p.confirm(c.backend, c.seq, c.multiple, c.nack, nil)
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
		out = p.confirm(0, seq, false, false, out[:0])
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
				p.publishTo(pub[0], pub[1])
			}
			for i, s := range tt.steps {
				var got []clientConfirm
				if s.lost {
					got = p.backendLost(s.backend, nil)
				} else {
					got = p.confirm(s.backend, s.seq, s.multiple, s.nack, nil)
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
