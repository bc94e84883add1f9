package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// backlogProgress is how often the long phases of the backlog scenario say how far they
// are.
const backlogProgress = 10 * time.Second

// backlogIDSize is the body prefix holding the message's number, big-endian.
const backlogIDSize = 8

// backlogFill is the confirms the fill's publishers got.
type backlogFill struct {
	// confirmed[id] is whether message id was confirmed; each publisher's confirm
	// listener writes its own range of it.
	confirmed     []bool
	acked, nacked atomic.Int64
}

func (f *backlogFill) confirmedCount() int64 { return f.acked.Load() }

// publishBacklog publishes messages 0 to cfg.backlogMessages-1, persistent, to queue at
// url: cfg.publishers publishers on connections of their own, each a contiguous range of
// the numbers with at most cfg.confirmWindow unconfirmed. It returns once every publisher
// has had every confirm.
func publishBacklog(ctx context.Context, url, queue string, cfg config) (*backlogFill, error) {
	n := cfg.backlogMessages
	fill := &backlogFill{confirmed: make([]bool, n)}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go reportEvery(stop, "confirmed", fill.acked.Load, n)
	var group sync.WaitGroup
	for i := range cfg.publishers {
		from, to := i*n/cfg.publishers, (i+1)*n/cfg.publishers
		group.Go(func() {
			if err := fill.publishRange(ctx, url, queue, cfg, i, from, to); err != nil {
				cancel(fmt.Errorf("publisher %d: %w", i+1, err))
			}
		})
	}
	group.Wait()
	return fill, context.Cause(ctx)
}

// reportEvery says every backlogProgress how many of total count says are done, until
// stop closes.
func reportEvery(stop <-chan struct{}, what string, count func() int64, total int) {
	tick := time.NewTicker(backlogProgress)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			progress("backlog: %d of %d %s", count(), total, what)
		}
	}
}

// publishRange publishes messages from to to-1 on a connection of its own and waits for
// their confirms.
func (f *backlogFill) publishRange(ctx context.Context, url, queue string, cfg config, i, from, to int) error {
	p, err := openPublisher(url, queue, loadSpec{window: cfg.confirmWindow}, i, nil)
	if err != nil {
		return err
	}
	go f.listen(p, from, to)
	defer func() {
		// Closing the connection ends the listener; nothing it writes comes after.
		p.conn.Close()
		<-p.listened
	}()
	body := make([]byte, cfg.backlogSize)
	message := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body}
	for id := from; id < to; id++ {
		if err := awaitWindow(ctx, p); err != nil {
			return fmt.Errorf("message %d: %w", id, err)
		}
		binary.BigEndian.PutUint64(body, uint64(id))
		// amqp091-go writes the frames before returning, so the body can be reused.
		if err := p.channel.PublishWithContext(ctx, "", queue, false, false, message); err != nil {
			return fmt.Errorf("publish message %d: %w", id, err)
		}
	}
	return p.awaitConfirms(ctx)
}

// listen records the confirms of publisher p, whose channel's delivery tag 1 is message
// from, and frees a place in its window for each.
func (f *backlogFill) listen(p *publisher, from, to int) {
	defer close(p.listened)
	for c := range p.confirms {
		id := from + int(c.DeliveryTag) - 1
		switch {
		case !c.Ack:
			f.nacked.Add(1)
		case id < to:
			f.confirmed[id] = true
			f.acked.Add(1)
		}
		<-p.tokens
	}
}

// awaitWindow takes a place in p's confirm window, waiting at most backlogStall for a
// confirm to free one: a broker that stops confirming (an alarm, a full disk) fails the
// fill rather than hanging it.
func awaitWindow(ctx context.Context, p *publisher) error {
	select {
	case p.tokens <- struct{}{}:
		return nil
	default:
	}
	timer := time.NewTimer(backlogStall)
	defer timer.Stop()
	select {
	case p.tokens <- struct{}{}:
		return nil
	case <-p.listened:
		return errors.New("channel closed")
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return fmt.Errorf("no confirm for %v", backlogStall)
	}
}

// backlogConsumer consumes the backlog through the proxy with manual acks, one ack per
// message, and counts each message number it receives.
type backlogConsumer struct {
	// confirmed is the fill's, read only; seen[id] is whether message id arrived, touched
	// only by the consuming goroutine.
	confirmed []bool
	seen      []bool
	// distinct counts the messages that arrived, wanted those of them that were
	// confirmed, duplicates the deliveries of a message that had arrived before.
	distinct, wanted, duplicates atomic.Int64
	// first and last are the first and the latest delivery, as nanoseconds since began
	// plus one: 0 is none yet.
	began       time.Time
	first, last atomic.Int64
	attempts    atomic.Int64
	firstFailure

	mu     sync.Mutex
	conn   *amqp.Connection
	closed bool
	stop   chan struct{}
	done   chan struct{} // closed when the consuming goroutine returned
}

// startBacklogConsumer starts consuming queue at url in the background.
func startBacklogConsumer(ctx context.Context, url, queue string, prefetch int, confirmed []bool) *backlogConsumer {
	c := &backlogConsumer{
		confirmed: confirmed,
		seen:      make([]bool, len(confirmed)),
		began:     time.Now(),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	go func() {
		defer close(c.done)
		deliveries, err := c.connect(ctx, url, queue, prefetch)
		if err != nil {
			c.fail(err)
			return
		}
		c.consume(deliveries)
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if !closed {
			err := errors.New("the consumer's deliveries ended: its channel or connection closed")
			c.fail(err)
		}
	}()
	return c
}

// connect opens the consumer's connection and consumes, trying again every 100 ms for
// backlogSetupTimeout: right after the kill the proxy may refuse it.
func (c *backlogConsumer) connect(ctx context.Context, url, queue string, prefetch int) (<-chan amqp.Delivery, error) {
	deadline := time.Now().Add(backlogSetupTimeout)
	for {
		c.attempts.Add(1)
		conn, deliveries, err := consumeQueue(url, queue, prefetch)
		if err == nil {
			c.mu.Lock()
			c.conn = conn
			closed := c.closed
			c.mu.Unlock()
			if closed {
				conn.Close() // close came meanwhile: deliveries ends at once
			}
			return deliveries, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("consume through amqp-mirror, %d attempts: %w", c.attempts.Load(), err)
		}
		select {
		case <-c.stop:
			return nil, errors.New("consumer closed before it consumed")
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// consumeQueue opens a connection with one channel consuming queue.
func consumeQueue(url, queue string, prefetch int) (*amqp.Connection, <-chan amqp.Delivery, error) {
	conn, err := dial(url, "bench backlog consumer", nil)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(prefetch, 0, false)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(queue, "", false, false, false, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, deliveries, nil
}

// consume counts and acks deliveries until the connection closes.
func (c *backlogConsumer) consume(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		now := int64(time.Since(c.began)) + 1
		c.first.CompareAndSwap(0, now)
		c.last.Store(now)
		c.count(d.Body)
		// An ack error means the channel closed: the deliveries end too.
		d.Ack(false)
	}
}

func (c *backlogConsumer) count(body []byte) {
	if len(body) < backlogIDSize {
		return
	}
	id := binary.BigEndian.Uint64(body)
	switch {
	case id >= uint64(len(c.seen)):
	case c.seen[id]:
		c.duplicates.Add(1)
	default:
		c.seen[id] = true
		c.distinct.Add(1)
		if c.confirmed[id] {
			c.wanted.Add(1)
		}
	}
}

func (c *backlogConsumer) firstAt() time.Time { return c.at(c.first.Load()) }
func (c *backlogConsumer) lastAt() time.Time  { return c.at(c.last.Load()) }

// at is the time of a first or last; the zero time for none.
func (c *backlogConsumer) at(since int64) time.Time {
	if since == 0 {
		return time.Time{}
	}
	return c.began.Add(time.Duration(since - 1))
}

// close stops the consumer and waits for its goroutine; it may be called again.
func (c *backlogConsumer) close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.stop)
		if c.conn != nil {
			c.conn.Close()
		}
	}
	c.mu.Unlock()
	<-c.done
}
