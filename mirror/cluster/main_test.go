package cluster

import (
	"testing"

	"go.uber.org/goleak"
)

// memberlist does not wait for its probe goroutine at Shutdown; that one
// ends within a probe interval, which a loaded machine can stretch past
// goleak's retries.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}
