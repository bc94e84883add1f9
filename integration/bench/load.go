package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// timestampSize is the body prefix holding the publish time, big-endian nanoseconds on
// the run's monotonic clock.
const timestampSize = 8

// confirmDrainTimeout bounds the wait for outstanding confirms after the last publish.
const confirmDrainTimeout = 10 * time.Second

// loadSpec is one throughput/latency load.
type loadSpec struct {
	scenario string
	// raw runs the load with rawClient instead of amqp091-go (see rawload.go).
	raw        bool
	publishers int
	consumers  int
	// window is how many unconfirmed messages a publisher may have; 1 waits for each.
	window int
	// rate is each publisher's messages per second; 0 publishes as fast as confirms allow.
	rate       float64
	prefetch   int
	multiAck   int
	size       int
	persistent bool
	warmup     time.Duration
	duration   time.Duration
	// queuePrefix starts the run's queue names; "" means bench-<scenario>. The mirrored
	// scenario picks it so that one target's policy matches its queues only.
	queuePrefix string
	// queueArgs are the queues' declare arguments, e.g. x-queue-type quorum.
	queueArgs amqp.Table
	// prepare, when set, runs after the queues are declared and before the load
	// starts, e.g. to wait until every mirror of them is synchronised.
	prepare func(ctx context.Context, queues []string) error
	// settle, when set, runs once the clients are gone and before the queues are
	// deleted, and waits until the work the load left behind is done (amqp-mirror's
	// trimming of the slaves): the whole run's CPU includes it.
	settle func(ctx context.Context, queues []string) error
}

// queueNames are the run's queue names, one per publisher/consumer pair.
func (s loadSpec) queueNames(id string) []string {
	prefix := s.queuePrefix
	if prefix == "" {
		prefix = "bench-" + s.scenario
	}
	queues := make([]string, max(s.publishers, s.consumers))
	for i := range queues {
		queues[i] = fmt.Sprintf("%s-%s-%d", prefix, id, i)
	}
	return queues
}

// declare declares the run's queues at url and runs prepare.
func (s loadSpec) declare(ctx context.Context, url string, queues []string) error {
	if err := declareQueues(url, queues, true, s.queueArgs); err != nil {
		return err
	}
	if s.prepare != nil {
		return s.prepare(ctx, queues)
	}
	return nil
}

// clock is a run's time line: monotonic nanoseconds since the run began, what bodies
// carry and what samples are taken on.
type clock struct{ base time.Time }

func (c clock) now() int64 { return int64(time.Since(c.base)) }

// span is the measured part of a run, on its clock.
type span struct{ from, to int64 }

func (s span) contains(t int64) bool { return t >= s.from && t < s.to }

// recorder keeps one worker's samples; only that worker touches it until the run ends.
type recorder struct {
	count     int64
	latencies []int64 // nanoseconds
}

// record counts an event at `at` with its latency if it falls in the measured span.
func (r *recorder) record(s span, at, latency int64) {
	if s.contains(at) {
		r.count++
		r.latencies = append(r.latencies, latency)
	}
}

type publisher struct {
	queue    string
	conn     *amqp.Connection
	channel  *amqp.Channel
	confirms chan amqp.Confirmation
	// sent[seq % window] is when message seq was published. At most window messages
	// are unconfirmed, so a slot is not reused before its confirm arrived.
	sent []atomic.Int64
	// tokens holds one token per unconfirmed message: publishing puts one in, a confirm
	// takes one out, so a full channel is a full window.
	tokens chan struct{}

	published int64 // publishes in the measured span
	confirmed recorder
	nacked    atomic.Int64
	listened  chan struct{} // closed when the confirm listener ended
}

type consumer struct {
	queue      string
	conn       *amqp.Connection
	channel    *amqp.Channel
	deliveries <-chan amqp.Delivery
	delivered  recorder
	all        int64 // every delivery of the run, warm-up and drain included
}

// runLoad runs spec against url and measures it. Queues are created for the run and
// deleted after it.
func runLoad(ctx context.Context, spec loadSpec, url string, procs watched) (runResult, error) {
	result := runResult{Scenario: spec.scenario}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	queues := spec.queueNames(strconv.FormatInt(time.Now().UnixNano(), 36))
	defer func() {
		if err := deleteQueues(url, queues); err != nil {
			progress("  could not delete the run's queues: %v", err)
		}
	}()

	if err := spec.declare(ctx, url, queues); err != nil {
		return result, err
	}

	var conns []*amqp.Connection
	var sockets socketSet
	// closing is set once the run closes its connections: a close the run asked for is
	// no failure, whatever error the client library reports for it.
	var closing atomic.Bool
	closeAll := func() {
		closing.Store(true)
		for _, c := range conns {
			c.Close()
		}
	}
	consumers := make([]*consumer, spec.consumers)
	for i := range consumers {
		c, err := openConsumer(url, queues[i%len(queues)], spec, i, &sockets)
		if err != nil {
			closeAll()
			return result, err
		}
		consumers[i] = c
		conns = append(conns, c.conn)
	}
	publishers := make([]*publisher, spec.publishers)
	for i := range publishers {
		p, err := openPublisher(url, queues[i%len(queues)], spec, i, &sockets)
		if err != nil {
			closeAll()
			return result, err
		}
		publishers[i] = p
		conns = append(conns, p.conn)
	}
	// A channel or connection the server closes fails the run with the server's reason.
	watch := func(what string, closed chan *amqp.Error) {
		go func() {
			if err := <-closed; err != nil && !closing.Load() {
				cancel(fmt.Errorf("%s closed by the server: %w", what, err))
			}
		}()
	}
	for i, c := range consumers {
		watch(fmt.Sprintf("consumer %d's connection", i+1), c.conn.NotifyClose(make(chan *amqp.Error, 1)))
		watch(fmt.Sprintf("consumer %d's channel", i+1), c.channel.NotifyClose(make(chan *amqp.Error, 1)))
	}
	for i, p := range publishers {
		watch(fmt.Sprintf("publisher %d's connection", i+1), p.conn.NotifyClose(make(chan *amqp.Error, 1)))
		watch(fmt.Sprintf("publisher %d's channel", i+1), p.channel.NotifyClose(make(chan *amqp.Error, 1)))
	}

	// The watchdog cuts the sockets when the run fails or overruns and the orderly end
	// does not come within a grace period: a peer that stopped reading blocks
	// amqp091-go's writes, and its Close with them.
	finished := make(chan struct{})
	watchdogDone := make(chan struct{})
	go func() {
		defer close(watchdogDone)
		overrun := time.NewTimer(spec.warmup + spec.duration + confirmDrainTimeout + 20*time.Second)
		defer overrun.Stop()
		select {
		case <-finished:
			return
		case <-overrun.C:
			cancel(errors.New("the run did not end in time; its sockets were closed"))
		case <-runCtx.Done():
		}
		grace := time.NewTimer(5 * time.Second)
		defer grace.Stop()
		select {
		case <-finished:
		case <-grace.C:
			sockets.closeAll()
		}
	}()

	wholeFrom := procs.snapshot()
	timeline := clock{base: time.Now()}
	measured := span{from: int64(spec.warmup), to: int64(spec.warmup + spec.duration)}
	window := measureCPU(runCtx, timeline, spec, procs)
	stop := window.done

	var consuming sync.WaitGroup
	for _, c := range consumers {
		consuming.Go(func() { c.consume(timeline, measured, spec.multiAck) })
	}
	var publishing sync.WaitGroup
	for i, p := range publishers {
		publishing.Go(func() {
			if err := p.publish(runCtx, timeline, measured, spec, stop); err != nil {
				cancel(fmt.Errorf("publisher %d: %w", i+1, err))
			}
		})
	}
	publishing.Wait()
	<-stop
	closeAll()
	consuming.Wait()
	for _, p := range publishers {
		<-p.listened
	}
	close(finished)
	<-watchdogDone

	if err := context.Cause(runCtx); err != nil {
		return result, err
	}
	if spec.settle != nil {
		began := time.Now()
		if err := spec.settle(ctx, queues); err != nil {
			return result, err
		}
		result.Whole.SettleSeconds = time.Since(began).Seconds()
	}
	for _, c := range consumers {
		result.Whole.Consumed += c.all
	}
	result.Whole.measure(procs, wholeFrom, procs.snapshot())
	result.Seconds = spec.duration.Seconds()
	cpuFrom, cpuTo := window.from, window.to
	result.CPU = procs.between(cpuFrom, cpuTo)
	var confirms, deliveries [][]int64
	for _, p := range publishers {
		result.Published += p.published
		result.Nacked += p.nacked.Load()
		confirms = append(confirms, p.confirmed.latencies)
	}
	for _, c := range consumers {
		result.Consumed += c.delivered.count
		deliveries = append(deliveries, c.delivered.latencies)
	}
	result.finish(cpuFrom, cpuTo, procs)
	result.Confirm = summarize(confirms...)
	result.Deliver = summarize(deliveries...)
	return result, nil
}

// finish derives the rates and the forwarder's system calls per message from the counts.
func (r *runResult) finish(cpuFrom, cpuTo cpuSnapshot, procs watched) {
	r.PublishRate = float64(r.Published) / r.Seconds
	r.ConsumeRate = float64(r.Consumed) / r.Seconds
	if procs.proxy != 0 && r.Consumed > 0 {
		r.ProxyReadsPerMessage = float64(cpuTo.proxyCalls.reads-cpuFrom.proxyCalls.reads) / float64(r.Consumed)
		r.ProxyWritesPerMessage = float64(cpuTo.proxyCalls.writes-cpuFrom.proxyCalls.writes) / float64(r.Consumed)
	}
}

// sleepUntil waits until t and reports whether ctx was still live then.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// dial opens an AMQP connection named name; with sockets set, its TCP connection is
// remembered there.
func dial(url, name string, sockets *socketSet) (*amqp.Connection, error) {
	config := amqp.Config{
		Heartbeat:  10 * time.Second,
		Properties: amqp.Table{"connection_name": name},
	}
	if sockets != nil {
		config.Dial = sockets.dialer(amqp.DefaultDial(10 * time.Second))
	}
	conn, err := amqp.DialConfig(url, config)
	if err != nil {
		return nil, fmt.Errorf("connect %s to %s: %w", name, url, err)
	}
	return conn, nil
}

// socketSet remembers TCP connections so that they can be cut.
type socketSet struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (s *socketSet) dialer(dial func(network, addr string) (net.Conn, error)) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		conn, err := dial(network, addr)
		if err == nil {
			s.mu.Lock()
			s.conns = append(s.conns, conn)
			s.mu.Unlock()
		}
		return conn, err
	}
}

func (s *socketSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}

func declareQueues(url string, queues []string, durable bool, args amqp.Table) error {
	conn, err := dial(url, "bench setup", nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q, durable, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %s: %w", q, err)
		}
	}
	return nil
}

func deleteQueues(url string, queues []string) error {
	conn, err := dial(url, "bench cleanup", nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("delete queue %s: %w", q, err)
		}
	}
	return nil
}

func openConsumer(url, queue string, spec loadSpec, i int, sockets *socketSet) (*consumer, error) {
	conn, err := dial(url, fmt.Sprintf("bench consumer %d", i+1), sockets)
	if err != nil {
		return nil, err
	}
	c := &consumer{queue: queue, conn: conn}
	if err := c.open(spec); err != nil {
		conn.Close()
		return nil, fmt.Errorf("consumer %d on %s: %w", i+1, queue, err)
	}
	return c, nil
}

func (c *consumer) open(spec loadSpec) error {
	var err error
	if c.channel, err = c.conn.Channel(); err != nil {
		return err
	}
	if err := c.channel.Qos(spec.prefetch, 0, false); err != nil {
		return err
	}
	c.deliveries, err = c.channel.Consume(c.queue, "", false, false, false, false, nil)
	return err
}

// consume takes deliveries until the connection closes.
func (c *consumer) consume(timeline clock, measured span, multiAck int) {
	var unacked int
	for d := range c.deliveries {
		c.all++
		now := timeline.now()
		if len(d.Body) >= timestampSize {
			sent := int64(binary.BigEndian.Uint64(d.Body))
			c.delivered.record(measured, now, now-sent)
		}
		// Ack errors mean the channel closed: at the end of the run, or a failure that
		// the connection's close notification reports.
		if multiAck <= 1 {
			d.Ack(false)
			continue
		}
		if unacked++; unacked == multiAck {
			d.Ack(true)
			unacked = 0
		}
	}
}

func openPublisher(url, queue string, spec loadSpec, i int, sockets *socketSet) (*publisher, error) {
	conn, err := dial(url, fmt.Sprintf("bench publisher %d", i+1), sockets)
	if err != nil {
		return nil, err
	}
	p := &publisher{
		queue:    queue,
		conn:     conn,
		sent:     make([]atomic.Int64, spec.window),
		tokens:   make(chan struct{}, spec.window),
		listened: make(chan struct{}),
	}
	if err := p.open(spec); err != nil {
		conn.Close()
		return nil, fmt.Errorf("publisher %d on %s: %w", i+1, queue, err)
	}
	return p, nil
}

func (p *publisher) open(spec loadSpec) error {
	var err error
	if p.channel, err = p.conn.Channel(); err != nil {
		return err
	}
	if err := p.channel.Confirm(false); err != nil {
		return err
	}
	// amqp091-go delivers confirms in sequence order and blocks its reader while this
	// channel is full, so it holds a whole window.
	p.confirms = p.channel.NotifyPublish(make(chan amqp.Confirmation, spec.window+1))
	return nil
}

// publish publishes until stop, then waits for the outstanding confirms. The confirm
// listener it starts ends when the channel closes.
func (p *publisher) publish(ctx context.Context, timeline clock, measured span, spec loadSpec, stop <-chan struct{}) error {
	window := uint64(len(p.sent))
	go func() {
		defer close(p.listened)
		for c := range p.confirms {
			now := timeline.now()
			p.confirmed.record(measured, now, now-p.sent[c.DeliveryTag%window].Load())
			if !c.Ack {
				p.nacked.Add(1)
			}
			<-p.tokens
		}
	}()

	body := make([]byte, spec.size)
	for i := timestampSize; i < len(body); i++ {
		body[i] = byte(i)
	}
	message := amqp.Publishing{DeliveryMode: amqp.Transient, Body: body}
	if spec.persistent {
		message.DeliveryMode = amqp.Persistent
	}
	pace := newPacer(spec.rate)
	defer pace.stop()
	for pace.wait(stop) {
		select {
		case p.tokens <- struct{}{}:
		case <-stop:
			return p.awaitConfirms(ctx)
		}
		seq := p.channel.GetNextPublishSeqNo()
		now := timeline.now()
		p.sent[seq%window].Store(now)
		binary.BigEndian.PutUint64(body, uint64(now))
		// amqp091-go writes the frames before returning, so the body can be reused.
		if err := p.channel.PublishWithContext(ctx, "", p.queue, false, false, message); err != nil {
			return err
		}
		if measured.contains(now) {
			p.published++
		}
	}
	return p.awaitConfirms(ctx)
}

// awaitConfirms waits until every published message was confirmed. Each publish put a
// token in and each confirm takes one out, so once this has put in a whole window's worth
// of its own tokens, nothing published is unconfirmed.
func (p *publisher) awaitConfirms(ctx context.Context) error {
	deadline := time.NewTimer(confirmDrainTimeout)
	defer deadline.Stop()
	for ours := 0; ours < cap(p.tokens); ours++ {
		select {
		case p.tokens <- struct{}{}:
		case <-p.listened:
			return errors.New("channel closed with confirms outstanding")
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-deadline.C:
			return fmt.Errorf("%d confirms still outstanding %v after the last publish",
				len(p.tokens)-ours, confirmDrainTimeout)
		}
	}
	return nil
}

// pacer spaces publishes at a fixed rate. It never bursts to catch up: a publish that
// is late by more than one interval restarts the schedule from now, so that a slow
// confirm shows as latency and lowers the rate instead of queueing messages behind it.
type pacer struct {
	interval time.Duration
	next     time.Time
	timer    *time.Timer
}

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	return &pacer{interval: time.Duration(float64(time.Second) / rate), next: time.Now()}
}

// wait blocks until the next publish is due and reports false if stop came first.
func (p *pacer) wait(stop <-chan struct{}) bool {
	if p.interval == 0 {
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	if late := time.Since(p.next); late > p.interval {
		p.next = time.Now()
	}
	if d := time.Until(p.next); d > 0 {
		if p.timer == nil {
			p.timer = time.NewTimer(d)
		} else {
			p.timer.Reset(d)
		}
		select {
		case <-p.timer.C:
		case <-stop:
			return false
		}
	}
	p.next = p.next.Add(p.interval)
	return true
}

func (p *pacer) stop() {
	if p.timer != nil {
		p.timer.Stop()
	}
}

// cpuWindow is the CPU of the watched processes at the start and the end of
// a run's measured time; from and to may be read once done is closed.
type cpuWindow struct {
	from, to cpuSnapshot
	done     chan struct{}
}

// measureCPU takes the snapshots in the background at the start and the end
// of the measured time (after spec.warmup, for spec.duration); done closes
// when the measured time is over, or ctx ended first.
func measureCPU(ctx context.Context, timeline clock, spec loadSpec, procs watched) *cpuWindow {
	w := &cpuWindow{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		if !sleepUntil(ctx, timeline.base.Add(spec.warmup)) {
			return
		}
		w.from = procs.snapshot()
		if !sleepUntil(ctx, timeline.base.Add(spec.warmup+spec.duration)) {
			return
		}
		w.to = procs.snapshot()
	}()
	return w
}
