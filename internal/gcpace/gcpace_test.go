package gcpace

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	cases := []struct {
		name           string
		live, headroom uint64
		want           int
	}{
		{"before the first collection", 0, 64 * mib, 2000},
		{"tiny heap: capped", 16 << 10, 64 * mib, 2000},
		{"small heap: the headroom", 16 * mib, 64 * mib, 400},
		{"heap as large as the headroom", 64 * mib, 64 * mib, 100},
		{"heap beyond the headroom: Go's default", 300 * mib, 64 * mib, 100},
		{"no headroom: Go's default", 16 * mib, 0, 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Percent(c.live, c.headroom); got != c.want {
				t.Errorf("Percent(%d, %d) = %d, want %d", c.live, c.headroom, got, c.want)
			}
		})
	}
}

func TestWanted(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"nothing set", nil, true},
		{"GOGC set", map[string]string{"GOGC": "200"}, false},
		{"GOGC off", map[string]string{"GOGC": "off"}, false},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "1GiB"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Wanted(func(k string) string { return c.env[k] }); got != c.want {
				t.Errorf("Wanted = %v, want %v", got, c.want)
			}
		})
	}
}

func TestPaceSetsAndRestoresGOGC(t *testing.T) {
	before := Current()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { Pace(ctx, 1<<40, 5*time.Millisecond) })
	// A terabyte of headroom over this test's heap asks for the cap.
	deadline := time.Now().Add(10 * time.Second)
	for Current() != maxPercent {
		if time.Now().After(deadline) {
			cancel()
			wg.Wait()
			t.Fatalf("GOGC is %d after 10 s of pacing, want %d", Current(), maxPercent)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	wg.Wait()
	if got := Current(); got != before {
		t.Errorf("GOGC after Pace returned = %d, want %d as before", got, before)
	}
}
