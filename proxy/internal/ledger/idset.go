package ledger

import (
	"encoding/binary"
	"math/bits"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// idSet is a set of message identities laid out for how the proxy makes
// them (proxy/identity.go): a random 8-byte prefix per client connection,
// then the number of the connection's publish. A queue's deliveries are
// then runs of nearly consecutive numbers under the prefixes of the
// connections that publish to it, so the set keeps a bitmap per prefix
// over its numbers from the lowest one held. Recording a delivery, and
// forgetting it a minute later, touches a word of that bitmap, where a map
// of a hundred thousand identities took a cache miss or two in a table of
// megabytes, and grew by rehashing. Identities of any other shape are kept
// too: a number too far from its prefix's bitmap goes to a plain map.
type idSet struct {
	runs map[uint64]*idRun
	// far holds the identities no run covers.
	far map[mirror.MessageID]struct{}
	n   int
}

// idRun is one prefix's numbers: bit i of words[i/64] is number base+i.
type idRun struct {
	base  uint64 // a multiple of 64
	words []uint64
	n     int // bits set
}

// maxRunSpan bounds the numbers one run covers (128 KiB of bitmap), so
// that a prefix whose numbers reach a queue sparsely (a connection that
// publishes to many queues) costs no more than a map would.
const maxRunSpan = 1 << 20

func newIDSet() *idSet { return &idSet{runs: make(map[uint64]*idRun)} }

func splitID(id mirror.MessageID) (prefix, number uint64) {
	return binary.BigEndian.Uint64(id[:8]), binary.BigEndian.Uint64(id[8:])
}

func joinID(prefix, number uint64) mirror.MessageID {
	var id mirror.MessageID
	binary.BigEndian.PutUint64(id[:8], prefix)
	binary.BigEndian.PutUint64(id[8:], number)
	return id
}

// Len is how many identities the set holds.
func (s *idSet) Len() int { return s.n }

// Add puts id in the set, and reports whether it was not there before.
func (s *idSet) Add(id mirror.MessageID) bool {
	if _, ok := s.far[id]; ok {
		return false
	}
	prefix, number := splitID(id)
	r := s.runs[prefix]
	if r == nil {
		r = &idRun{base: number &^ 63}
		s.runs[prefix] = r
	}
	if !r.cover(number) {
		if s.far == nil {
			s.far = make(map[mirror.MessageID]struct{})
		}
		s.far[id] = struct{}{}
		s.n++
		return true
	}
	i, _ := r.index(number)
	w, bit := &r.words[i/64], uint64(1)<<(i%64)
	if *w&bit != 0 {
		return false
	}
	*w |= bit
	r.n++
	s.n++
	return true
}

// Delete takes id out of the set, and reports whether it was there.
func (s *idSet) Delete(id mirror.MessageID) bool {
	prefix, number := splitID(id)
	if r := s.runs[prefix]; r != nil {
		if i, ok := r.index(number); ok {
			if w, bit := &r.words[i/64], uint64(1)<<(i%64); *w&bit != 0 {
				*w &^= bit
				r.n--
				s.n--
				r.trim()
				if r.n == 0 {
					delete(s.runs, prefix)
				}
				return true
			}
		}
	}
	if _, ok := s.far[id]; !ok {
		return false
	}
	delete(s.far, id)
	s.n--
	return true
}

// All calls yield with each identity in the set until it returns false.
func (s *idSet) All(yield func(mirror.MessageID) bool) {
	for prefix, r := range s.runs {
		for wi, w := range r.words {
			for w != 0 {
				b := bits.TrailingZeros64(w)
				w &^= 1 << b
				if !yield(joinID(prefix, r.base+uint64(wi)*64+uint64(b))) {
					return
				}
			}
		}
	}
	for id := range s.far {
		if !yield(id) {
			return
		}
	}
}

// index is number's bit in the run, if the run covers it.
func (r *idRun) index(number uint64) (uint64, bool) {
	if number < r.base {
		return 0, false
	}
	i := number - r.base
	return i, i < uint64(len(r.words))*64
}

// cover extends the run to number, unless that would make it span more
// than maxRunSpan; it reports whether the run covers number.
func (r *idRun) cover(number uint64) bool {
	if _, ok := r.index(number); ok {
		return true
	}
	if r.n == 0 {
		r.base, r.words = number&^63, append(r.words[:0], 0)
		return true
	}
	low, high := min(r.base, number&^63), max(r.base+uint64(len(r.words))*64, (number|63)+1)
	if high-low > maxRunSpan {
		return false
	}
	words := int((high - low) / 64)
	if low < r.base {
		// An older number than the run holds (a message given back and
		// delivered again): move the words up.
		grown := make([]uint64, words, words+words/4)
		copy(grown[(r.base-low)/64:], r.words)
		r.base, r.words = low, grown
		return true
	}
	r.words = append(r.words, make([]uint64, words-len(r.words))...)
	return true
}

// trim drops the empty words at the run's start: the set forgets the
// oldest deliveries first, so the run moves up with the numbers.
func (r *idRun) trim() {
	drop := 0
	for drop < len(r.words)-1 && r.words[drop] == 0 {
		drop++
	}
	if drop == 0 {
		return
	}
	r.base += uint64(drop) * 64
	r.words = r.words[drop:]
}
