package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	harness "github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// The failover scenario kills the broker holding a mirrored queue's master, -failover-kills
// times per target, under one publisher with confirms and one consumer with manual acks,
// and counts what the clients lost, saw twice or never had answered, and how long service
// took to resume. Targets: amqp-mirror (serve in front of three plain nodes, clients on the
// proxy with no reconnect logic) and native-ha (RabbitMQ's classic mirroring on a
// three-node cluster, clients that reconnect to another node and re-consume, as
// amqp091-go users must write them).

const (
	// failoverResumeTimeout bounds the wait for a message published after a kill to be
	// delivered.
	failoverResumeTimeout = 60 * time.Second
	// failoverSyncTimeout bounds the wait for the restarted node to be a synchronised
	// mirror again.
	failoverSyncTimeout = 120 * time.Second
	// failoverConfirmTimeout is how long the publisher waits for a confirm before it
	// counts the publish as unanswered and sends it again.
	failoverConfirmTimeout = 20 * time.Second
	// failoverSteady is the load between the resync and the next kill.
	failoverSteady = 2 * time.Second
	// failoverDrainTimeout bounds the wait, at the end, for every confirmed message.
	failoverDrainTimeout = 30 * time.Second
)

// failoverResult is one target's row.
type failoverResult struct {
	Target string `json:"target"`
	// KilledNodes and ResumeSeconds are per kill: the node killed (the master's) and the
	// time from the kill to the first delivery of a message first published after it.
	KilledNodes   []string  `json:"killed_nodes"`
	ResumeSeconds []float64 `json:"resume_seconds"`
	Published     int       `json:"published"` // distinct messages
	Confirmed     int       `json:"confirmed"` // distinct messages confirmed at least once
	Lost          int       `json:"lost"`      // confirmed, never delivered
	Duplicates    int       `json:"duplicates"`
	// Unanswered are publish attempts that ended neither confirmed nor nacked: their
	// channel closed, or no answer within failoverConfirmTimeout.
	Unanswered int `json:"unanswered"`
	Nacked     int `json:"nacked"`
	// Reconnects are the clients' connections opened again after a loss; ClientErrors
	// what a client without reconnect logic (amqp-mirror's) saw end its work.
	Reconnects   int      `json:"reconnects"`
	ClientErrors []string `json:"client_errors,omitempty"`
	Moves        int      `json:"moves"` // clients moved off the master's node before a kill
}

// failoverTarget is what the kill loop needs to know of a target. Its String says what it
// saw last, for an error.
type failoverTarget interface {
	fmt.Stringer
	// master returns the node holding the queue's master now.
	master(ctx context.Context) (*harness.Node, error)
	// synchronised reports whether the queue has a master and two synchronised mirrors,
	// all on running nodes.
	synchronised(ctx context.Context) (bool, error)
}

// runFailover runs the failover scenario on each target of -failover-targets. It stops
// every node and process it started before it returns, however it returns.
func runFailover(ctx context.Context, cfg config, logger *slog.Logger) (results []failoverResult, err error) {
	m := &mirroredBench{cfg: cfg, withAdmin: true}
	defer m.shutdown()
	if err := m.open(ctx, logger, "failover"); err != nil {
		return nil, err
	}
	for _, target := range cfg.failoverTargets {
		var r failoverResult
		var err error
		switch target {
		case targetMirror:
			r, err = m.failoverMirror(ctx)
		case targetNativeHA:
			r, err = m.failoverNative(ctx)
		}
		r.Target = target
		results = append(results, r)
		if err != nil {
			return results, fmt.Errorf("failover, %s: %w", target, err)
		}
	}
	return results, nil
}

// failoverMirror runs the kills against amqp-mirror serve in front of the plain nodes.
func (m *mirroredBench) failoverMirror(ctx context.Context) (failoverResult, error) {
	server, err := m.startServer(ctx)
	if err != nil {
		return failoverResult{}, err
	}
	defer func() {
		if err := server.stop(); err != nil {
			progress("  %v", err)
		}
	}()
	url := proxyURL(m.plain.Nodes()[0].URL(), server.addr)
	t := &mirrorTarget{m: m, config: m.serverConfigPath, queue: queuePrefix(targetMirror) + "-failover"}
	nodes := m.plain.Nodes()
	return m.runKills(ctx, t, nodes, []string{url}, false, t.queue)
}

// failoverNative runs the kills against the RabbitMQ cluster's classic mirroring.
func (m *mirroredBench) failoverNative(ctx context.Context) (failoverResult, error) {
	nodes := m.native.Nodes()
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.URL())
	}
	t := &nativeTarget{nodes: nodes, queue: queuePrefix(targetNativeHA) + "-failover"}
	return m.runKills(ctx, t, nodes, urls, true, t.queue)
}

// runKills declares the queue, starts the clients and kills the master's node
// -failover-kills times, each time waiting for service to resume, restarting the node and
// waiting for it to be a synchronised mirror again. urls are the client's nodes in order of
// preference; reconnect says whether the client moves to another one on a loss.
func (m *mirroredBench) runKills(ctx context.Context, t failoverTarget, nodes []*harness.Node, urls []string, reconnect bool, queue string) (failoverResult, error) {
	var result failoverResult
	// The queue is declared through the clients' first URL: on the native cluster its
	// master is then on that node (client-local), and the clients are moved off it before
	// the first kill like before any other.
	if err := declareFailoverQueue(urls[0], queue, nil); err != nil {
		return result, err
	}
	if err := awaitCondition(ctx, failoverSyncTimeout, "the queue's three copies synchronised", func() (bool, error) { return t.synchronised(ctx) }); err != nil {
		return result, fmt.Errorf("%w (%s)", err, t)
	}
	// A kill -9 soon after a declare could lose the queue on the killed node (see
	// localbroker.Node.FlushMetadata): RabbitMQ's behaviour, not what this measures.
	if err := flushAll(ctx, nodes); err != nil {
		return result, err
	}
	c := newFailoverClient(urls, queue, reconnect, m.cfg.size, 0)
	defer c.close()
	if err := c.start(ctx); err != nil {
		return result, err
	}
	if !sleepUntil(ctx, time.Now().Add(failoverSteady)) {
		return result, ctx.Err()
	}
	for kill := 1; kill <= m.cfg.failoverKills; kill++ {
		master, err := t.master(ctx)
		if err != nil {
			return result, err
		}
		if reconnect && urls[c.home()] == master.URL() {
			// Clients on the node about to die would measure a reconnect, not a failover:
			// move them, quietly (publisher paused, consumer drained), to another node.
			for i, u := range urls {
				if u != master.URL() {
					if err := c.moveTo(ctx, i); err != nil {
						return result, err
					}
					break
				}
			}
			result.Moves++
		}
		progress("  kill %d of %d: kill -9 %s (the master's node)", kill, m.cfg.failoverKills, master.Name)
		killedAt := time.Now()
		if err := master.Kill(); err != nil {
			return result, fmt.Errorf("kill %s: %w", master.Name, err)
		}
		var resumed time.Duration
		err = awaitCondition(ctx, failoverResumeTimeout, "a message published after the kill delivered", func() (bool, error) {
			at, ok := c.firstDeliveryPublishedAfter(killedAt)
			resumed = at.Sub(killedAt)
			if !ok && c.failed() {
				return false, fmt.Errorf("the clients stopped: %s", strings.Join(c.errors(), "; "))
			}
			return ok, nil
		})
		if err != nil {
			return result, fmt.Errorf("kill %d of %s: %w", kill, master.Name, err)
		}
		result.KilledNodes = append(result.KilledNodes, master.Name)
		result.ResumeSeconds = append(result.ResumeSeconds, resumed.Seconds())
		progress("    resumed %.3f s after the kill; restarting %s", resumed.Seconds(), master.Name)
		if err := master.Restart(ctx); err != nil {
			return result, fmt.Errorf("restart %s: %w", master.Name, err)
		}
		if err := awaitCondition(ctx, failoverSyncTimeout, master.Name+" a synchronised mirror again", func() (bool, error) { return t.synchronised(ctx) }); err != nil {
			return result, fmt.Errorf("%w (%s)", err, t)
		}
		if err := flushAll(ctx, nodes); err != nil {
			return result, err
		}
		if !sleepUntil(ctx, time.Now().Add(failoverSteady)) {
			return result, ctx.Err()
		}
	}
	c.stopPublishing()
	// Every confirmed message should arrive; the wait ends early when it has.
	_ = awaitCondition(ctx, failoverDrainTimeout, "every confirmed message delivered", func() (bool, error) {
		return c.undelivered() == 0, nil
	})
	c.tally(&result)
	return result, ctx.Err()
}

// declareFailoverQueue declares the durable queue at url with args, emptied of an earlier
// run's messages.
func declareFailoverQueue(url, queue string, args amqp.Table) error {
	conn, err := dial(url, "bench failover declare", nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		return fmt.Errorf("declare %s: %w", queue, err)
	}
	if _, err := ch.QueuePurge(queue, false); err != nil {
		return fmt.Errorf("purge %s: %w", queue, err)
	}
	return nil
}

func flushAll(ctx context.Context, nodes []*harness.Node) error {
	for _, n := range nodes {
		if err := n.FlushMetadata(ctx); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	return nil
}

// awaitCondition polls cond every 5 ms until it holds, fails, or timeout passes.
func awaitCondition(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	return awaitConditionEvery(ctx, timeout, 5*time.Millisecond, what, cond)
}

// awaitConditionEvery polls cond every interval until it holds, fails, or timeout passes.
func awaitConditionEvery(ctx context.Context, timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited %v for %s", timeout, what)
		}
		if !sleepUntil(ctx, time.Now().Add(interval)) {
			return ctx.Err()
		}
	}
}

// mirrorTarget asks amqp-mirror serve, through amqp-mirror ctl, where the queue's copies are.
type mirrorTarget struct {
	m      *mirroredBench
	config string
	queue  string
	last   string // the last list_queues row seen, for a timeout's message
}

type mirrorQueueRow struct {
	Name         string   `json:"name"`
	Master       string   `json:"master"`
	Slaves       []string `json:"slaves"`
	Synchronised []string `json:"synchronised_slaves"`
}

func (t *mirrorTarget) row(ctx context.Context) (mirrorQueueRow, error) {
	cmd := exec.CommandContext(ctx, t.m.binary, "ctl", "list_queues", "--config", t.config, "--formatter", "json",
		"name", "master", "slaves", "synchronised_slaves")
	out, err := cmd.Output()
	if err != nil {
		return mirrorQueueRow{}, fmt.Errorf("amqp-mirror ctl list_queues: %w: %s", err, out)
	}
	var rows []mirrorQueueRow
	if err := json.Unmarshal(out, &rows); err != nil {
		return mirrorQueueRow{}, fmt.Errorf("amqp-mirror ctl list_queues: %w: %s", err, out)
	}
	for _, r := range rows {
		if r.Name == t.queue {
			t.last = fmt.Sprintf("master %s, slaves %v, synchronised slaves %v", r.Master, r.Slaves, r.Synchronised)
			return r, nil
		}
	}
	return mirrorQueueRow{}, nil
}

func (t *mirrorTarget) String() string { return "amqp-mirror ctl said " + t.last }

func (t *mirrorTarget) master(ctx context.Context) (*harness.Node, error) {
	r, err := t.row(ctx)
	if err != nil {
		return nil, err
	}
	if n := t.m.plain.Node(r.Master); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("amqp-mirror says %s's master is %q, not a bench node", t.queue, r.Master)
}

func (t *mirrorTarget) synchronised(ctx context.Context) (bool, error) {
	r, err := t.row(ctx)
	if err != nil {
		// Between a kill and the promotion the answer may be an error: not yet.
		t.last = err.Error()
		return false, nil
	}
	names := append([]string{r.Master}, r.Synchronised...)
	if r.Master == "" || len(names) < mirroredNodes {
		return false, nil
	}
	for _, name := range names {
		if n := t.m.plain.Node(name); n == nil || !n.Running() {
			return false, nil
		}
	}
	return true, nil
}

// nativeTarget asks the RabbitMQ cluster, with rabbitmqctl on a running node.
type nativeTarget struct {
	nodes []*harness.Node
	queue string
	last  string // the last list_queues row seen, for a timeout's message
}

// row returns the Erlang node names of the queue's master and of its synchronised
// mirrors. rabbitmqctl list_queues' JSON prints pids without their node (#PID<1.2.3>),
// so the bench asks the broker itself.
func (t *nativeTarget) row(ctx context.Context) (string, []string, error) {
	expression := fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<%q>>)), `+
		`[node(amqqueue:get_pid(Q)) | [node(P) || P <- amqqueue:get_sync_slave_pids(Q)]].`, t.queue)
	var lastErr error
	for _, n := range t.nodes {
		if !n.Running() {
			continue
		}
		out, err := n.Ctl(ctx, "eval", expression)
		if err != nil {
			lastErr = err
			continue
		}
		names := parseErlangAtoms(string(out))
		t.last = fmt.Sprintf("master and synchronised mirrors %v", names)
		if len(names) == 0 {
			return "", nil, nil
		}
		return names[0], names[1:], nil
	}
	return "", nil, fmt.Errorf("no running node told where %s is: %v", t.queue, lastErr)
}

// parseErlangAtoms reads a list of quoted atoms as rabbitmqctl eval prints it, wrapped
// over lines: ['a@localhost','b@localhost',\n 'c@localhost'].
func parseErlangAtoms(out string) []string {
	list := strings.Trim(strings.Join(strings.Fields(out), ""), "[]")
	var names []string
	for name := range strings.SplitSeq(list, ",") {
		if name = strings.Trim(name, "'"); name != "" {
			names = append(names, name)
		}
	}
	return names
}

// nodeOf is the node with the Erlang name.
func (t *nativeTarget) nodeOf(erlangName string) *harness.Node {
	for _, n := range t.nodes {
		if n.ErlangName == erlangName {
			return n
		}
	}
	return nil
}

func (t *nativeTarget) String() string { return "RabbitMQ said " + t.last }

func (t *nativeTarget) master(ctx context.Context) (*harness.Node, error) {
	pid, _, err := t.row(ctx)
	if err != nil {
		return nil, err
	}
	if n := t.nodeOf(pid); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("rabbitmqctl says %s's master is %q, not on a bench node", t.queue, pid)
}

func (t *nativeTarget) synchronised(ctx context.Context) (bool, error) {
	pid, synced, err := t.row(ctx)
	if err != nil {
		// Between a kill and the promotion the answer may be an error: not yet.
		t.last = err.Error()
		return false, nil
	}
	on := map[string]bool{}
	for _, p := range append([]string{pid}, synced...) {
		if n := t.nodeOf(p); n != nil && n.Running() {
			on[n.Name] = true
		}
	}
	return len(on) == mirroredNodes, nil
}
