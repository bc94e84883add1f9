package main

import (
	"fmt"
	"net"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// rawClient is the smallest AMQP client that can consume: it speaks through the
// project's frames package on a plain socket, and reads that socket only when told to.
// amqp091-go cannot stall: its reader goroutine keeps reading into an unbounded buffer
// however slowly the application takes deliveries, so the backpressure the proxy sees
// would be the client's memory, not TCP's.
type rawClient struct {
	conn net.Conn
	in   *frames.Reader
	out  *frames.Writer
}

// rawBufferSize is the client's read and write buffer; what it holds is in this process,
// so it takes nothing from the stalled pipeline.
const rawBufferSize = 64 << 10

// handshakeTimeout bounds each step of connecting.
const handshakeTimeout = 10 * time.Second

// dialRaw connects to addr, authenticates with PLAIN and opens vhost and channel 1.
// It proposes no heartbeats, so that a client that does not read is not taken for dead.
func dialRaw(addr, user, password, vhost string) (*rawClient, error) {
	conn, err := net.DialTimeout("tcp", addr, handshakeTimeout)
	if err != nil {
		return nil, err
	}
	c := &rawClient{
		conn: conn,
		in:   frames.NewReader(conn, rawBufferSize),
		out:  frames.NewWriter(conn, rawBufferSize),
	}
	if err := c.handshake(user, password, vhost); err != nil {
		conn.Close()
		return nil, fmt.Errorf("raw AMQP handshake with %s: %w", addr, err)
	}
	return c, nil
}

func (c *rawClient) handshake(user, password, vhost string) error {
	c.conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.conn.SetDeadline(time.Time{})
	if err := c.out.WriteProtocolHeader(); err != nil {
		return err
	}
	if err := c.out.Flush(); err != nil {
		return err
	}
	var start frames.ConnectionStart
	if err := c.expect(0, &start); err != nil {
		return err
	}
	err := c.send(0, &frames.ConnectionStartOk{
		ClientProperties: frames.Table{{Key: "product", Value: "amqp-mirror bench"}},
		Mechanism:        "PLAIN",
		Response:         "\x00" + user + "\x00" + password,
		Locale:           "en_US",
	})
	if err != nil {
		return err
	}
	var tune frames.ConnectionTune
	if err := c.expect(0, &tune); err != nil {
		return err
	}
	if tune.FrameMax == 0 {
		tune.FrameMax = 131072
	}
	c.in.SetMaxFrameSize(tune.FrameMax)
	if err := c.send(0, &frames.ConnectionTuneOk{ChannelMax: tune.ChannelMax, FrameMax: tune.FrameMax}); err != nil {
		return err
	}
	if err := c.send(0, &frames.ConnectionOpen{VirtualHost: vhost}); err != nil {
		return err
	}
	if err := c.expect(0, &frames.ConnectionOpenOk{}); err != nil {
		return err
	}
	if err := c.send(1, &frames.ChannelOpen{}); err != nil {
		return err
	}
	return c.expect(1, &frames.ChannelOpenOk{})
}

// consume starts a no-ack consumer on channel 1 and returns once the server confirmed
// it. Deliveries may already be arriving; they wait in the socket until read.
func (c *rawClient) consume(queue string) error {
	c.conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.conn.SetDeadline(time.Time{})
	if err := c.send(1, &frames.BasicConsume{Queue: queue, ConsumerTag: "bench-stalled", NoAck: true}); err != nil {
		return err
	}
	return c.expect(1, &frames.BasicConsumeOk{})
}

// drain reads deliveries until messages whole messages of size bytes arrived or the
// deadline passed, and returns how many arrived.
func (c *rawClient) drain(messages, size int, deadline time.Time) (int, error) {
	c.conn.SetReadDeadline(deadline)
	defer c.conn.SetReadDeadline(time.Time{})
	var delivered int
	var body int64
	want := int64(messages) * int64(size)
	for delivered < messages || body < want {
		f, err := c.in.ReadFrame()
		if err != nil {
			return delivered, fmt.Errorf("after %d of %d deliveries: %w", delivered, messages, err)
		}
		switch f.Type {
		case frames.FrameBody:
			body += int64(len(f.Payload))
		case frames.FrameMethod:
			m, err := frames.DecodeMethod(f.Payload)
			if err != nil {
				return delivered, err
			}
			if err := closeError(m); err != nil {
				return delivered, err
			}
			if _, ok := m.(*frames.BasicDeliver); ok {
				delivered++
			}
		}
	}
	return delivered, nil
}

// close says goodbye with connection.close, waits briefly for close-ok and closes the
// socket. Frames still arriving are skipped.
func (c *rawClient) close() {
	defer c.conn.Close()
	c.conn.SetDeadline(time.Now().Add(5 * time.Second))
	if c.send(0, &frames.ConnectionClose{ReplyCode: frames.ReplySuccess, ReplyText: "bench done"}) != nil {
		return
	}
	for {
		f, err := c.in.ReadFrame()
		if err != nil {
			return
		}
		if f.Type == frames.FrameMethod && f.Channel == 0 {
			if m, err := frames.DecodeMethod(f.Payload); err != nil || isCloseOk(m) {
				return
			}
		}
	}
}

func isCloseOk(m frames.Method) bool {
	_, ok := m.(*frames.ConnectionCloseOk)
	return ok
}

func (c *rawClient) send(channel uint16, m frames.Method) error {
	if err := c.out.WriteMethod(channel, m); err != nil {
		return err
	}
	return c.out.Flush()
}

// expect reads the next method frame, which must be want on channel; heartbeats are
// skipped, a close from the server is returned as an error.
func (c *rawClient) expect(channel uint16, want frames.Method) error {
	for {
		f, err := c.in.ReadFrame()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", want.Name(), err)
		}
		if f.Type == frames.FrameHeartbeat {
			continue
		}
		if f.Type != frames.FrameMethod {
			return fmt.Errorf("waiting for %s: got a %s frame", want.Name(), frames.FrameTypeName(f.Type))
		}
		classID, methodID, args, err := frames.ParseMethodID(f.Payload)
		if err != nil {
			return err
		}
		wantClass, wantMethod := want.ID()
		if classID == wantClass && methodID == wantMethod && f.Channel == channel {
			return want.Decode(args)
		}
		got, err := frames.DecodeMethod(f.Payload)
		if err != nil {
			return err
		}
		if err := closeError(got); err != nil {
			return err
		}
		return fmt.Errorf("waiting for %s on channel %d: got %s on channel %d", want.Name(), channel, got.Name(), f.Channel)
	}
}

// closeError turns a server's connection.close or channel.close into an error.
func closeError(m frames.Method) error {
	switch m := m.(type) {
	case *frames.ConnectionClose:
		return fmt.Errorf("server closed the connection: %d %s", m.ReplyCode, m.ReplyText)
	case *frames.ChannelClose:
		return fmt.Errorf("server closed the channel: %d %s", m.ReplyCode, m.ReplyText)
	}
	return nil
}
