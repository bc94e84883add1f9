package testutil

import (
	"errors"
	"testing"
	"time"
)

func TestEventuallyWaitsAtLeastAsLongAsTheCheckTook(t *testing.T) {
	cases := []struct {
		name    string
		check   time.Duration // how long each call of f takes
		minimum time.Duration // the least gap wanted between the starts of two calls
	}{
		// The backoff alone starts at 10 ms: a quick check is retried soon.
		{name: "quick check", check: 0, minimum: 10 * time.Millisecond},
		// A check longer than the backoff's ceiling is followed by as long a wait.
		{name: "slow check", check: 300 * time.Millisecond, minimum: 600 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var starts []time.Time
			Eventually(t, time.Minute, func() error {
				starts = append(starts, time.Now())
				time.Sleep(c.check)
				if len(starts) < 3 {
					return errors.New("not yet")
				}
				return nil
			})
			if len(starts) != 3 {
				t.Fatalf("calls: got %d, want 3", len(starts))
			}
			for i := 1; i < len(starts); i++ {
				if gap := starts[i].Sub(starts[i-1]); gap < c.minimum {
					t.Errorf("call %d began %v after call %d, want at least %v", i+1, gap, i, c.minimum)
				}
			}
		})
	}
}
