package main

import (
	"testing"
	"time"
)

func TestBucketize(t *testing.T) {
	kill := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(offset time.Duration) time.Time { return kill.Add(offset) }
	ms := time.Millisecond
	deliveries := []time.Time{
		at(-301 * ms), // before the first bucket: left out
		at(-300 * ms), at(-250 * ms), at(-201 * ms),
		at(-50 * ms),
		at(150 * ms), at(199 * ms),
		at(200 * ms), // the end: left out
	}
	confirms := []failoverConfirm{
		{at(-290 * ms), 2 * ms}, {at(-280 * ms), 4 * ms}, {at(-210 * ms), 100 * ms},
		{at(160 * ms), 1500 * ms},
		{at(250 * ms), ms}, // after the end: left out
	}
	got := bucketize(kill, -300*ms, 200*ms, 100*ms, deliveries, confirms)
	want := []timelineBucketResult{
		{Start: -0.3, Delivered: 3, Confirmed: 3, ConfirmP50: 4, ConfirmP99: 100},
		{Start: -0.2},
		{Start: -0.1, Delivered: 1},
		{Start: 0},
		{Start: 0.1, Delivered: 2, Confirmed: 1, ConfirmP50: 1500, ConfirmP99: 1500},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d buckets, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("bucket %d: got %+v, want %+v", i, got[i], want[i])
		}
	}

	tl := timelineResult{BucketSeconds: 0.1, Buckets: got}
	if rate := tl.deliveryRate(got[0]); rate != 30 {
		t.Errorf("delivery rate of 3 messages in 100 ms: got %v, want 30", rate)
	}
	if from, to := timelineSpan([]timelineResult{tl}); from != -0.3 || to < 0.2-1e-9 || to > 0.2+1e-9 {
		t.Errorf("timelineSpan = %v, %v, want -0.3, 0.2", from, to)
	}
}

func TestBucketizeEmpty(t *testing.T) {
	tests := []struct {
		name            string
		from, to, width time.Duration
		want            int
	}{
		{"no width", -time.Second, time.Second, 0, 0},
		{"end before start", time.Second, -time.Second, time.Millisecond, 0},
		{"a part bucket at the end", 0, 250 * time.Millisecond, 100 * time.Millisecond, 3},
	}
	for _, tt := range tests {
		if got := bucketize(time.Now(), tt.from, tt.to, tt.width, nil, nil); len(got) != tt.want {
			t.Errorf("%s: got %d buckets, want %d", tt.name, len(got), tt.want)
		}
	}
}
