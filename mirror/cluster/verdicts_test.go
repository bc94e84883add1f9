package cluster

import (
	"strings"
	"testing"
	"time"
)

// verdictRecorder records what WatchMembers hands the engine.
type verdictRecorder struct{ verdicts chan string }

func (r verdictRecorder) MemberFailed(backend string) { r.record("failed " + backend) }
func (r verdictRecorder) MemberAlive(backend string)  { r.record("alive " + backend) }

// record never blocks: WatchMembers must stop when the test ends.
func (r verdictRecorder) record(v string) {
	select {
	case r.verdicts <- v:
	default:
	}
}

// A proxy killed without leaving is reported failed, by its backend's
// name, within about a second of serf noticing; the proxy itself and the
// live ones are never reported.
func TestWatchMembersReportsAFailedProxy(t *testing.T) {
	nodes := startCluster(t, 3)
	recorder := verdictRecorder{verdicts: make(chan string, 16)}
	stop := WatchMembers(nodes[0].Cluster, recorder, "rabbit1")
	defer stop()

	killed := time.Now()
	nodes[2].Shutdown()
	// On a loaded host serf may also suspect a live proxy for a moment
	// (failed, then alive again); that is logged, not an error.
	deadline := time.After(10 * time.Second)
	for reported := false; !reported; {
		select {
		case got := <-recorder.verdicts:
			switch {
			case got == "failed rabbit3":
				reported = true
				t.Logf("rabbit3 reported failed %v after its proxy stopped", time.Since(killed))
			case strings.HasSuffix(got, " rabbit1"):
				t.Fatalf("the proxy's own node reported: %q", got)
			default:
				t.Logf("verdict on a live proxy under load: %q", got)
			}
		case <-deadline:
			t.Fatal("rabbit3 not reported failed within 10s of its proxy stopping")
		}
	}
}
