// Package leaktest checks, once a package's tests have run, that they left
// no goroutine behind, as goleak.VerifyTestMain does, with more patience.
//
// goleak's own retries last about half a second. Goroutines that end only
// after the call that stops them returns (raft's connection handlers after
// its transport closes, memberlist's prober after its Shutdown) can take
// longer than that on a loaded two-core machine, and a leak check that
// fails because the machine is slow is a broken check. A goroutine that
// is really leaked is still there after Patience, and is reported with its
// stack as goleak reports it.
package leaktest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Patience is how long goroutines get to end after the last test.
const Patience = 10 * time.Second

// VerifyTestMain runs the package's tests and, when they pass, fails the
// run if goroutines are left after Patience. opts are goleak's filters.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		if err := Settle(Patience, opts...); err != nil {
			fmt.Fprintf(os.Stderr, "leaktest: goroutines left after the tests passed: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Settle waits up to patience for goroutines other than the caller's and
// those opts filter out to end, and returns goleak's report of those still
// running then, or nil.
func Settle(patience time.Duration, opts ...goleak.Option) error {
	deadline := time.Now().Add(patience)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// VerifyNone fails t if goroutines other than the caller's and those opts
// filter out are still running after Patience.
func VerifyNone(t testing.TB, opts ...goleak.Option) {
	t.Helper()
	if err := Settle(Patience, opts...); err != nil {
		t.Errorf("leaktest: goroutines left: %v", err)
	}
}
