package main

import (
	"testing"
	"time"
)

// TestSummarizeSyncWindow: a window counts the publishes outstanding in it, however early
// they began and however late their confirm, and its longest delivery gap includes its
// edges, so that a queue that delivers nothing through a blocking sync shows the whole
// sync as one wait.
func TestSummarizeSyncWindow(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	confirms := []confirmSample{
		{at: at(-5), took: 2 * time.Millisecond}, // confirmed before the window: not counted
		{at: at(-3), took: time.Second},          // begun before the window, confirmed in it
		{at: at(0), took: 2 * time.Millisecond},
		{at: at(2), took: 3 * time.Millisecond},
		{at: at(4), took: 900 * time.Millisecond}, // begun in the window, confirmed after it
		{at: at(1000), took: time.Millisecond},    // begun at its end: not counted
	}
	deliveries := []time.Time{at(-1), at(100), at(102), at(700)}
	w := summarizeSyncWindow(confirms, deliveries, at(0), at(1000))
	if w.Seconds != 1 || w.Confirms != 4 {
		t.Errorf("seconds %v, confirms %d: want 1 and 4", w.Seconds, w.Confirms)
	}
	if w.ConfirmP50 != 3*time.Millisecond || w.ConfirmP99 != time.Second || w.ConfirmMax != time.Second {
		t.Errorf("confirm p50 %v, p99 %v, max %v: want 3ms, 1s, 1s", w.ConfirmP50, w.ConfirmP99, w.ConfirmMax)
	}
	if w.DeliveryGap != 598*time.Millisecond {
		t.Errorf("longest delivery gap %v, want 598ms (102 ms to 700 ms)", w.DeliveryGap)
	}
	if w.Delivered != 3 {
		t.Errorf("delivered/s %v, want 3", w.Delivered)
	}

	stalled := summarizeSyncWindow(nil, deliveries, at(800), at(2800))
	if stalled.DeliveryGap != 2*time.Second || stalled.Confirms != 0 || stalled.Delivered != 0 {
		t.Errorf("a window without deliveries: gap %v, confirms %d, delivered/s %v; want 2s, 0, 0",
			stalled.DeliveryGap, stalled.Confirms, stalled.Delivered)
	}
}

// TestSyncLedgerTally: lost are the confirmed messages never delivered; a message
// delivered but never confirmed is not lost, and a second delivery is a duplicate.
func TestSyncLedgerTally(t *testing.T) {
	l := newSyncLedger()
	for seq := range uint64(4) {
		l.confirm(seq)
	}
	l.deliver(0)
	l.deliver(1)
	l.deliver(1)
	l.deliver(9) // published, never confirmed
	confirmed, lost, duplicates := l.tally()
	if confirmed != 4 || lost != 2 || duplicates != 1 {
		t.Errorf("confirmed %d, lost %d, duplicates %d: want 4, 2, 1", confirmed, lost, duplicates)
	}
}
