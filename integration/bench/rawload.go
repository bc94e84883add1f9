package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The full-raw scenario runs full's load with rawClient instead of amqp091-go: each
// publisher and consumer is one goroutine on one socket that writes whatever it has to
// say and flushes only when it has read everything that arrived (its reader ran dry), so
// publishes, and acks, go out many per system call. That is the cheapest traffic a
// forwarder can get; amqp091-go writes every publish and every ack on its own, which is
// the most expensive. The two scenarios bracket what real clients do.

// runSpec runs spec with the client it names.
func runSpec(ctx context.Context, spec loadSpec, url string, procs watched) (runResult, error) {
	if spec.raw {
		return runRawLoad(ctx, spec, url, procs)
	}
	return runLoad(ctx, spec, url, procs)
}

// rawPublisher publishes with confirms, at most window unconfirmed.
type rawPublisher struct {
	client    *rawClient
	queue     string
	sent      []int64 // sent[seq % window]: when message seq was published
	published int64   // publishes in the measured span
	confirmed recorder
	nacked    int64
}

// rawConsumer consumes with manual acks.
type rawConsumer struct {
	client    *rawClient
	delivered recorder
}

func dialRawURL(url string) (*rawClient, error) {
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, err
	}
	return dialRaw(net.JoinHostPort(uri.Host, fmt.Sprint(uri.Port)), uri.Username, uri.Password, uri.Vhost)
}

// runRawLoad is runLoad with raw clients.
func runRawLoad(ctx context.Context, spec loadSpec, url string, procs watched) (runResult, error) {
	result := runResult{Scenario: spec.scenario}
	queues := spec.queueNames(fmt.Sprintf("%x", time.Now().UnixNano()))
	defer func() {
		if err := deleteQueues(url, queues); err != nil {
			progress("  could not delete the run's queues: %v", err)
		}
	}()
	if err := spec.declare(ctx, url, queues); err != nil {
		return result, err
	}

	var clients []*rawClient
	defer func() {
		for _, c := range clients {
			c.conn.Close()
		}
	}()
	consumers := make([]*rawConsumer, spec.consumers)
	for i := range consumers {
		c, err := dialRawURL(url)
		if err != nil {
			return result, fmt.Errorf("raw consumer %d: %w", i+1, err)
		}
		clients = append(clients, c)
		if err := c.startConsuming(queues[i%len(queues)], spec.prefetch); err != nil {
			return result, fmt.Errorf("raw consumer %d: %w", i+1, err)
		}
		consumers[i] = &rawConsumer{client: c}
	}
	publishers := make([]*rawPublisher, spec.publishers)
	for i := range publishers {
		c, err := dialRawURL(url)
		if err != nil {
			return result, fmt.Errorf("raw publisher %d: %w", i+1, err)
		}
		clients = append(clients, c)
		if err := c.call(&frames.ConfirmSelect{}, &frames.ConfirmSelectOk{}); err != nil {
			return result, fmt.Errorf("raw publisher %d: confirm.select: %w", i+1, err)
		}
		publishers[i] = &rawPublisher{client: c, queue: queues[i%len(queues)], sent: make([]int64, spec.window)}
	}

	timeline := clock{base: time.Now()}
	measured := span{from: int64(spec.warmup), to: int64(spec.warmup + spec.duration)}
	window := measureCPU(ctx, timeline, spec, procs)
	stop := window.done

	var consuming sync.WaitGroup
	for _, c := range consumers {
		consuming.Go(func() { c.consume(timeline, measured, spec.multiAck) })
	}
	errs := make([]error, len(publishers))
	var publishing sync.WaitGroup
	for i, p := range publishers {
		publishing.Go(func() { errs[i] = p.publish(timeline, measured, spec, stop) })
	}
	publishing.Wait()
	<-stop
	// The consumers read until their sockets fail: end them now that everything
	// published was confirmed.
	for _, c := range consumers {
		c.client.conn.SetReadDeadline(time.Now())
	}
	consuming.Wait()
	if err := errors.Join(errs...); err != nil {
		return result, err
	}
	if err := ctx.Err(); err != nil {
		return result, err
	}
	result.Seconds = spec.duration.Seconds()
	cpuFrom, cpuTo := window.from, window.to
	result.CPU = procs.between(cpuFrom, cpuTo)
	var confirms, deliveries [][]int64
	for _, p := range publishers {
		result.Published += p.published
		result.Nacked += p.nacked
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

// startConsuming sets the prefetch and starts a manual-ack consumer on channel 1.
func (c *rawClient) startConsuming(queue string, prefetch int) error {
	if err := c.call(&frames.BasicQos{PrefetchCount: uint16(prefetch)}, &frames.BasicQosOk{}); err != nil {
		return fmt.Errorf("basic.qos: %w", err)
	}
	return c.call(&frames.BasicConsume{Queue: queue, ConsumerTag: "bench"}, &frames.BasicConsumeOk{})
}

// call sends a synchronous method on channel 1 and waits for its reply.
func (c *rawClient) call(m, reply frames.Method) error {
	c.conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.conn.SetDeadline(time.Time{})
	if err := c.send(1, m); err != nil {
		return err
	}
	return c.expect(1, reply)
}

// publish fills the confirm window, flushes, and refills it each time the confirms that
// arrived have all been read; after stop it waits for the outstanding confirms.
func (p *rawPublisher) publish(timeline clock, measured span, spec loadSpec, stop <-chan struct{}) error {
	c := p.client
	window := uint64(len(p.sent))
	body := make([]byte, spec.size)
	for i := timestampSize; i < len(body); i++ {
		body[i] = byte(i)
	}
	header := &frames.ContentHeader{ClassID: 60, BodySize: uint64(len(body))}
	if spec.persistent {
		header.Properties = frames.Properties{Flags: frames.FlagDeliveryMode, DeliveryMode: 2}
	}
	publish := &frames.BasicPublish{RoutingKey: p.queue}
	var next, confirmedUpTo uint64 = 1, 0 // next sequence number; all up to confirmedUpTo are confirmed
	stopping := false
	for {
		if !stopping {
			select {
			case <-stop:
				stopping = true
			default:
			}
		}
		if stopping && confirmedUpTo+1 == next {
			return nil
		}
		if !stopping && c.in.Buffered() == 0 {
			for next-confirmedUpTo-1 < window {
				now := timeline.now()
				p.sent[next%window] = now
				binary.BigEndian.PutUint64(body, uint64(now))
				if err := c.out.WriteMethod(1, publish); err != nil {
					return err
				}
				if err := c.out.WriteContentHeader(1, header); err != nil {
					return err
				}
				if err := c.out.WriteFrame(frames.FrameBody, 1, body); err != nil {
					return err
				}
				if measured.contains(now) {
					p.published++
				}
				next++
			}
			if err := c.out.Flush(); err != nil {
				return err
			}
		}
		if stopping {
			c.conn.SetReadDeadline(time.Now().Add(confirmDrainTimeout))
		}
		f, err := c.in.ReadFrame()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("%d confirms still outstanding %v after the last publish", next-confirmedUpTo-1, confirmDrainTimeout)
			}
			return err
		}
		if f.Type != frames.FrameMethod {
			continue
		}
		m, err := frames.DecodeMethod(f.Payload)
		if err != nil {
			return err
		}
		var tag uint64
		var multiple bool
		switch m := m.(type) {
		case *frames.BasicAck:
			tag, multiple = m.DeliveryTag, m.Multiple
		case *frames.BasicNack:
			tag, multiple = m.DeliveryTag, m.Multiple
			p.nacked++
		default:
			if err := closeError(m); err != nil {
				return err
			}
			continue
		}
		// Confirms arrive in order; a single one may leave a gap only below the
		// multiple ones, which RabbitMQ does not do, so count each tag up to this one.
		if !multiple && tag != confirmedUpTo+1 {
			return fmt.Errorf("confirm of %d while %d is the oldest unconfirmed", tag, confirmedUpTo+1)
		}
		now := timeline.now()
		for seq := confirmedUpTo + 1; seq <= tag; seq++ {
			p.confirmed.record(measured, now, now-p.sent[seq%window])
		}
		confirmedUpTo = tag
	}
}

// consume acks every delivery (or every multiAck-th, with multiple) and flushes its acks
// when it has read everything that arrived.
func (c *rawConsumer) consume(timeline clock, measured span, multiAck int) {
	client := c.client
	var tag uint64
	var unacked int
	var bodyStart bool
	for {
		if client.in.Buffered() == 0 {
			if client.out.Flush() != nil {
				return
			}
		}
		f, err := client.in.ReadFrame()
		if err != nil {
			return
		}
		switch f.Type {
		case frames.FrameMethod:
			classID, methodID, args, err := frames.ParseMethodID(f.Payload)
			if err != nil || frames.MethodKey(classID, methodID) != frames.BasicDeliverKey {
				continue
			}
			var d frames.BasicDeliver
			if d.Decode(args) != nil {
				return
			}
			tag, bodyStart = d.DeliveryTag, true
		case frames.FrameBody:
			if !bodyStart {
				continue // the rest of a body longer than one frame
			}
			bodyStart = false
			now := timeline.now()
			if len(f.Payload) >= timestampSize {
				c.delivered.record(measured, now, now-int64(binary.BigEndian.Uint64(f.Payload)))
			}
			ack := &frames.BasicAck{DeliveryTag: tag}
			if multiAck > 1 {
				if unacked++; unacked < multiAck {
					continue
				}
				unacked, ack.Multiple = 0, true
			}
			if client.out.WriteMethod(1, ack) != nil {
				return
			}
		}
	}
}
