package cluster

import (
	"context"
	"time"
)

// memberCheck is how often a sidecar proxy hands serf's verdicts on the
// other proxies to its engine: serf's own detection takes about a second
// (this package's doc), this adds at most a tenth of that.
const memberCheck = 100 * time.Millisecond

// memberFailedFor is how long serf must hold a proxy failed before its
// node counts as failed. On an overloaded host serf declares live proxies
// failed now and then and they refute it within a few hundred
// milliseconds (seen: 0.1-0.3 s under a load of 40 on two cores); acting
// on those would move masters away from healthy nodes. A real failure
// stays, and is acted on about half a second after serf's verdict.
const memberFailedFor = 500 * time.Millisecond

// MemberVerdicts receives WatchMembers' verdicts, by backend name (the
// engine: engine.Member.MemberFailed, MemberAlive).
type MemberVerdicts interface {
	MemberFailed(backend string)
	MemberAlive(backend string)
}

// WatchMembers hands serf's verdicts on the proxies other than self to
// verdicts until stop is called: a proxy serf holds failed for
// memberFailedFor means its node (proxy and broker) failed, so its backend
// counts as down on every survivor, and as the backend watcher sees it
// again once serf sees the proxy alive. A member that left gracefully or
// was forgotten leaves the verdict to the watcher.
func WatchMembers(c *Cluster, verdicts MemberVerdicts, self string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(memberCheck)
		defer ticker.Stop()
		failedSince := map[string]time.Time{} // serf holds them failed, since
		reported := map[string]bool{}         // told the engine they failed
		for {
			now := time.Now()
			failedNow := map[string]bool{}
			for _, m := range c.Members() {
				if m.Name != self && m.Backend != "" && m.Status == StatusFailed {
					failedNow[m.Backend] = true
					if _, ok := failedSince[m.Backend]; !ok {
						failedSince[m.Backend] = now
					}
				}
			}
			for backend := range failedSince {
				if !failedNow[backend] { // alive again, left, or forgotten
					delete(failedSince, backend)
				}
			}
			for backend, since := range failedSince {
				if !reported[backend] && now.Sub(since) >= memberFailedFor {
					verdicts.MemberFailed(backend)
					reported[backend] = true
				}
			}
			for backend := range reported {
				if _, failed := failedSince[backend]; !failed {
					verdicts.MemberAlive(backend)
					delete(reported, backend)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
