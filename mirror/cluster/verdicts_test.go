package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
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
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var clusters []*Cluster
	var join []string
	for _, name := range []string{"rabbit1", "rabbit2", "rabbit3"} {
		c, err := Start(Config{
			NodeName: name, Bind: "127.0.0.1:0", RaftBind: "127.0.0.1:0", Join: join,
			DataDir: t.TempDir(), BootstrapExpect: 3, Backend: name, Logger: logger,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Shutdown()
		clusters = append(clusters, c)
		join = []string{c.LocalMember().Gossip}
	}
	testutil.Eventually(t, 15*time.Second, func() error {
		if n := len(clusters[0].Members()); n != 3 {
			return fmt.Errorf("rabbit1 sees %d members, want 3", n)
		}
		return nil
	})
	recorder := verdictRecorder{verdicts: make(chan string, 16)}
	stop := WatchMembers(clusters[0], recorder, "rabbit1")
	defer stop()

	killed := time.Now()
	clusters[2].Shutdown()
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
