package memory

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

func testReleaser(releases *atomic.Int32) *Releaser {
	m := NewReleaser()
	m.release = func() { releases.Add(1) }
	m.drop, m.quiet, m.interval = 100, 20*time.Millisecond, 300*time.Millisecond
	return m
}

// TestMemoryReleaserStorms: a release follows a storm of closes that took the
// open connections to half their peak or below, once per storm; smaller
// drops cause none.
func TestMemoryReleaserStorms(t *testing.T) {
	tests := []struct {
		name         string
		peak, closed int64
		want         int32
	}{
		{"fewer closes than the drop", 150, 99, 0},
		{"many closes, more than half still open", 1000, 400, 0},
		{"a storm to half the peak", 400, 200, 1},
		{"everything closed", 3000, 3000, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var releases atomic.Int32
			m := testReleaser(&releases)
			defer m.Stop()
			for open := int64(1); open <= tt.peak; open++ {
				m.Opened(open)
			}
			for open := tt.peak - 1; open >= tt.peak-tt.closed; open-- {
				m.Closed(open)
			}
			if tt.want > 0 {
				testutil.Eventually(t, 5*time.Second, func() error {
					if got := releases.Load(); got != tt.want {
						return fmt.Errorf("%d releases, want %d", got, tt.want)
					}
					return nil
				})
			}
			// Nothing more comes: a release would have run after quiet.
			time.Sleep(5 * m.quiet)
			if got := releases.Load(); got != tt.want {
				t.Errorf("%d releases, want %d", got, tt.want)
			}
		})
	}
}

// TestMemoryReleaserInterval: a second storm soon after the first is released
// only once the interval since the first has passed.
func TestMemoryReleaserInterval(t *testing.T) {
	var releases atomic.Int32
	m := testReleaser(&releases)
	defer m.Stop()
	storm := func() {
		for open := int64(1); open <= 200; open++ {
			m.Opened(open)
		}
		for open := int64(199); open >= 0; open-- {
			m.Closed(open)
		}
	}
	storm()
	first := time.Now()
	testutil.Eventually(t, 5*time.Second, func() error {
		if got := releases.Load(); got != 1 {
			return fmt.Errorf("%d releases after the first storm, want 1", got)
		}
		return nil
	})
	storm()
	testutil.Eventually(t, 5*time.Second, func() error {
		if got := releases.Load(); got != 2 {
			return fmt.Errorf("%d releases after the second storm, want 2", got)
		}
		return nil
	})
	if gap := time.Since(first); gap < m.interval {
		t.Errorf("second release %v after the first, want at least the interval %v", gap, m.interval)
	}
}

// TestMemoryReleaserStop: a stopped releaser does not run a pending release.
func TestMemoryReleaserStop(t *testing.T) {
	var releases atomic.Int32
	m := testReleaser(&releases)
	for open := int64(1); open <= 200; open++ {
		m.Opened(open)
	}
	for open := int64(199); open >= 0; open-- {
		m.Closed(open)
	}
	m.Stop()
	time.Sleep(3 * m.quiet)
	if got := releases.Load(); got != 0 {
		t.Errorf("%d releases after stop, want 0", got)
	}
}
