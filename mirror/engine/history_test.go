package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestHistoryKeepsTheLastPromotionsNewestFirst: the ring holds at most
// historySize promotions, lists them newest first, and measures each from
// the loss's detection to the write.
func TestHistoryKeepsTheLastPromotionsNewestFirst(t *testing.T) {
	start := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		recorded  int
		wantFirst string // the newest queue listed
		wantLast  string // the oldest queue listed
	}{
		{"none", 0, "", ""},
		{"one", 1, "q0", "q0"},
		{"full", historySize, fmt.Sprintf("q%d", historySize-1), "q0"},
		{"overwritten", historySize + 7, fmt.Sprintf("q%d", historySize+6), "q7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &history{node: "rabbit1"}
			for i := range tc.recorded {
				detected := start.Add(time.Duration(i) * time.Second)
				h.promoted(mirror.QueueID{VHost: "/", Name: fmt.Sprintf("q%d", i)},
					mirror.Promotion{From: "rabbit2", To: "rabbit3", Synchronised: true}, mirror.CauseFailure, 4, detected, detected.Add(250*time.Millisecond))
			}
			got := h.list()
			if want := min(tc.recorded, historySize); len(got) != want {
				t.Fatalf("got %d promotions, want %d", len(got), want)
			}
			if len(got) == 0 {
				return
			}
			if got[0].Queue.Name != tc.wantFirst || got[len(got)-1].Queue.Name != tc.wantLast {
				t.Errorf("got %s first and %s last, want %s and %s", got[0].Queue.Name, got[len(got)-1].Queue.Name, tc.wantFirst, tc.wantLast)
			}
			f := got[0]
			if f.Duration != 250*time.Millisecond || f.From != "rabbit2" || f.To != "rabbit3" || f.Cause != "failure" || f.Epoch != 4 || !f.Synchronised || f.Node != "rabbit1" {
				t.Errorf("got %+v, want from rabbit2 to rabbit3, cause failure, epoch 4, synchronised, 250ms, node rabbit1", f)
			}
		})
	}
}

// TestHistoryWithoutADetectionTime: a loss without a detection time counts
// from the write, never from the zero time.
func TestHistoryWithoutADetectionTime(t *testing.T) {
	h := &history{}
	now := time.Now()
	h.promoted(mirror.QueueID{Name: "q"}, mirror.Promotion{From: "a", To: "b"}, mirror.CauseShutdown, 1, time.Time{}, now)
	if got := h.list()[0]; got.Duration != 0 || !got.DetectedAt.Equal(now) {
		t.Errorf("got duration %v detected at %v, want 0 at %v", got.Duration, got.DetectedAt, now)
	}
}
