package integration

// The sidecar cluster's kill acceptance (issue 9): a whole node, its proxy and its broker,
// killed with SIGKILL ten times in one run while clients publish and consume through every
// proxy.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// TestSidecarNodeKilledRepeatedly kills a whole node under load, three times (each node
// once) in the default tier and ten times in the long tier (bySize): three nodes,
// each a broker with an amqp-mirror beside it; queues nodekill_1..3 declared through
// proxies 1..3 (client-local, so each node masters one at first), mirrored on all three
// with automatic sync; through every proxy a publisher with confirms and a consumer with
// manual acks on all three queues. Each round kills the next node in turn, its proxy and
// its broker at once, while the load runs; the survivors must promote a new master for
// each queue the victim mastered, then the broker and the proxy (same config, same
// state_dir) are started again and the test waits until the victim's copies are
// synchronised slaves again. It checks:
//   - clients of the surviving proxies never see a connection or channel close, nor a
//     consumer cancelled, and every publish of theirs ends confirmed or nacked;
//   - the killed proxy's clients are disconnected, and reconnect to another proxy (this
//     test's client wrapper does that; they go back home once their node is back);
//   - every confirmed body is consumed at the end, and a message delivered again through
//     the proxy process that delivered it before carries redelivered. Through another
//     proxy it may not (docs/guarantees.md, "Not guaranteed": a proxy knows only its own
//     deliveries; after a kill a client of the killed proxy consumes through another);
//     those are counted and logged with where each delivery came from.
//
// It logs how long after each kill the first message published after it was delivered
// from a queue whose master was killed (the resume time), the confirmed count and the
// duplicates.
func TestSidecarNodeKilledRepeatedly(t *testing.T) {
	queues := []string{"nodekill_1", "nodekill_2", "nodekill_3"}
	restoreClusterOnCleanup(t)
	t.Cleanup(func() { removeLeftovers(t, queues...) })
	nodes := startKillSidecars(t, "^nodekill_")
	names := mirrorBackends()

	// nodekill_N through proxy N, client-local: mastered on node N, mirrored everywhere.
	declareSidecarQueues(t, nodes, queues)
	load := startKillLoad(t, nodes, queues)

	kills := bySize(3, 10) // each node once; the long tier goes round three more times
	var resumes []time.Duration
	began := time.Now()
	for round := range kills {
		victim := round % len(nodes.brokers)
		rows, err := listQueues(t, nodes.proxy((victim+1)%len(nodes.brokers)))
		if err != nil {
			t.Fatal(err)
		}
		var mastered []string
		for _, q := range queues {
			if rows[q].Master == names[victim] {
				mastered = append(mastered, q)
			}
		}
		roundStart := time.Now()
		nodes.beginFault()
		killedAt := nodes.kill(t, victim)

		// The survivors promote: every queue has a master other than the victim, as a
		// survivor lists it.
		survivor := nodes.proxy((victim + 1) % len(nodes.brokers))
		awaitCondition(t, 30*time.Second, func() error {
			rows, err := listQueues(t, survivor)
			if err != nil {
				return err
			}
			for _, q := range queues {
				if rows[q].Master == names[victim] || rows[q].Master == "" {
					return fmt.Errorf("%v: the victim %s is still master", rows[q], names[victim])
				}
			}
			return nil
		})
		promotedAfter := time.Since(killedAt)
		resumed, ok := load.resumedWithin(killedAt, mastered, 30*time.Second)
		if !ok {
			t.Fatalf("kill %d: no message published after the kill of node %d was delivered from %v within 30s", round+1, victim+1, mastered)
		}
		resumes = append(resumes, resumed)
		load.waitProgress(t, 100)

		booted := nodes.restart(t, victim)
		load.comeHome(victim)
		back := time.Now()
		nodes.awaitSynchronised(t, victim, queues)
		synchronised := time.Since(back)
		load.waitProgress(t, 100)
		load.fault(roundStart, time.Now())
		t.Logf("kill %d: node %d (master of %v) killed; survivors listed every master elsewhere after %v; a message published after the kill delivered after %v; broker booted in %v, then its copies synchronised slaves %v later (round %v)",
			round+1, victim+1, mastered, promotedAfter.Round(time.Millisecond), resumed.Round(time.Millisecond),
			booted.Round(time.Millisecond), synchronised.Round(time.Millisecond), time.Since(roundStart).Round(time.Millisecond))
	}
	load.finish(t)
	// Every copy goes (removeLeftovers checks), deleted through a proxy: here, since the
	// proxies started again during the test are stopped before any cleanup registered
	// before them would run.
	for _, q := range queues {
		if err := deleteThrough(nodes.proxy(0), q); err != nil {
			t.Errorf("deleting %s through proxy 1: %v", q, err)
		}
	}
	median, maximum := durationSummary(resumes)
	t.Logf("%d node kills in %v; resume after a kill (first delivery, from a queue whose master was killed, of a message published after the kill): median %v, max %v (all %v)",
		kills, time.Since(began).Round(time.Second), median.Round(time.Millisecond), maximum.Round(time.Millisecond), rounded(resumes))
}

// killSidecars are the nodes of TestSidecarNodeKilledRepeatedly and of the campaigns: the
// shared cluster's brokers and a proxy beside each, which the tests kill, stop, freeze or
// cut off, and start again. Clients read it from their goroutines, so it has a lock.
type killSidecars struct {
	brokers []*localbroker.Node
	// dialer, when set, opens a client's TCP connection to proxy i (from inside its
	// network namespace); else clients dial from the host.
	dialer func(i int) func(network, address string) (net.Conn, error)

	mu      sync.Mutex
	proxies []*cliProxy
	up      []bool // the proxy serves: false from a fault on it until it serves again
	// hits counts the faults on each proxy that may end its clients' connections
	// (killed, stopped, frozen); runs, how often its process was replaced.
	hits, runs []int
	// fault is the fault under way, which beginFault numbers; hitBy, per proxy, the
	// fault that last hit it. A client's connection may end only by the fault under way.
	fault int
	hitBy []int
}

// startKillSidecars starts a proxy beside each node of the shared cluster, as
// startSidecars does, with a policy mirroring the queues that match pattern on every
// node with automatic sync in each proxy's config file.
func startKillSidecars(t *testing.T, pattern string) *killSidecars {
	t.Helper()
	brokers := cluster.Nodes()
	binary := newCLI(t)
	var proxies []*cliProxy
	gossip := make([]string, len(brokers))
	for i := range brokers {
		gossip[i] = cliFreeAddr(t)
	}
	policy := mirrorPolicyYAML("ha-all", pattern, map[string]any{"ha-mode": "all", "ha-sync-mode": "automatic"})
	keys := newSidecarKeys(t)
	for i, n := range brokers {
		path := filepath.Join(t.TempDir(), "amqp-mirror.yaml")
		join := slices.Delete(slices.Clone(gossip), i, i+1)
		cliWriteFile(t, path, sidecarConfigYAML(t, n.Name, gossip[i], cliFreeAddr(t), join, keys)+policy)
		proxies = append(proxies, startServeProcess(t, binary, path))
	}
	s := newKillSidecars(brokers, proxies, nil)
	for i := range brokers {
		s.awaitReady(t, i)
	}
	return s
}

// newKillSidecars keeps proxies, one beside each of brokers, in the same order; dialer
// as the field's.
func newKillSidecars(brokers []*localbroker.Node, proxies []*cliProxy, dialer func(i int) func(network, address string) (net.Conn, error)) *killSidecars {
	n := len(brokers)
	up := make([]bool, n)
	for i := range up {
		up[i] = true
	}
	return &killSidecars{brokers: brokers, dialer: dialer, proxies: proxies,
		up: up, hits: make([]int, n), runs: make([]int, n), hitBy: make([]int, n)}
}

// dial connects a client to proxy i at url.
func (s *killSidecars) dial(i int, url string) (*amqp.Connection, error) {
	if s.dialer == nil {
		return amqp.Dial(url)
	}
	// amqp.Dial's heartbeat and locale, with the connection made in the namespace.
	return amqp.DialConfig(url, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US", Dial: s.dialer(i)})
}

// connect connects a client to proxy i.
func (s *killSidecars) connect(i int) (*amqp.Connection, error) {
	return s.dial(i, s.proxy(i).url("guest", "guest"))
}

// awaitReady waits until proxy i listens and knows the metadata log's leader, reads its
// addresses and admin token, and marks it up.
func (s *killSidecars) awaitReady(t *testing.T, i int) {
	t.Helper()
	p := s.proxy(i)
	awaitCondition(t, 60*time.Second, func() error {
		if p.exited() {
			return fmt.Errorf("the proxy beside %s exited with %v:\n%s", s.brokers[i].Name, p.command.ProcessState, p.stderr)
		}
		amqpLine, ok := p.record(map[string]string{"msg": "AMQP listening"})
		if !ok {
			return fmt.Errorf("the proxy beside %s does not listen yet", s.brokers[i].Name)
		}
		p.amqpAddr = amqpLine.text("addr")
		if adminLine, ok := p.record(map[string]string{"msg": "admin API listening"}); ok {
			p.adminAddr = adminLine.text("addr")
		}
		if _, ok := p.record(map[string]string{"msg": "sidecar cluster: metadata log ready"}); !ok {
			return fmt.Errorf("the proxy beside %s knows no metadata leader", s.brokers[i].Name)
		}
		return nil
	})
	settings, err := config.Load(p.configPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.token, err = config.LoadAdminToken(settings); err != nil {
		t.Fatalf("admin token of the proxy beside %s: %v", s.brokers[i].Name, err)
	}
	s.mu.Lock()
	s.up[i] = true
	s.mu.Unlock()
}

func (s *killSidecars) proxy(i int) *cliProxy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proxies[i]
}

// beginFault numbers the next fault, which hit attributes the ends of connections to.
func (s *killSidecars) beginFault() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault++
}

// faultUnderWay is the number of the fault under way, 0 before the first.
func (s *killSidecars) faultUnderWay() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fault
}

// hit marks proxy i as no longer serving, hit by the fault under way: its clients'
// connections may end. ended says its process ends too (a kill or a stop). It returns
// the process.
func (s *killSidecars) hit(i int, ended bool) *cliProxy {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.up[i] = false
	s.hits[i]++
	s.hitBy[i] = s.fault
	if ended {
		s.runs[i]++
	}
	return s.proxies[i]
}

// kill sends SIGKILL to node i's proxy and its broker, one right after the other, and
// returns when the first went. Every other proxy must still run.
func (s *killSidecars) kill(t *testing.T, i int) time.Time {
	t.Helper()
	p := s.hit(i, true)
	for j := range s.brokers {
		if q := s.proxy(j); j != i && q.exited() {
			t.Fatalf("the proxy beside %s exited by itself (%v):\n%s", s.brokers[j].Name, q.command.ProcessState, q.stderr)
		}
	}
	at := time.Now()
	if err := p.command.Process.Kill(); err != nil {
		t.Fatalf("kill -9 the proxy beside %s: %v", s.brokers[i].Name, err)
	}
	killNode(t, s.brokers[i])
	<-p.done
	return at
}

// restart starts node i's broker again, then its proxy with the same config and
// state_dir, and waits until the proxy is ready. It returns how long the broker took to
// boot, which is most of a round.
func (s *killSidecars) restart(t *testing.T, i int) time.Duration {
	t.Helper()
	began := time.Now()
	restartNode(t, s.brokers[i])
	booted := time.Since(began)
	p := startServeProcess(t, s.proxy(i).binary, s.proxy(i).configPath)
	s.mu.Lock()
	s.proxies[i] = p
	s.mu.Unlock()
	s.awaitReady(t, i)
	return booted
}

// pick is the proxy a client of home connects to: home while it serves, else the next one
// that does. It returns the proxy's process, its URL, and how often it was hit so far.
func (s *killSidecars) pick(home int) (proxyProcess, string, int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.proxies {
		i := (home + k) % len(s.proxies)
		if s.up[i] {
			return proxyProcess{node: i, run: s.runs[i]}, s.proxies[i].url("guest", "guest"), s.hits[i], true
		}
	}
	return proxyProcess{}, "", 0, false
}

// hitSince reports whether the fault under way hit proxy i since it had been hit hits
// times: a connection to it that ends then is one the fault ended.
func (s *killSidecars) hitSince(i, hits int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[i] != hits && s.hitBy[i] == s.fault
}

// awaitSynchronised waits until a proxy other than node i's lists every queue with a copy
// on every node and every slave synchronised.
func (s *killSidecars) awaitSynchronised(t *testing.T, i int, queues []string) {
	t.Helper()
	asked := s.proxy((i + 1) % len(s.brokers))
	names := mirrorBackends()
	awaitCondition(t, 90*time.Second, func() error {
		rows, err := listQueues(t, asked)
		if err != nil {
			return err
		}
		var errs []error
		for _, q := range queues {
			row := rows[q]
			if copies := slices.Sorted(slices.Values(row.copies())); !slices.Equal(copies, names) || !slices.Equal(row.SynchronisedSlaves, row.Slaves) {
				errs = append(errs, fmt.Errorf("%v; want copies on every node, every slave synchronised", row))
			}
		}
		return errors.Join(errs...)
	})
}

// killLoad is the clients of TestSidecarNodeKilledRepeatedly and what they saw. Each
// client has a home node and connects through its proxy; when the connection ends by
// itself that must be because the fault under way hit the proxy (killed, stopped or
// frozen it; anything else is a problem), and the client reconnects to the next proxy
// that serves, going back home when told.
type killLoad struct {
	nodes  *killSidecars
	queues []string
	ctx    context.Context // ends the consumers
	stop   context.CancelFunc
	// publishing ends the publishers, before the consumers, which then receive what is
	// left.
	publishing     context.Context
	stopPublishing context.CancelFunc

	clients, publishers sync.WaitGroup
	homes               []chan struct{} // per node: closed to send its clients home; replaced then

	mu          sync.Mutex
	publishedAt map[string]time.Time
	publishedTo map[string]string // body → queue
	confirmed   map[string]bool
	nacked      int
	received    map[string]int
	deliveredBy map[string]proxyProcess // body → the proxy process of its first delivery
	unflagged   []string                // repeats without redelivered through another proxy process
	// unflaggedVia counts those repeats by the fault under way (0: none) and the proxy
	// they came through.
	unflaggedVia map[faultProxy]int
	deliveries   []killDelivery
	// settles, by body, is when a round trip on the channel that acked it completed after
	// the ack, and when the delivery acked had arrived; faults, when each fault was
	// injected and when the cluster was whole again.
	settles    map[string][]ackSettle
	faults     faultWindows
	reconnects int
	refused    int      // basic.consume answered 404: the master is down, nobody promoted yet
	problems   []string // what a client should never see
}

// errMasterDown is basic.consume answered with 404 because the queue's master is down
// and no slave was promoted yet.
var errMasterDown = errors.New("the queue's master is down, nobody promoted yet")

// proxyProcess is one run of one node's proxy: its index, and how many times its process
// had ended (killed or stopped) before.
type proxyProcess struct{ node, run int }

// faultProxy is a fault by its number and a proxy by its node's index.
type faultProxy struct{ fault, node int }

func (p proxyProcess) String() string {
	return fmt.Sprintf("proxy %d (run %d)", p.node+1, p.run+1)
}

// killDelivery is one message as a consumer saw it.
type killDelivery struct {
	body        string
	via         proxyProcess
	at          time.Time
	redelivered bool
}

func newKillLoad(t *testing.T, nodes *killSidecars, queues []string) *killLoad {
	ctx, stop := context.WithCancel(context.Background())
	publishing, stopPublishing := context.WithCancel(ctx)
	l := &killLoad{
		nodes: nodes, queues: queues, ctx: ctx, stop: stop, publishing: publishing, stopPublishing: stopPublishing,
		publishedAt: map[string]time.Time{}, publishedTo: map[string]string{},
		confirmed: map[string]bool{}, received: map[string]int{}, deliveredBy: map[string]proxyProcess{}, unflaggedVia: map[faultProxy]int{}, settles: map[string][]ackSettle{},
	}
	for range nodes.brokers {
		l.homes = append(l.homes, make(chan struct{}))
	}
	// The clients end before the proxies are killed (cleanups run last first), so that
	// the end of the test is not taken for a failure.
	t.Cleanup(func() {
		stop()
		l.publishers.Wait()
		l.clients.Wait()
	})
	return l
}

// startKillLoad starts a publisher and a consumer whose home is each node,
// and waits until they move messages.
func startKillLoad(t *testing.T, nodes *killSidecars, queues []string) *killLoad {
	t.Helper()
	load := newKillLoad(t, nodes, queues)
	for i := range nodes.brokers {
		load.addClient(fmt.Sprintf("publisher%d", i+1), i, true)
		load.addClient(fmt.Sprintf("consumer%d", i+1), i, false)
	}
	load.waitProgress(t, 300)
	return load
}

func (l *killLoad) problem(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.problems = append(l.problems, fmt.Sprintf(format, args...))
}

// home is the channel that tells node i's clients to go back to it.
func (l *killLoad) home(i int) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.homes[i]
}

// comeHome sends node i's clients that connected elsewhere back to it.
func (l *killLoad) comeHome(i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.homes[i])
	l.homes[i] = make(chan struct{})
}

// addClient starts a publisher (publishing to the queues in turn, one at a time with
// confirms) or a consumer (on every queue, manual acks) of node home.
func (l *killLoad) addClient(name string, home int, publisher bool) {
	ctx, group := l.ctx, &l.clients
	if publisher {
		ctx, group = l.publishing, &l.publishers
	}
	group.Add(1)
	go func() {
		defer group.Done()
		sequence := 0
		for ctx.Err() == nil {
			process, url, hits, ok := l.nodes.pick(home)
			if !ok {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			target := process.node
			goHome := l.home(home)
			conn, err := l.nodes.dial(target, url)
			if err != nil {
				// A proxy hit between pick and dial refuses; one that serves must not.
				if !l.nodes.hitSince(target, hits) {
					l.problem("%s: connecting to proxy %d, which no fault hit: %v", name, target+1, err)
				}
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if target == home {
				goHome = nil // already there
			}
			var ended error
			if publisher {
				ended = l.publish(name, conn, &sequence, goHome)
			} else {
				ended = l.consume(name, conn, process, goHome)
			}
			conn.Close()
			if errors.Is(ended, errMasterDown) {
				// A client that reconnected while the master it consumes
				// from was down and not yet replaced (RabbitMQ answers
				// so too): it tries again.
				l.mu.Lock()
				l.refused++
				l.mu.Unlock()
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if ended != nil && ctx.Err() == nil {
				if !l.nodes.hitSince(target, hits) {
					l.problem("%s: through proxy %d, which the fault under way did not hit: %v", name, target+1, ended)
				}
				l.mu.Lock()
				l.reconnects++
				l.mu.Unlock()
			}
		}
	}()
}

// publish publishes on conn until the test ends (nil), goHome is closed (nil), or the
// connection fails (the error). A publish whose connection failed before its confirm is
// neither confirmed nor nacked: its fate is unknown, and not counted.
func (l *killLoad) publish(name string, conn *amqp.Connection, sequence *int, goHome <-chan struct{}) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm.select: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	for {
		select {
		case <-l.publishing.Done():
			return nil
		case <-goHome:
			return nil
		case err := <-closed:
			return fmt.Errorf("channel closed: %v", err)
		case <-time.After(2 * time.Millisecond): // pacing: the machine's two cores are shared
		}
		body := fmt.Sprintf("%s-%d", name, *sequence)
		queue := l.queues[*sequence%len(l.queues)]
		*sequence++
		l.mu.Lock()
		l.publishedAt[body], l.publishedTo[body] = time.Now(), queue
		l.mu.Unlock()
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
		if err != nil {
			return fmt.Errorf("publish %s: %w", body, err)
		}
		wait, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		acked, err := dc.WaitContext(wait)
		cancel()
		switch {
		case err != nil:
			return fmt.Errorf("publish %s neither confirmed nor nacked within 20s", body)
		case !acked && ch.IsClosed():
			return fmt.Errorf("channel closed with %s unconfirmed", body) // amqp091-go nacks what is pending at a close
		}
		l.mu.Lock()
		if acked {
			l.confirmed[body] = true
		} else {
			l.nacked++
		}
		l.mu.Unlock()
	}
}

// consume consumes every queue on one channel of conn with manual acks until the test
// ends, goHome is closed, or something ends the consumers (the error).
func (l *killLoad) consume(name string, conn *amqp.Connection, via proxyProcess, goHome <-chan struct{}) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	if err := ch.Qos(20, 0, false); err != nil {
		return fmt.Errorf("basic.qos: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, len(l.queues)))
	ended := make(chan error, len(l.queues)+2)
	acks := &killAcks{}
	var consumers sync.WaitGroup
	for _, q := range l.queues {
		deliveries, err := ch.Consume(q, name+"-"+q, false, false, false, false, nil)
		if err != nil {
			if code, reason := amqpErrorDetails(err); code == amqp.NotFound && strings.Contains(reason, "is down or inaccessible") {
				err = errMasterDown
			}
			conn.Close() // ends the delivery loops started so far
			consumers.Wait()
			return fmt.Errorf("basic.consume %s: %w", q, err)
		}
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			for d := range deliveries {
				body := string(d.Body)
				fault := l.nodes.faultUnderWay()
				l.mu.Lock()
				if _, published := l.publishedAt[body]; !published {
					l.problems = append(l.problems, fmt.Sprintf("%s delivered (to %s through %s) but never published", body, name, via))
				}
				if first, seen := l.deliveredBy[body]; !seen {
					l.deliveredBy[body] = via
				} else if !d.Redelivered && first == via {
					l.problems = append(l.problems, fmt.Sprintf("%s delivered again (to %s) without redelivered, both times through %s", body, name, via))
				} else if !d.Redelivered {
					l.unflagged = append(l.unflagged, fmt.Sprintf("%s (first through %s, again to %s through %s, fault %d)", body, first, name, via, fault))
					l.unflaggedVia[faultProxy{fault, via.node}]++
				}
				l.received[body]++
				at := time.Now()
				l.deliveries = append(l.deliveries, killDelivery{body: body, via: via, at: at, redelivered: d.Redelivered})
				l.mu.Unlock()
				if err := d.Ack(false); err != nil {
					ended <- fmt.Errorf("ack of %s: %w", body, err)
					return
				}
				acks.add(body, at)
			}
		}()
	}
	// Only once every basic.consume is answered: amqp091-go matches a synchronous
	// method's answer to whichever call on the channel waits.
	settling := make(chan struct{})
	stopSettling := make(chan struct{})
	go l.settle(ch, acks, stopSettling, settling)
	var result error
	select {
	case <-l.ctx.Done():
	case <-goHome:
	case err := <-closed:
		result = fmt.Errorf("channel closed: %v", err)
	case tag := <-cancelled:
		result = fmt.Errorf("consumer %s cancelled by the server", tag)
	case err := <-ended:
		result = err
	}
	conn.Close() // ends the delivery loops, and a round trip under way
	consumers.Wait()
	close(stopSettling)
	<-settling
	return result
}

// killAcks are the acks a consumer sent since its channel's last round trip.
type killAcks struct {
	mu          sync.Mutex
	bodies      []string
	deliveredAt []time.Time
}

func (a *killAcks) add(body string, deliveredAt time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bodies = append(a.bodies, body)
	a.deliveredAt = append(a.deliveredAt, deliveredAt)
}

func (a *killAcks) take() ([]string, []time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	bodies, at := a.bodies, a.deliveredAt
	a.bodies, a.deliveredAt = nil, nil
	return bodies, at
}

// settle completes a basic.qos round trip on ch every 100 ms while acks were sent, and
// records those acks settled: the proxy has them from then on. It returns, closing
// done, when stop is closed or the channel fails.
func (l *killLoad) settle(ch *amqp.Channel, acks *killAcks, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		bodies, deliveredAt := acks.take()
		if len(bodies) == 0 {
			continue
		}
		if err := ch.Qos(20, 0, false); err != nil {
			return
		}
		now := time.Now()
		l.mu.Lock()
		for i, body := range bodies {
			l.settles[body] = append(l.settles[body], ackSettle{at: now, deliveredAt: deliveredAt[i]})
		}
		l.mu.Unlock()
	}
}

// fault records a fault's window, for the check of acks that settled.
func (l *killLoad) fault(from, to time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.faults = append(l.faults, faultWindow{from, to})
}

// ackedThenRedelivered lists the deliveries of a message after one of its acks settled
// with no fault between the delivery acked and margin after the settling round trip (the
// proxy hands the settle on to the slaves' trimmers after it; l.mu held).
func (l *killLoad) ackedThenRedelivered(margin time.Duration) []string {
	var found []string
	for _, d := range l.deliveries {
		for _, s := range l.settles[d.body] {
			if d.at.After(s.at) && !l.faults.overlap(s.deliveredAt, s.at.Add(margin)) {
				found = append(found, fmt.Sprintf("%s to %s, %v after its ack settled (redelivered %v)", d.body, d.via, d.at.Sub(s.at).Round(time.Millisecond), d.redelivered))
				break
			}
		}
	}
	return found
}

func (l *killLoad) counts() (confirmed, received int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.confirmed), len(l.received)
}

// waitProgress waits until n more messages were both confirmed and received.
func (l *killLoad) waitProgress(t *testing.T, n int) {
	t.Helper()
	c0, r0 := l.counts()
	awaitCondition(t, 60*time.Second, func() error {
		if c, r := l.counts(); c < c0+n || r < r0+n {
			return fmt.Errorf("%d more confirmed, %d more received; want %d each", c-c0, r-r0, n)
		}
		return nil
	})
}

// resumedWithin waits (at most limit) until a consumer received a message published
// after at to one of queues (any queue when there are none), and says how long after at.
func (l *killLoad) resumedWithin(at time.Time, queues []string, limit time.Duration) (time.Duration, bool) {
	var took time.Duration
	err := poll(context.Background(), limit, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, d := range l.deliveries {
			if d.at.Before(at) || !l.publishedAt[d.body].After(at) {
				continue
			}
			if len(queues) == 0 || slices.Contains(queues, l.publishedTo[d.body]) {
				took = d.at.Sub(at)
				return nil // deliveries are in the order they came
			}
		}
		return errors.New("not yet")
	})
	return took, err == nil
}

// describeQueues logs, for the one who reads a failure, where the messages are: each
// queue's copies as every broker counts them, and the master and slaves a proxy lists.
func (l *killLoad) describeQueues(t *testing.T) {
	t.Helper()
	for _, b := range l.nodes.brokers {
		counts, err := b.Queues(testContext(t, 10*time.Second), "/")
		if err != nil {
			t.Logf("%s: %v", b.Name, err)
			continue
		}
		for _, q := range l.queues {
			c, ok := counts[q]
			if !ok {
				t.Logf("%s: no %s", b.Name, q)
				continue
			}
			t.Logf("%s: %s holds %d ready, %d unacknowledged", b.Name, q, c.MessagesReady, c.MessagesUnacknowledged)
		}
	}
	for i := range l.nodes.brokers {
		rows, err := listQueues(t, l.nodes.proxy(i))
		if err != nil {
			t.Logf("proxy %d: %v", i+1, err)
			continue
		}
		for _, q := range l.queues {
			t.Logf("proxy %d lists %s: %+v", i+1, q, rows[q])
		}
	}
}

// finish stops the publishers, then the consumers once every confirmed message arrived,
// and fails the test for what a client should never have seen.
func (l *killLoad) finish(t *testing.T) {
	t.Helper()
	stopped := time.Now()
	l.stopPublishing()
	l.publishers.Wait()
	// The consumers go on until every confirmed message arrived.
	err := poll(context.Background(), 60*time.Second, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		var missing []string
		for body := range l.confirmed {
			if l.received[body] == 0 {
				missing = append(missing, body)
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("%d of %d confirmed messages not received: %s", len(missing), len(l.confirmed), abbreviate(missing))
		}
		return nil
	})
	if err != nil {
		l.describeQueues(t) // while the consumers still hold what they were sent
	}
	l.stop()
	l.clients.Wait()
	if err != nil {
		t.Errorf("after the kills: %v", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.problems {
		t.Error(p)
	}
	duplicates := 0
	for _, n := range l.received {
		if n > 1 {
			duplicates++
		}
	}
	t.Logf("%d published, %d confirmed, %d nacked, %d received (%d of them more than once, always with redelivered unless reported); the clients of proxies hit by a fault reconnected %d times (%d more consumes refused while a master was down); every confirmed message received %v after publishing stopped",
		len(l.publishedAt), len(l.confirmed), l.nacked, len(l.received), duplicates, l.reconnects, l.refused, time.Since(stopped).Round(time.Millisecond))
	if len(l.unflagged) > 0 {
		t.Logf("%d delivered again without redelivered through another proxy process than the first time (not guaranteed, see docs/guarantees.md): %s",
			len(l.unflagged), strings.Join(l.unflagged, "; "))
	}
	if again := l.ackedThenRedelivered(0); len(again) > 0 {
		t.Logf("%d delivered again after an ack of theirs settled, with no fault between the delivery acked and the settling: %s",
			len(again), strings.Join(again[:min(len(again), 10)], "; "))
	}
}
