package proxy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestDeclaredQueues: a connection lists the unrecorded queues it declared
// while the link they were declared on is open, not after the client
// deleted them, and at most maxDeclared, the newest.
func TestDeclaredQueues(t *testing.T) {
	home := newLink(1, "rabbit2", 1, nil)
	reopened := newLink(1, "rabbit2", 2, nil)
	other := newLink(2, "rabbit3", 1, nil)
	links := []*link{nil, home, other}
	queue := func(name, backend string, exclusive bool) mirror.UnrecordedQueue {
		return mirror.UnrecordedQueue{ID: mirror.QueueID{VHost: "/", Name: name}, Backend: backend, Exclusive: exclusive}
	}
	tests := []struct {
		name  string
		setup func(d *declaredQueues)
		links []*link
		want  []mirror.UnrecordedQueue
	}{
		{"none", func(d *declaredQueues) {}, links, nil},
		{"exclusive and server-named", func(d *declaredQueues) {
			d.add("reply", home, true)
			d.add("amq.gen-1", home, false)
		}, links, []mirror.UnrecordedQueue{queue("amq.gen-1", "rabbit2", false), queue("reply", "rabbit2", true)}},
		{"declared again after a rehome", func(d *declaredQueues) {
			d.add("reply", home, true)
			d.add("reply", other, true)
		}, links, []mirror.UnrecordedQueue{queue("reply", "rabbit3", true)}},
		{"deleted", func(d *declaredQueues) {
			d.add("reply", home, true)
			d.add("kept", home, true)
			d.forget("reply")
		}, links, []mirror.UnrecordedQueue{queue("kept", "rabbit2", true)}},
		{"link lost", func(d *declaredQueues) {
			d.add("reply", home, true)
			d.add("there", other, true)
		}, []*link{nil, nil, other}, []mirror.UnrecordedQueue{queue("there", "rabbit3", true)}},
		{"link lost and opened again", func(d *declaredQueues) {
			d.add("reply", home, true)
		}, []*link{nil, reopened, other}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d declaredQueues
			tt.setup(&d)
			got := sortedQueues(d.appendLive("/", tt.links, nil))
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}

	t.Run("bounded, the oldest pushed out", func(t *testing.T) {
		var d declaredQueues
		for i := range maxDeclared + 10 {
			d.add(fmt.Sprintf("q%05d", i), home, true)
		}
		got := sortedQueues(d.appendLive("/", links, nil))
		if len(got) != maxDeclared || got[0].ID.Name != "q00010" {
			t.Errorf("got %d queues from %v, want %d from q00010", len(got), got[0].ID.Name, maxDeclared)
		}
	})
}

func sortedQueues(qs []mirror.UnrecordedQueue) []mirror.UnrecordedQueue {
	slices.SortFunc(qs, func(a, b mirror.UnrecordedQueue) int { return strings.Compare(a.ID.Name, b.ID.Name) })
	return qs
}
