package cluster

import (
	"context"
	"log/slog"
	"net"
	"time"
)

// minorityCheck is how often a sidecar proxy counts the members it sees.
const minorityCheck = 250 * time.Millisecond

// Pauser is what PauseInMinority stops while this proxy is in a minority:
// the proxy's clients, and the engine's record of backend losses.
type Pauser interface {
	Pause()
	Resume()
}

// PauseInMinority pauses p while this proxy sees no more than half of c's
// members alive (serf: a failed member still counts as a member), and
// resumes it when a majority is back, as RabbitMQ's pause_minority pauses
// a node. Two sides of a partition can then never both serve a mirrored
// queue: at most one side has a majority. A member serf declared failed
// whose raft port still completes a TCP handshake (answering) counts as
// alive here: it is starved, not gone or cut off. It returns when ctx
// ends.
func PauseInMinority(ctx context.Context, c *Cluster, p Pauser, logger *slog.Logger) {
	ticker := time.NewTicker(minorityCheck)
	defer ticker.Stop()
	paused, spared := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		alive, total := 0, 0
		var failed []Member
		for _, m := range c.Members() {
			switch m.Status {
			case StatusAlive:
				alive++
				total++
			case StatusFailed:
				failed = append(failed, m)
				total++
			case StatusLeaving:
				total++
			}
		}
		if 2*alive <= total {
			// With a node down, one false verdict on a live peer (a host so
			// loaded that the peer missed serf's probes for a moment) would
			// otherwise pause this proxy and disconnect its clients.
			before := alive
			alive += answering(failed)
			if !spared && !paused && 2*before <= total && 2*alive > total {
				logger.Warn("sidecar cluster: serf declares proxies failed that still answer on their raft port; not pausing", "alive", before, "answering", alive-before, "members", total)
			}
			spared = 2*alive > total
		} else {
			spared = false
		}
		minority := total > 0 && 2*alive <= total
		switch {
		case minority && !paused:
			logger.Warn("sidecar cluster: this proxy sees a minority of the proxies; pausing (clients disconnected, new ones refused) until a majority is back", "alive", alive, "members", total)
			p.Pause()
			paused = true
		case !minority && paused:
			// Not before this proxy's copy of the log has caught up: while it
			// was cut off the majority may have promoted away from its node,
			// and serving from the metadata of before would route publishes
			// and consumers to a master since replaced.
			wait, cancel := context.WithTimeout(ctx, resumeCatchUp)
			err := c.Store().WaitLeader(wait)
			cancel()
			if err != nil {
				logger.Warn("sidecar cluster: a majority of the proxies is back, but this proxy's metadata log has not caught up with the leader; staying paused", "alive", alive, "members", total, "err", err)
				continue
			}
			logger.Info("sidecar cluster: a majority of the proxies is back and the metadata log caught up; serving again", "alive", alive, "members", total)
			p.Resume()
			paused = false
		}
	}
}

// resumeCatchUp bounds one wait for the metadata log to catch up before a
// paused proxy serves again; it tries again at the next check.
const resumeCatchUp = 5 * time.Second

// answerTimeout bounds answering's handshake with one member.
const answerTimeout = 200 * time.Millisecond

// answering counts the members whose raft port completes a TCP handshake
// within answerTimeout, all asked at once. The kernel answers for the
// proxy, so a proxy that is alive but starved of CPU answers, one that is
// gone refuses, and one cut off by a partition does not answer at all.
func answering(members []Member) int {
	answers := make(chan bool, len(members))
	for _, m := range members {
		go func() {
			conn, err := net.DialTimeout("tcp", m.Raft, answerTimeout)
			if err == nil {
				conn.Close()
			}
			answers <- err == nil
		}()
	}
	count := 0
	for range members {
		if <-answers {
			count++
		}
	}
	return count
}
