package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	harness "github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// A timeline is the failover scenario's load (failoverClient: one publisher waiting for
// each confirm, paced at timelineRate, and one consumer with manual acks) through one
// kill -9 of the node holding the queue's master, or a quorum queue's leader, seen in
// buckets of timelineBucket: messages delivered per second and the confirms' latency. The
// report scenario charts one per target, the kill at time zero.

const (
	// timelineBucket is the width of a timeline's buckets.
	timelineBucket = 100 * time.Millisecond
	// timelineBefore is the steady load charted before the kill; timelineAfter what is
	// charted after it, at least, and at least timelineAfterResume past the resume.
	timelineBefore      = 3 * time.Second
	timelineAfter       = 7 * time.Second
	timelineAfterResume = 3 * time.Second
	// timelineSettle is the load before the charted part, after the first message went
	// through.
	timelineSettle = time.Second
	// timelineRate paces the publisher, in messages per second: below what every target
	// confirms one message at a time on two shared cores, so that all lines run level
	// before the kill and what differs is the kill's.
	timelineRate = 100
)

// timelineBucketResult is one bucket of a timeline.
type timelineBucketResult struct {
	// Start is the bucket's start, in seconds from the kill.
	Start     float64 `json:"start_seconds"`
	Delivered int     `json:"delivered"`
	// Confirmed counts the confirms that arrived in the bucket; the percentiles are of
	// their latencies, from each message's first publish attempt.
	Confirmed  int     `json:"confirmed"`
	ConfirmP50 float64 `json:"confirm_p50_ms,omitempty"`
	ConfirmP99 float64 `json:"confirm_p99_ms,omitempty"`
}

// timelineResult is one target's timeline and what its clients saw.
type timelineResult struct {
	Target        string                 `json:"target"`
	KilledNode    string                 `json:"killed_node"`
	BucketSeconds float64                `json:"bucket_seconds"`
	Buckets       []timelineBucketResult `json:"buckets"`
	// ResumeSeconds is the time from the kill to the first delivery of a message first
	// published after it.
	ResumeSeconds float64  `json:"resume_seconds"`
	Published     int      `json:"published"`
	Confirmed     int      `json:"confirmed"`
	Lost          int      `json:"lost"` // confirmed, never delivered
	Duplicates    int      `json:"duplicates"`
	Unanswered    int      `json:"unanswered"`
	Reconnects    int      `json:"reconnects"`
	ClientErrors  []string `json:"client_errors,omitempty"`
}

// deliveryRate is the bucket's messages delivered per second.
func (r timelineResult) deliveryRate(b timelineBucketResult) float64 {
	if r.BucketSeconds <= 0 {
		return 0
	}
	return float64(b.Delivered) / r.BucketSeconds
}

// bucketize counts deliveries and confirms in buckets of width from kill+from to kill+to.
// Both lists are in time order; what falls outside is left out.
func bucketize(kill time.Time, from, to, width time.Duration, deliveries []time.Time, confirms []failoverConfirm) []timelineBucketResult {
	if width <= 0 || to <= from {
		return nil
	}
	n := int((to - from + width - 1) / width)
	buckets := make([]timelineBucketResult, n)
	latencies := make([][]int64, n)
	for i := range buckets {
		buckets[i].Start = (from + time.Duration(i)*width).Seconds()
	}
	index := func(at time.Time) (int, bool) {
		offset := at.Sub(kill) - from
		if offset < 0 || offset >= to-from {
			return 0, false
		}
		return int(offset / width), true
	}
	for _, at := range deliveries {
		if i, ok := index(at); ok {
			buckets[i].Delivered++
		}
	}
	for _, c := range confirms {
		if i, ok := index(c.at); ok {
			buckets[i].Confirmed++
			latencies[i] = append(latencies[i], int64(c.latency))
		}
	}
	for i, l := range latencies {
		if len(l) > 0 {
			slices.Sort(l)
			buckets[i].ConfirmP50 = ms(percentile(l, 0.50))
			buckets[i].ConfirmP99 = ms(percentile(l, 0.99))
		}
	}
	return buckets
}

// runTimeline runs one timeline: the queue declared with args at urls[0] and synchronised,
// the clients started (moved off the master's node when they reconnect, as in runKills),
// the master's node killed after timelineBefore of steady load, the load kept up until
// the charted time after the kill is over, then the node restarted and the queue deleted.
func (m *mirroredBench) runTimeline(ctx context.Context, t failoverTarget, nodes []*harness.Node, urls []string, reconnect bool, queue string, args amqp.Table) (timelineResult, error) {
	result := timelineResult{BucketSeconds: timelineBucket.Seconds()}
	if err := declareFailoverQueue(urls[0], queue, args); err != nil {
		return result, err
	}
	if err := awaitCondition(ctx, failoverSyncTimeout, "the queue's three copies synchronised", func() (bool, error) { return t.synchronised(ctx) }); err != nil {
		return result, fmt.Errorf("%w (%s)", err, t)
	}
	if err := flushAll(ctx, nodes); err != nil {
		return result, err
	}
	c := newFailoverClient(urls, queue, reconnect, m.cfg.size, timelineRate)
	defer c.close()
	if err := c.start(ctx); err != nil {
		return result, err
	}
	master, err := t.master(ctx)
	if err != nil {
		return result, err
	}
	if reconnect && urls[c.home()] == master.URL() {
		for i, u := range urls {
			if u != master.URL() {
				if err := c.moveTo(ctx, i); err != nil {
					return result, err
				}
				break
			}
		}
	}
	// The clients' connections open (again, after a move) at their own pace on a busy
	// machine: the charted steady load starts once a message goes through.
	through := time.Now()
	err = awaitCondition(ctx, failoverResumeTimeout, "a first message through", func() (bool, error) {
		_, ok := c.firstDeliveryPublishedAfter(through)
		if !ok && c.failed() {
			return false, fmt.Errorf("the clients stopped: %v", c.errors())
		}
		return ok, nil
	})
	if err != nil {
		return result, err
	}
	if !sleepUntil(ctx, time.Now().Add(timelineSettle+timelineBefore)) {
		return result, ctx.Err()
	}

	progress("  kill -9 %s (the master's node)", master.Name)
	killedAt := time.Now()
	if err := master.Kill(); err != nil {
		return result, fmt.Errorf("kill %s: %w", master.Name, err)
	}
	result.KilledNode = master.Name
	var resumed time.Duration
	err = awaitCondition(ctx, failoverResumeTimeout, "a message published after the kill delivered", func() (bool, error) {
		at, ok := c.firstDeliveryPublishedAfter(killedAt)
		resumed = at.Sub(killedAt)
		if !ok && c.failed() {
			return false, fmt.Errorf("the clients stopped: %v", c.errors())
		}
		return ok, nil
	})
	if err != nil {
		return result, fmt.Errorf("after the kill of %s: %w", master.Name, err)
	}
	result.ResumeSeconds = resumed.Seconds()
	progress("    resumed %.3f s after the kill", resumed.Seconds())
	after := max(timelineAfter, resumed+timelineAfterResume)
	if !sleepUntil(ctx, killedAt.Add(after)) {
		return result, ctx.Err()
	}
	c.stopPublishing()
	_ = awaitCondition(ctx, failoverDrainTimeout, "every confirmed message delivered", func() (bool, error) {
		return c.undelivered() == 0, nil
	})
	deliveries, confirms := c.samples()
	result.Buckets = bucketize(killedAt, -timelineBefore, after, timelineBucket, deliveries, confirms)
	var tally failoverResult
	c.tally(&tally)
	result.Published, result.Confirmed, result.Lost = tally.Published, tally.Confirmed, tally.Lost
	result.Duplicates, result.Unanswered, result.Reconnects = tally.Duplicates, tally.Unanswered, tally.Reconnects
	result.ClientErrors = tally.ClientErrors
	// The clients end before the restart, which takes seconds; the deferred close then
	// has nothing left to do.
	c.close()

	// The next timeline on these nodes needs all three.
	progress("    restarting %s", master.Name)
	if err := master.Restart(ctx); err != nil {
		return result, fmt.Errorf("restart %s: %w", master.Name, err)
	}
	if err := deleteQueues(urls[0], []string{queue}); err != nil {
		return result, err
	}
	return result, ctx.Err()
}

// timelineMirror runs a timeline on amqp-mirror serve in front of the plain nodes, its
// clients without reconnect logic.
func (m *mirroredBench) timelineMirror(ctx context.Context) (timelineResult, error) {
	m.withAdmin = true
	server, err := m.startServer(ctx)
	if err != nil {
		return timelineResult{}, err
	}
	defer func() {
		if err := server.stop(); err != nil {
			progress("  %v", err)
		}
	}()
	url := proxyURL(m.plain.Nodes()[0].URL(), server.addr)
	t := &mirrorTarget{m: m, config: m.serverConfigPath, queue: queuePrefix(targetMirror) + "-timeline"}
	return m.runTimeline(ctx, t, m.plain.Nodes(), []string{url}, false, t.queue, nil)
}

// timelineNative runs a timeline on the RabbitMQ cluster: classic mirroring, or with
// quorum a quorum queue. Its clients reconnect.
func (m *mirroredBench) timelineNative(ctx context.Context, quorum bool) (timelineResult, error) {
	nodes := m.native.Nodes()
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.URL())
	}
	if quorum {
		t := &quorumTarget{nodes: nodes, queue: queuePrefix(targetQuorum) + "-timeline"}
		return m.runTimeline(ctx, t, nodes, urls, true, t.queue, amqp.Table{"x-queue-type": "quorum"})
	}
	t := &nativeTarget{nodes: nodes, queue: queuePrefix(targetNativeHA) + "-timeline"}
	return m.runTimeline(ctx, t, nodes, urls, true, t.queue, nil)
}

// quorumTarget is a quorum queue on the RabbitMQ cluster: its master is its leader, and
// it is synchronised when its three members are online.
type quorumTarget struct {
	nodes []*harness.Node
	queue string
	last  string // what RabbitMQ said last, for a timeout's message
}

func (t *quorumTarget) String() string { return "RabbitMQ said " + t.last }

// running is a node of the cluster that runs, to ask.
func (t *quorumTarget) running() (*harness.Node, error) {
	for _, n := range t.nodes {
		if n.Running() {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no node of the cluster runs to tell where %s is", t.queue)
}

func (t *quorumTarget) master(ctx context.Context) (*harness.Node, error) {
	node, err := t.running()
	if err != nil {
		return nil, err
	}
	// A quorum queue's pid is {RaName, LeaderNode}.
	expression := fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<%q>>)), `+
		`{_, Leader} = amqqueue:get_pid(Q), [Leader].`, t.queue)
	out, err := node.Ctl(ctx, "eval", expression)
	if err != nil {
		return nil, err
	}
	names := parseErlangAtoms(string(out))
	t.last = fmt.Sprintf("leader %v", names)
	for _, n := range t.nodes {
		if len(names) == 1 && n.ErlangName == names[0] {
			return n, nil
		}
	}
	return nil, fmt.Errorf("rabbitmqctl says %s's leader is %v, not a bench node", t.queue, names)
}

func (t *quorumTarget) synchronised(ctx context.Context) (bool, error) {
	node, err := t.running()
	if err != nil {
		return false, err
	}
	copies, err := nativeCopies(ctx, node, []string{t.queue}, "online", 0)
	if err != nil {
		// Between a kill and the election the answer may be an error: not yet.
		t.last = err.Error()
		return false, nil
	}
	t.last = fmt.Sprintf("%d members online", copies)
	return copies >= mirroredNodes, nil
}

// timelineSpan bounds the charted time of the timelines, in seconds from the kill.
func timelineSpan(timelines []timelineResult) (from, to float64) {
	first := true
	for _, tl := range timelines {
		if len(tl.Buckets) == 0 {
			continue
		}
		start := tl.Buckets[0].Start
		end := tl.Buckets[len(tl.Buckets)-1].Start + tl.BucketSeconds
		if first || start < from {
			from = start
		}
		if first || end > to {
			to = end
		}
		first = false
	}
	return from, to
}
