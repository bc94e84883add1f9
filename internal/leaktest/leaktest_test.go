package leaktest

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestSettle(t *testing.T) {
	tests := []struct {
		name     string
		lifetime time.Duration // how long the goroutine runs; 0: until the test ends
		patience time.Duration
		wantLeak bool
	}{
		{name: "ends within goleak's own retries", lifetime: 10 * time.Millisecond, patience: time.Second},
		{name: "ends after goleak's own retries but within patience", lifetime: 1500 * time.Millisecond, patience: 5 * time.Second},
		{name: "still running after patience", patience: 300 * time.Millisecond, wantLeak: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			others := goleak.IgnoreCurrent()
			release := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				if tc.lifetime > 0 {
					time.Sleep(tc.lifetime)
					return
				}
				<-release
			}()
			defer func() { close(release); <-done }()

			err := Settle(tc.patience, others)
			if tc.wantLeak {
				if err == nil || !strings.Contains(err.Error(), "leaktest.TestSettle") {
					t.Fatalf("Settle = %v, want a report naming the blocked goroutine", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Settle = %v, want nil once the goroutine ended", err)
			}
		})
	}
}
