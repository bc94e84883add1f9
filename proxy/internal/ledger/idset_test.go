package ledger

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

func TestIDSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		add  []mirror.MessageID
		del  []mirror.MessageID
		want []mirror.MessageID
	}{
		{
			name: "consecutive numbers of one prefix",
			add:  []mirror.MessageID{joinID(7, 1), joinID(7, 2), joinID(7, 3)},
			del:  []mirror.MessageID{joinID(7, 2)},
			want: []mirror.MessageID{joinID(7, 1), joinID(7, 3)},
		},
		{
			name: "the same number under two prefixes",
			add:  []mirror.MessageID{joinID(1, 5), joinID(2, 5)},
			del:  []mirror.MessageID{joinID(1, 5)},
			want: []mirror.MessageID{joinID(2, 5)},
		},
		{
			name: "an older number after the run moved up",
			add:  []mirror.MessageID{joinID(1, 1000), joinID(1, 1001), joinID(1, 3)},
			del:  []mirror.MessageID{joinID(1, 1000)},
			want: []mirror.MessageID{joinID(1, 3), joinID(1, 1001)},
		},
		{
			name: "numbers farther apart than a run spans",
			add:  []mirror.MessageID{joinID(1, 0), joinID(1, maxRunSpan*3), joinID(1, 1<<63)},
			del:  []mirror.MessageID{joinID(1, 0)},
			want: []mirror.MessageID{joinID(1, maxRunSpan*3), joinID(1, 1<<63)},
		},
		{
			name: "deleting what is not there",
			add:  []mirror.MessageID{joinID(1, 64)},
			del:  []mirror.MessageID{joinID(1, 65), joinID(1, 0), joinID(2, 64), joinID(1, 1<<40)},
			want: []mirror.MessageID{joinID(1, 64)},
		},
		{
			name: "adding twice",
			add:  []mirror.MessageID{joinID(1, 64), joinID(1, 64), joinID(1, 1<<40), joinID(1, 1<<40)},
			want: []mirror.MessageID{joinID(1, 64), joinID(1, 1<<40)},
		},
		{
			name: "a far identity the run reaches later",
			// 1<<20+64 is too far from 0 for the run, until 0 is gone and
			// the run starts again at 1<<20.
			add:  []mirror.MessageID{joinID(1, 0), joinID(1, maxRunSpan+64)},
			del:  []mirror.MessageID{joinID(1, 0)},
			want: []mirror.MessageID{joinID(1, maxRunSpan+64)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newIDSet()
			for _, id := range tc.add {
				s.Add(id)
			}
			for _, id := range tc.del {
				s.Delete(id)
			}
			checkSet(t, s, tc.want)
		})
	}
}

// TestIDSetAgainstMap runs random operations, shaped like a queue's
// deliveries (a few prefixes, numbers that mostly rise, some far off),
// on an idSet and on a map, and compares what each says, and the sets
// every 1 000 operations.
func TestIDSetAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newIDSet()
	model := make(map[mirror.MessageID]struct{})
	next := [3]uint64{0, 1 << 32, 1<<64 - 5000}
	var added []mirror.MessageID
	add := func(step int, id mirror.MessageID) {
		_, had := model[id]
		if got := s.Add(id); got == had {
			t.Fatalf("step %d: Add(%s) = %v, want %v", step, id, got, !had)
		}
		model[id] = struct{}{}
	}
	del := func(step int, id mirror.MessageID) {
		_, had := model[id]
		if got := s.Delete(id); got != had {
			t.Fatalf("step %d: Delete(%s) = %v, want %v", step, id, got, had)
		}
		delete(model, id)
	}
	for step := range 20_000 {
		switch op := rng.IntN(10); {
		case op < 5: // the next number of a prefix
			p := rng.IntN(len(next))
			id := joinID(uint64(p), next[p])
			next[p]++
			add(step, id)
			added = append(added, id)
		case op < 6: // one given back and delivered again, or far off
			var id mirror.MessageID
			if len(added) > 0 && rng.IntN(2) == 0 {
				id = added[rng.IntN(len(added))]
			} else {
				id = joinID(uint64(rng.IntN(4)), rng.Uint64())
			}
			add(step, id)
		case op < 9: // the oldest forgotten, as the record does
			if len(added) == 0 {
				continue
			}
			del(step, added[0])
			added = added[1:]
		default: // one forgotten out of order
			if len(added) == 0 {
				continue
			}
			del(step, added[rng.IntN(len(added))])
		}
		if s.Len() != len(model) {
			t.Fatalf("step %d: Len %d, want %d", step, s.Len(), len(model))
		}
		if step%1000 == 0 {
			checkSet(t, s, mapKeys(model))
		}
	}
	checkSet(t, s, mapKeys(model))
}

func mapKeys(m map[mirror.MessageID]struct{}) []mirror.MessageID {
	ids := make([]mirror.MessageID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	return ids
}

// checkSet compares s with want: Len, and what All yields.
func checkSet(t *testing.T, s *idSet, want []mirror.MessageID) {
	t.Helper()
	if s.Len() != len(want) {
		t.Fatalf("Len = %d, want %d", s.Len(), len(want))
	}
	var got []mirror.MessageID
	s.All(func(id mirror.MessageID) bool {
		got = append(got, id)
		return true
	})
	less := func(a, b mirror.MessageID) int { return slices.Compare(a[:], b[:]) }
	slices.SortFunc(got, less)
	want = slices.Clone(want)
	slices.SortFunc(want, less)
	if !slices.Equal(got, want) {
		t.Fatalf("All gave %d identities, want %d: %v, want %v", len(got), len(want), got, want)
	}
}
