package integration

// FuzzProxyClientBytes, and the raw AMQP client that it and the error tests in
// proxy_errors_test.go drive: a client that can send what no library would.

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// fuzzPrefix is how far a fuzzed client gets through a normal connection
// before its fuzzed bytes: the input's first byte picks one, so the fuzzer can
// reach the proxy's handshake and its open-connection loops alike.
type fuzzPrefix uint8

const (
	prefixNone    fuzzPrefix = iota // the bytes are the client's first bytes
	prefixHeader                    // after the protocol header
	prefixOpen                      // after the whole handshake
	prefixChannel                   // after the handshake and channel.open on channel 1
	fuzzPrefixes
)

func (p fuzzPrefix) String() string {
	switch p {
	case prefixNone:
		return "no prefix"
	case prefixHeader:
		return "protocol header"
	case prefixOpen:
		return "open connection"
	case prefixChannel:
		return "open channel 1"
	}
	return fmt.Sprintf("prefix %d", uint8(p))
}

func (p fuzzPrefix) run(c *rawClient) error {
	switch p {
	case prefixHeader:
		return c.write(frames.ProtocolHeader)
	case prefixOpen:
		_, err := c.handshake(guest)
		return err
	case prefixChannel:
		if _, err := c.handshake(guest); err != nil {
			return err
		}
		if err := c.sendMethod(1, &frames.ChannelOpen{}); err != nil {
			return err
		}
		_, err := expect[*frames.ChannelOpenOk](c)
		return err
	}
	return nil
}

// FuzzProxyClientBytes sends arbitrary bytes to one proxy in front of rabbit1
// as a client, then half-closes. Whatever the bytes, the proxy must not
// panic, must close the connection once the client has gone, must end every
// goroutine of it, and must go on serving a normal client.
func FuzzProxyClientBytes(f *testing.F) {
	beforeProxy := []goleak.Option{goleak.IgnoreCurrent()}
	f.Cleanup(func() { leaktest.VerifyNone(f, beforeProxy...) }) // runs after the proxy's Close
	p := serveProxy(f, node(f, "rabbit1"), func(o *proxy.Options) {
		o.Logger = slog.New(slog.NewTextHandler(f.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
		o.HandshakeTimeout = 2 * time.Second
		o.CloseTimeout = time.Second
	})
	// The goroutines of a serving proxy, taken at the first input: a fuzz
	// worker's own goroutines start only after this function's preamble.
	var serving []goleak.Option
	var snapshot sync.Once

	f.Fuzz(func(t *testing.T, input []byte) {
		snapshot.Do(func() { serving = []goleak.Option{goleak.IgnoreCurrent()} })
		if len(input) == 0 {
			return
		}
		prefix, bytes := fuzzPrefix(input[0]%uint8(fuzzPrefixes)), input[1:]
		client := dialRaw(t, p.addr)
		if err := prefix.run(client); err != nil {
			t.Fatalf("%s: %v", prefix, err)
		}
		client.write(bytes) // the proxy may already have closed; that is its right
		client.conn.(*net.TCPConn).CloseWrite()
		if _, took, err := client.readToEOF(10 * time.Second); err != nil {
			t.Fatalf("%s, then %d fuzzed bytes and a half-close: the proxy kept the connection open: %v", prefix, len(bytes), err)
		} else if took > 5*time.Second {
			t.Errorf("%s, then %d fuzzed bytes and a half-close: the proxy took %v to close", prefix, len(bytes), took)
		}
		client.conn.Close()

		assertServes(t, p.url)
		testutil.Eventually(t, 10*time.Second, p.allClosed)
		leaktest.VerifyNone(t, serving...)
	})
}

// rawClient speaks AMQP frame by frame, so a test can send what no client
// library would. Every read and write is bounded by a deadline.
type rawClient struct {
	t    testing.TB
	conn net.Conn
	in   *frames.Reader
	out  *frames.Writer
	tune *frames.ConnectionTune // the server's offer, once received
}

const rawTimeout = 20 * time.Second

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, rawTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rawClient{t: t, conn: conn, in: frames.NewReader(conn, 4096), out: frames.NewWriter(conn, 4096)}
}

func (c *rawClient) write(b []byte) error {
	c.conn.SetWriteDeadline(time.Now().Add(rawTimeout))
	_, err := c.conn.Write(b)
	return err
}

func (c *rawClient) sendMethod(channel uint16, m frames.Method) error {
	c.conn.SetWriteDeadline(time.Now().Add(rawTimeout))
	if err := c.out.WriteMethod(channel, m); err != nil {
		return err
	}
	return c.out.Flush()
}

func (c *rawClient) sendHeartbeat() error {
	c.conn.SetWriteDeadline(time.Now().Add(rawTimeout))
	if err := c.out.WriteHeartbeat(); err != nil {
		return err
	}
	return c.out.Flush()
}

// next reads one frame, and decodes it when it is a method.
func (c *rawClient) next(timeout time.Duration) (frames.Frame, frames.Method, error) {
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	f, err := c.in.ReadFrame()
	if err != nil || f.Type != frames.FrameMethod {
		return f, nil, err
	}
	m, err := frames.DecodeMethod(f.Payload)
	return f, m, err
}

// received is one frame a stream read, or the error that ended it.
type received struct {
	method frames.Method
	err    error
}

// stream reads frames on a goroutine of its own until the connection ends or
// the test does, so that the test can write meanwhile.
func (c *rawClient) stream() <-chan received {
	out := make(chan received)
	stop := make(chan struct{})
	c.t.Cleanup(func() { close(stop) }) // before dialRaw's cleanup closes the socket
	go func() {
		defer close(out)
		for {
			_, m, err := c.next(time.Minute)
			select {
			case out <- received{m, err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return out
}

// expect reads frames, skipping heartbeats, until a method, which must be an M.
// A connection.close instead is answered with close-ok and returned as *closedError.
func expect[M frames.Method](c *rawClient) (M, error) {
	var zero M
	for {
		f, m, err := c.next(rawTimeout)
		if err != nil {
			return zero, err
		}
		if f.Type == frames.FrameHeartbeat {
			continue
		}
		if got, ok := m.(M); ok {
			return got, nil
		}
		if cl, ok := m.(*frames.ConnectionClose); ok {
			c.sendMethod(0, &frames.ConnectionCloseOk{})
			return zero, &closedError{cl}
		}
		return zero, fmt.Errorf("got a %s frame (%T %v) on channel %d, want %T", frames.FrameTypeName(f.Type), m, m, f.Channel, zero)
	}
}

// closedError is the server's connection.close where another method was expected.
type closedError struct{ close *frames.ConnectionClose }

func (e *closedError) Error() string {
	return fmt.Sprintf("connection.close %d %q", e.close.ReplyCode, e.close.ReplyText)
}

// login is what a raw client presents in the handshake.
type login struct {
	user, password, vhost string
	name                  string // connection_name, to find it with rabbitmqctl
	heartbeat             uint16
	frameMax              uint32 // 0 takes the server's offer
	cancelNotify          bool   // announce consumer_cancel_notify
}

var guest = login{user: "guest", password: "guest", vhost: "/"}

// handshakeStep is one client step of the connection handshake, with the
// server's answer it waits for.
type handshakeStep int

const (
	stepHeader  handshakeStep = iota // protocol header → connection.start
	stepStartOk                      // start-ok → connection.tune
	stepTuneOk                       // tune-ok (no answer)
	stepOpen                         // connection.open → open-ok
)

// handshake runs the whole client side of the handshake and returns the
// server's tune.
func (c *rawClient) handshake(l login) (*frames.ConnectionTune, error) {
	err := c.handshakeSteps(l, stepHeader, stepStartOk, stepTuneOk, stepOpen)
	return c.tune, err
}

func (c *rawClient) handshakeSteps(l login, steps ...handshakeStep) error {
	for _, step := range steps {
		var err error
		switch step {
		case stepHeader:
			if err = c.write(frames.ProtocolHeader); err == nil {
				_, err = expect[*frames.ConnectionStart](c)
			}
		case stepStartOk:
			capabilities := frames.Table{{Key: "authentication_failure_close", Value: true}}
			if l.cancelNotify {
				capabilities = append(capabilities, frames.Field{Key: "consumer_cancel_notify", Value: true})
			}
			properties := frames.Table{{Key: "capabilities", Value: capabilities}}
			if l.name != "" {
				properties = append(properties, frames.Field{Key: "connection_name", Value: l.name})
			}
			err = c.sendMethod(0, &frames.ConnectionStartOk{ClientProperties: properties,
				Mechanism: "PLAIN", Response: "\x00" + l.user + "\x00" + l.password, Locale: "en_US"})
			if err == nil {
				c.tune, err = expect[*frames.ConnectionTune](c)
			}
		case stepTuneOk:
			frameMax := c.tune.FrameMax
			if l.frameMax != 0 {
				frameMax = l.frameMax
			}
			err = c.sendMethod(0, &frames.ConnectionTuneOk{ChannelMax: c.tune.ChannelMax, FrameMax: frameMax, Heartbeat: l.heartbeat})
		case stepOpen:
			if err = c.sendMethod(0, &frames.ConnectionOpen{VirtualHost: l.vhost}); err == nil {
				_, err = expect[*frames.ConnectionOpenOk](c)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// open logs in and opens channel 1; the test fails if it cannot.
func (c *rawClient) open(l login) {
	c.t.Helper()
	if _, err := c.handshake(l); err != nil {
		c.t.Fatalf("handshake: %v", err)
	}
	if err := c.sendMethod(1, &frames.ChannelOpen{}); err != nil {
		c.t.Fatalf("channel.open: %v", err)
	}
	if _, err := expect[*frames.ChannelOpenOk](c); err != nil {
		c.t.Fatalf("channel.open: %v", err)
	}
}

// awaitClose reads until the server's connection.close and answers it with
// close-ok, as a client does.
func (c *rawClient) awaitClose() (*frames.ConnectionClose, error) {
	for {
		f, m, err := c.next(rawTimeout)
		if err != nil {
			return nil, fmt.Errorf("waiting for connection.close: %w", err)
		}
		if cl, ok := m.(*frames.ConnectionClose); ok && f.Channel == 0 {
			c.sendMethod(0, &frames.ConnectionCloseOk{})
			return cl, nil
		}
	}
}

// readToEOF reads until the server closes the socket (a reset counts) and
// returns what it read and how long that took.
func (c *rawClient) readToEOF(timeout time.Duration) ([]byte, time.Duration, error) {
	start := time.Now()
	c.conn.SetReadDeadline(start.Add(timeout))
	var got []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.conn.Read(buf)
		got = append(got, buf[:n]...)
		switch {
		case err == nil:
		case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
			return got, time.Since(start), nil
		default:
			return got, time.Since(start), fmt.Errorf("socket still open after %v: %w", timeout, err)
		}
	}
}

// frame encodes one frame with a chosen frame-end octet.
func frame(typ uint8, channel uint16, payload []byte, end byte) []byte {
	b := []byte{typ, byte(channel >> 8), byte(channel)}
	b = append(b, byte(len(payload)>>24), byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload)))
	b = append(b, payload...)
	return append(b, end)
}
