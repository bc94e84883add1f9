package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// failoverClient is one publisher (one message at a time, waiting for its confirm) and one
// consumer (prefetch 20, an ack per message), each on its own connection. With reconnect,
// each of them, on losing its channel, connects to the next node that answers, starting
// with its home node, and goes on: the publisher sends again what was not confirmed, the
// consumer consumes again. Without, a loss ends it and is recorded as an error.
type failoverClient struct {
	urls      []string
	queue     string
	reconnect bool
	size      int
	// rate paces the publisher, in messages per second at most; with 0 it pauses a
	// millisecond after each answer.
	rate float64

	ctx     context.Context // ends both loops
	cancel  context.CancelFunc
	pubStop context.CancelFunc // ends the publisher alone
	pubCtx  context.Context
	loops   sync.WaitGroup
	// publishing is held by the publisher around each publish and its confirm, and by a
	// move, which pauses it.
	publishing sync.Mutex

	mu          sync.Mutex
	homeIndex   int
	conns       map[*amqp.Connection]bool
	publishedAt []time.Time // by sequence number, the first attempt
	confirmed   map[int]bool
	received    map[int]int
	deliveries  []failoverDelivery
	confirms    []failoverConfirm
	unanswered  int
	nacked      int
	reconnects  int
	clientErrs  []string
	stopped     int // loops that ended on an error
}

type failoverDelivery struct {
	seq int
	at  time.Time
}

// failoverConfirm is a confirm's arrival and its latency from the message's first publish
// attempt: what a client that must send a message sees, resends included.
type failoverConfirm struct {
	at      time.Time
	latency time.Duration
}

func newFailoverClient(urls []string, queue string, reconnect bool, size int, rate float64) *failoverClient {
	ctx, cancel := context.WithCancel(context.Background())
	pubCtx, pubStop := context.WithCancel(ctx)
	return &failoverClient{
		urls: urls, queue: queue, reconnect: reconnect, size: max(size, 16), rate: rate,
		ctx: ctx, cancel: cancel, pubCtx: pubCtx, pubStop: pubStop,
		conns: map[*amqp.Connection]bool{}, confirmed: map[int]bool{}, received: map[int]int{},
	}
}

// start connects both clients and starts their loops.
func (c *failoverClient) start(ctx context.Context) error {
	pubConn, pubCh, err := c.connectPublisher(ctx)
	if err != nil {
		return err
	}
	conConn, deliveries, err := c.connectConsumer(ctx)
	if err != nil {
		return err
	}
	c.loops.Add(2)
	go c.publish(pubConn, pubCh)
	go c.consume(conConn, deliveries)
	return nil
}

func (c *failoverClient) home() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.homeIndex
}

// dialAny connects to the home node, or the next one that answers.
func (c *failoverClient) dialAny(ctx context.Context, name string) (*amqp.Connection, error) {
	for {
		home := c.home()
		var errs []error
		for i := range c.urls {
			conn, err := dial(c.urls[(home+i)%len(c.urls)], name, nil)
			if err == nil {
				c.mu.Lock()
				c.conns[conn] = true
				c.mu.Unlock()
				return conn, nil
			}
			errs = append(errs, err)
			if !c.reconnect {
				return nil, err
			}
		}
		// Every node refused: a client backs off a little and tries again.
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return nil, errors.Join(append(errs, ctx.Err())...)
		}
	}
}

func (c *failoverClient) connectPublisher(ctx context.Context) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := c.dialAny(ctx, "bench failover publisher")
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("publisher channel: %w", err)
	}
	return conn, ch, nil
}

func (c *failoverClient) connectConsumer(ctx context.Context) (*amqp.Connection, <-chan amqp.Delivery, error) {
	conn, err := c.dialAny(ctx, "bench failover consumer")
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(20, 0, false)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(c.queue, "bench-failover", false, false, false, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("consumer channel: %w", err)
	}
	return conn, deliveries, nil
}

// fail records why a loop ended.
func (c *failoverClient) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clientErrs = append(c.clientErrs, fmt.Sprintf(format, args...))
	c.stopped++
}

func (c *failoverClient) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped > 0
}

func (c *failoverClient) errors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.clientErrs)
}

func (c *failoverClient) forget(conn *amqp.Connection) {
	conn.Close()
	c.mu.Lock()
	delete(c.conns, conn)
	c.mu.Unlock()
}

// publish sends message after message, each once confirmed (or nacked, or unanswered:
// then the same message again).
func (c *failoverClient) publish(conn *amqp.Connection, ch *amqp.Channel) {
	defer c.loops.Done()
	defer func() { c.forget(conn) }()
	body := make([]byte, c.size)
	seq := -1
	resend := false
	pace := newPacer(c.rate)
	defer pace.stop()
	for c.pubCtx.Err() == nil {
		c.publishing.Lock()
		if ch.IsClosed() && c.reconnect {
			// Closed by a move while the publisher waited, with nothing outstanding.
			c.publishing.Unlock()
			c.forget(conn)
			var err error
			if conn, ch, err = c.connectPublisher(c.pubCtx); err != nil {
				if c.pubCtx.Err() == nil {
					c.fail("publisher reconnect: %v", err)
				}
				return
			}
			c.mu.Lock()
			c.reconnects++
			c.mu.Unlock()
			continue
		}
		if !resend {
			c.mu.Lock()
			seq = len(c.publishedAt)
			c.publishedAt = append(c.publishedAt, time.Now())
			c.mu.Unlock()
		}
		copy(body, strconv.Itoa(seq)+" ")
		outcome, err := c.publishOne(ch, body)
		c.publishing.Unlock()
		c.mu.Lock()
		switch outcome {
		case "confirmed":
			c.confirmed[seq] = true
			now := time.Now()
			c.confirms = append(c.confirms, failoverConfirm{at: now, latency: now.Sub(c.publishedAt[seq])})
		case "nacked":
			c.nacked++
		default:
			c.unanswered++
		}
		c.mu.Unlock()
		resend = outcome != "confirmed"
		if err == nil {
			// Pacing, so that the client leaves the machine's two cores to the brokers.
			if c.rate > 0 {
				pace.wait(c.pubCtx.Done())
			} else {
				time.Sleep(time.Millisecond)
			}
			continue
		}
		if !c.reconnect {
			c.fail("publisher: %v", err)
			return
		}
		c.forget(conn)
		var cerr error
		if conn, ch, cerr = c.connectPublisher(c.pubCtx); cerr != nil {
			if c.pubCtx.Err() == nil {
				c.fail("publisher reconnect: %v", cerr)
			}
			return
		}
		c.mu.Lock()
		c.reconnects++
		c.mu.Unlock()
	}
}

// publishOne publishes body and waits for its answer: confirmed, nacked or unanswered.
// The error says the channel is gone.
func (c *failoverClient) publishOne(ch *amqp.Channel, body []byte) (string, error) {
	dc, err := ch.PublishWithDeferredConfirmWithContext(c.ctx, "", c.queue, false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
	if err != nil {
		return "unanswered", err
	}
	wait, cancel := context.WithTimeout(c.ctx, failoverConfirmTimeout)
	defer cancel()
	ok, err := dc.WaitContext(wait)
	switch {
	case err != nil:
		return "unanswered", nil // a live channel with no answer: send it again
	case ok:
		return "confirmed", nil
	case ch.IsClosed():
		// amqp091-go answers every pending confirm with false when the channel closes.
		return "unanswered", errors.New("channel closed while waiting for a confirm")
	}
	return "nacked", nil
}

// consume records and acks each delivery.
func (c *failoverClient) consume(conn *amqp.Connection, deliveries <-chan amqp.Delivery) {
	defer c.loops.Done()
	defer func() { c.forget(conn) }()
	for {
		for d := range deliveries {
			now := time.Now()
			seq, err := strconv.Atoi(strings.TrimRight(strings.SplitN(string(d.Body), " ", 2)[0], "\x00"))
			if err == nil {
				c.mu.Lock()
				c.received[seq]++
				c.deliveries = append(c.deliveries, failoverDelivery{seq: seq, at: now})
				c.mu.Unlock()
			}
			d.Ack(false) // an ack lost with its channel is the broker's to redeliver
		}
		if c.ctx.Err() != nil {
			return
		}
		if !c.reconnect {
			c.fail("consumer: its channel closed")
			return
		}
		c.forget(conn)
		var err error
		if conn, deliveries, err = c.connectConsumer(c.ctx); err != nil {
			if c.ctx.Err() == nil {
				c.fail("consumer reconnect: %v", err)
			}
			return
		}
		c.mu.Lock()
		c.reconnects++
		c.mu.Unlock()
	}
}

// moveTo makes node i the clients' home and moves them there: the publisher pauses, the
// consumer receives everything confirmed, then both connections close and the loops
// reconnect, to the new home. Not counted as reconnects.
func (c *failoverClient) moveTo(ctx context.Context, i int) error {
	c.publishing.Lock()
	defer c.publishing.Unlock()
	if err := awaitCondition(ctx, failoverDrainTimeout, "the consumer drained before a move", func() (bool, error) {
		return c.undelivered() == 0, nil
	}); err != nil {
		return err
	}
	// Acks are written before the connection.close that follows them on the same socket.
	time.Sleep(50 * time.Millisecond)
	c.mu.Lock()
	c.homeIndex = i
	conns := make([]*amqp.Connection, 0, len(c.conns))
	for conn := range c.conns {
		conns = append(conns, conn)
	}
	c.reconnects -= len(conns)
	c.mu.Unlock()
	for _, conn := range conns {
		conn.Close()
	}
	return nil
}

// undelivered counts the confirmed messages not delivered yet.
func (c *failoverClient) undelivered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for seq := range c.confirmed {
		if c.received[seq] == 0 {
			n++
		}
	}
	return n
}

// firstDeliveryPublishedAfter returns when the first message first published after t was
// delivered.
func (c *failoverClient) firstDeliveryPublishedAfter(t time.Time) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Deliveries are in time order: start at the first one after t.
	from := sort.Search(len(c.deliveries), func(i int) bool { return c.deliveries[i].at.After(t) })
	for _, d := range c.deliveries[from:] {
		if d.seq < len(c.publishedAt) && c.publishedAt[d.seq].After(t) {
			return d.at, true
		}
	}
	return time.Time{}, false
}

// samples returns the delivery times and the confirms so far, each in time order.
func (c *failoverClient) samples() ([]time.Time, []failoverConfirm) {
	c.mu.Lock()
	defer c.mu.Unlock()
	deliveries := make([]time.Time, len(c.deliveries))
	for i, d := range c.deliveries {
		deliveries[i] = d.at
	}
	return deliveries, slices.Clone(c.confirms)
}

func (c *failoverClient) stopPublishing() {
	c.pubStop()
	// Wait for the publisher's last publish to be answered, so that the tally sees it.
	c.publishing.Lock()
	c.publishing.Unlock()
}

func (c *failoverClient) tally(r *failoverResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.Published, r.Confirmed = len(c.publishedAt), len(c.confirmed)
	for seq := range c.confirmed {
		if c.received[seq] == 0 {
			r.Lost++
		}
	}
	for _, n := range c.received {
		r.Duplicates += n - 1
	}
	r.Unanswered, r.Nacked, r.Reconnects = c.unanswered, c.nacked, c.reconnects
	r.ClientErrors = slices.Clone(c.clientErrs)
}

// close ends both loops and closes every connection.
func (c *failoverClient) close() {
	c.cancel()
	c.mu.Lock()
	for conn := range c.conns {
		conn.Close()
	}
	c.mu.Unlock()
	c.loops.Wait()
}
