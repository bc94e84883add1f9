package integration

// Error handling through the proxy: what a client sees when it, the broker or
// the proxy itself misbehaves. Where RabbitMQ answers the same exchange itself,
// the test also runs it directly against the node and wants the proxy to give
// the broker's reply code (and, where the broker's own text reaches the client,
// that text). The proxy and broker helpers are at the end of the file; the
// raw client, which FuzzProxyClientBytes drives too, is in proxy_fuzz_test.go.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"github.com/amqp-mirror/amqp-mirror/proxy"
)

func TestProxyErrorsWrongProtocolHeader(t *testing.T) {
	n := node(t, "rabbit1")
	p := serveProxy(t, n)
	cases := []struct{ name, header string }{
		{"HTTP request", "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"},
		{"AMQP 0-9-0", "AMQP\x00\x00\x09\x00"},
		{"AMQP 1.0", "AMQP\x00\x01\x00\x00"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			answers := map[string]string{}
			for _, to := range directAndProxied(n, p) {
				client := dialRaw(t, to.addr)
				if err := client.write([]byte(c.header)); err != nil {
					t.Fatalf("%s: write: %v", to.name, err)
				}
				answer, _, err := client.readToEOF(5 * time.Second)
				if err != nil {
					t.Errorf("%s: %v", to.name, err)
				}
				answers[to.name] = string(answer)
			}
			verify(t, []check{
				{"proxy's answer", answers["proxy"], string(frames.ProtocolHeader)},
				{"proxy's answer as the broker's", answers["proxy"], answers["direct"]},
			})
		})
	}
	assertServes(t, p.url)
	testutil.Eventually(t, 5*time.Second, p.allClosed)
	verify(t, []check{{"connections closed as handshake_failed", p.closedBy(proxy.ReasonHandshakeFailed), uint64(len(cases))}})
}

func TestProxyErrorsHandshakeTimeout(t *testing.T) {
	const timeout = time.Second
	p := serveProxy(t, node(t, "rabbit1"), func(o *proxy.Options) { o.HandshakeTimeout = timeout })
	cases := []struct {
		name  string
		stall func(*rawClient) error // the steps taken before the client goes quiet
	}{
		{"silent after connecting", func(*rawClient) error { return nil }},
		{"quiet after the protocol header", func(c *rawClient) error {
			return c.handshakeSteps(guest, stepHeader)
		}},
		{"never sends tune-ok", func(c *rawClient) error {
			return c.handshakeSteps(guest, stepHeader, stepStartOk)
		}},
		{"never sends connection.open", func(c *rawClient) error {
			return c.handshakeSteps(guest, stepHeader, stepStartOk, stepTuneOk)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			client := dialRaw(t, p.addr)
			if err := c.stall(client); err != nil {
				t.Fatalf("handshake up to the stall: %v", err)
			}
			if _, _, err := client.readToEOF(timeout + 10*time.Second); err != nil {
				t.Fatalf("disconnected: %v", err)
			}
			if took := time.Since(start); took < timeout-100*time.Millisecond || took > timeout+3*time.Second {
				t.Errorf("disconnected after %v, want about the handshake timeout %v", took, timeout)
			}
		})
	}
	testutil.Eventually(t, 5*time.Second, p.allClosed)
	verify(t, []check{{"connections closed as handshake_failed", p.closedBy(proxy.ReasonHandshakeFailed), uint64(len(cases))}})
}

func TestProxyErrorsMalformedFrame(t *testing.T) {
	n := node(t, "rabbit1")
	const closeTimeout = time.Second
	p := serveProxy(t, n, func(o *proxy.Options) { o.CloseTimeout = closeTimeout })
	bystander := dialURL(t, p.url)
	cases := []struct {
		name  string
		bytes []byte // sent once channel 1 is open
	}{
		{"bad frame-end octet", frame(frames.FrameMethod, 1, []byte{0, 20, 0, 40}, 0xAB)},
		{"unknown frame type", frame(9, 0, nil, frames.FrameEnd)},
		// basic.publish is passed on undecoded: the broker finds the fault.
		{"basic.publish cut after the exchange", frame(frames.FrameMethod, 1, []byte{0, 60, 0, 40, 0, 0, 0}, frames.FrameEnd)},
		// basic.ack is decoded by the proxy, which must find it as the broker would.
		{"basic.ack cut inside the delivery tag", frame(frames.FrameMethod, 1, []byte{0, 60, 0, 80, 0, 0, 0, 1}, frames.FrameEnd)},
		{"method frame shorter than its ids", frame(frames.FrameMethod, 1, []byte{0, 60}, frames.FrameEnd)},
		{"heartbeat with a payload", frame(frames.FrameHeartbeat, 0, []byte{1}, frames.FrameEnd)},
		{"heartbeat on channel 1", frame(frames.FrameHeartbeat, 1, nil, frames.FrameEnd)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			closes := map[string]*frames.ConnectionClose{}
			for _, to := range directAndProxied(n, p) {
				client := dialRaw(t, to.addr)
				client.open(guest)
				if err := client.write(c.bytes); err != nil {
					t.Fatalf("%s: write: %v", to.name, err)
				}
				reply, err := client.awaitClose()
				if err != nil {
					t.Fatalf("%s: %v", to.name, err)
				}
				closes[to.name] = reply
				t.Logf("%s: connection.close %d %q", to.name, reply.ReplyCode, reply.ReplyText)
				if to.name == "proxy" {
					if _, _, err := client.readToEOF(closeTimeout + time.Second); err != nil {
						t.Errorf("proxy after close-ok: %v", err)
					}
				}
			}
			verify(t, []check{
				{"proxy's reply code", closes["proxy"].ReplyCode, closes["direct"].ReplyCode},
				{"proxy gives a reply text", closes["proxy"].ReplyText != "", true},
			})
		})
	}
	if err := usable(bystander); err != nil {
		t.Errorf("a connection open through the proxy all along: %v", err)
	}
	assertServes(t, p.url)
}

func TestProxyErrorsOversizedFrame(t *testing.T) {
	n := node(t, "rabbit1")
	const closeTimeout = time.Second
	p := serveProxy(t, n, func(o *proxy.Options) { o.CloseTimeout = closeTimeout })
	oversized := func(size uint32, sent int) []byte {
		b := []byte{frames.FrameBody, 0, 1, byte(size >> 24), byte(size >> 16), byte(size >> 8), byte(size)}
		return append(b, make([]byte, sent)...)
	}
	cases := []struct {
		name     string
		frameMax uint32 // the client's tune-ok; 0 takes the offer (131072)
		bytes    []byte
	}{
		{"twice the offered frame_max", 0, oversized(2*frames.DefaultMaxFrameSize, 1024)},
		{"over the 4096 the client chose", 4096, append(oversized(5000, 5000), frames.FrameEnd)},
		{"size field of 4 GiB", 0, oversized(0xFFFFFFFF, 0)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			codes := map[string]uint16{}
			var allocated uint64
			for _, to := range directAndProxied(n, p) {
				client := dialRaw(t, to.addr)
				client.open(login{user: "guest", password: "guest", vhost: "/", frameMax: c.frameMax})
				var before, after runtime.MemStats // of this process, so they count for the proxy only
				runtime.ReadMemStats(&before)
				if err := client.write(c.bytes); err != nil {
					t.Fatalf("%s: write: %v", to.name, err)
				}
				reply, err := client.awaitClose()
				if err != nil {
					t.Fatalf("%s: %v", to.name, err)
				}
				codes[to.name] = reply.ReplyCode
				t.Logf("%s: connection.close %d %q", to.name, reply.ReplyCode, reply.ReplyText)
				if to.name == "proxy" {
					if _, _, err := client.readToEOF(closeTimeout + time.Second); err != nil {
						t.Errorf("proxy after close-ok: %v", err)
					}
					runtime.ReadMemStats(&after)
					allocated = after.TotalAlloc - before.TotalAlloc
				}
			}
			const bound = 64 << 20 // the frame buffers are 64 KiB; a 4 GiB frame would show
			verify(t, []check{
				{"proxy's reply code", codes["proxy"], frames.FrameError},
				{"broker's reply code", codes["direct"], frames.FrameError},
				{"test process allocated under 64 MiB meanwhile", allocated < bound, true},
			})
		})
	}
	assertServes(t, p.url)
}

func TestProxyErrorsRefusedLogin(t *testing.T) {
	n := node(t, "rabbit1")
	p := serveProxy(t, n)
	// amqp091-go does not announce authentication_failure_close, so RabbitMQ
	// refuses its credentials by closing the socket and the library reports
	// ErrCredentials (403); the raw client announces it and gets the
	// broker's connection.close.
	clients := []struct {
		name  string
		login func(addr string, l login) (int, string)
	}{
		{"amqp091-go", func(addr string, l login) (int, string) {
			conn, err := amqp.Dial(amqpURL(addr, l.user, l.password, l.vhost))
			if err == nil {
				conn.Close()
			}
			return amqpReply(err)
		}},
		{"raw client with authentication_failure_close", func(addr string, l login) (int, string) {
			_, err := dialRaw(t, addr).handshake(l)
			var closed *closedError
			if errors.As(err, &closed) {
				return int(closed.close.ReplyCode), closed.close.ReplyText
			}
			return 0, fmt.Sprint(err)
		}},
	}
	cases := []struct {
		name  string
		login login
		want  int
	}{
		{"wrong password", login{user: "guest", password: "not-the-password", vhost: "/"}, amqp.AccessRefused},
		{"unknown vhost", login{user: "guest", password: "guest", vhost: "no-such-vhost"}, amqp.NotAllowed},
	}
	for _, c := range cases {
		for _, client := range clients {
			t.Run(c.name+"/"+client.name, func(t *testing.T) {
				codes, texts := map[string]int{}, map[string]string{}
				for _, to := range directAndProxied(n, p) {
					codes[to.name], texts[to.name] = client.login(to.addr, c.login)
				}
				verify(t, []check{
					{"broker's code", codes["direct"], c.want},
					{"proxy's code", codes["proxy"], c.want},
					{"proxy's text", texts["proxy"], texts["direct"]},
				})
			})
		}
	}
	assertServes(t, p.url)
	// A refused client must not leave its connection behind in the proxy.
	testutil.Eventually(t, 5*time.Second, p.allClosed)
	verify(t, []check{{"connections closed as handshake_failed", p.closedBy(proxy.ReasonHandshakeFailed), uint64(len(cases) * len(clients))}})
}

func TestProxyErrorsPublishToMissingExchange(t *testing.T) {
	n := node(t, "rabbit1")
	p := serveProxy(t, n)
	exchange := queueName(t) // absent
	type outcome struct {
		code       int
		text       string
		usableThen error
	}
	outcomes := map[string]outcome{}
	for _, to := range directAndProxied(n, p) {
		conn := dialURL(t, amqpURL(to.addr, "guest", "guest", "/"))
		channel := openChannel(t, conn)
		closed := channel.NotifyClose(make(chan *amqp.Error, 1))
		if err := channel.Publish(exchange, "key", false, false, amqp.Publishing{Body: []byte("lost")}); err != nil {
			t.Fatalf("%s: publish: %v", to.name, err)
		}
		var o outcome
		select {
		case err := <-closed:
			o.code, o.text = amqpReply(err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the channel did not close", to.name)
		}
		o.usableThen = usable(conn)
		outcomes[to.name] = o
	}
	proxied, direct := outcomes["proxy"], outcomes["direct"]
	verify(t, []check{
		{"broker's code", direct.code, amqp.NotFound},
		{"proxy's code", proxied.code, amqp.NotFound},
		{"proxy's text", proxied.text, direct.text},
		{"connection usable afterwards through the proxy", proxied.usableThen, nil},
		{"connection usable afterwards directly", direct.usableThen, nil},
	})
}

func TestProxyErrorsUnknownDeliveryTag(t *testing.T) {
	n := node(t, "rabbit1")
	p := serveProxy(t, n)
	// Each case gets a channel whose queue holds one delivery, unacknowledged,
	// with delivery tag 1.
	cases := []struct {
		name   string
		settle func(*amqp.Channel, amqp.Delivery) error
		want   string
	}{
		{"ack of a tag never delivered", func(c *amqp.Channel, _ amqp.Delivery) error { return c.Ack(42, false) },
			"PRECONDITION_FAILED - unknown delivery tag 42"},
		{"second ack of one delivery", func(c *amqp.Channel, d amqp.Delivery) error {
			if err := d.Ack(false); err != nil {
				return err
			}
			return d.Ack(false)
		}, "PRECONDITION_FAILED - unknown delivery tag 1"},
		{"multiple ack above the last delivery", func(c *amqp.Channel, _ amqp.Delivery) error { return c.Ack(5, true) },
			"PRECONDITION_FAILED - unknown delivery tag 5"},
		{"nack of a tag never delivered", func(c *amqp.Channel, _ amqp.Delivery) error { return c.Nack(7, false, true) },
			"PRECONDITION_FAILED - unknown delivery tag 7"},
		{"reject of a tag never delivered", func(c *amqp.Channel, _ amqp.Delivery) error { return c.Reject(9, false) },
			"PRECONDITION_FAILED - unknown delivery tag 9"},
	}
	connections := map[string]*amqp.Connection{}
	for _, to := range directAndProxied(n, p) {
		connections[to.name] = dialURL(t, amqpURL(to.addr, "guest", "guest", "/"))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			codes, texts := map[string]int{}, map[string]string{}
			for name, conn := range connections {
				channel := openChannel(t, conn)
				q, err := channel.QueueDeclare("", false, true, true, false, nil)
				if err != nil {
					t.Fatalf("%s: declare: %v", name, err)
				}
				if err := channel.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("one")}); err != nil {
					t.Fatalf("%s: publish: %v", name, err)
				}
				deliveries, err := channel.Consume(q.Name, "", false, true, false, false, nil)
				if err != nil {
					t.Fatalf("%s: consume: %v", name, err)
				}
				delivery := receive(t, deliveries)
				closed := channel.NotifyClose(make(chan *amqp.Error, 1))
				if err := c.settle(channel, delivery); err != nil {
					t.Fatalf("%s: settle: %v", name, err)
				}
				select {
				case err := <-closed:
					codes[name], texts[name] = amqpReply(err)
				case <-time.After(5 * time.Second):
					t.Fatalf("%s: the channel did not close", name)
				}
			}
			verify(t, []check{
				{"broker's code", codes["direct"], amqp.PreconditionFailed},
				{"broker's text", texts["direct"], c.want},
				{"proxy's code", codes["proxy"], amqp.PreconditionFailed},
				{"proxy's text", texts["proxy"], c.want},
			})
		})
	}
	if err := usable(connections["proxy"]); err != nil {
		t.Errorf("proxied connection after the channel errors: %v", err)
	}
}

// TestProxyErrorsBackendGoesAway kills rabbit3 and restarts it.
func TestProxyErrorsBackendGoesAway(t *testing.T) {
	n := node(t, "rabbit3")
	t.Cleanup(func() {
		if !n.Running() {
			if err := n.Restart(context.Background()); err != nil {
				t.Errorf("restarting %s: %v", n.Name, err)
			}
		}
	})
	p := serveProxy(t, n)
	dialNamed := func(addr, name string) (*amqp.Connection, chan *amqp.Error) {
		conn, err := amqp.DialConfig(amqpURL(addr, "guest", "guest", "/"), amqp.Config{Properties: amqp.Table{"connection_name": name}})
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn, conn.NotifyClose(make(chan *amqp.Error, 1))
	}
	awaitClose := func(closed chan *amqp.Error) (int, string) {
		select {
		case err := <-closed:
			return amqpReply(err)
		case <-time.After(5 * time.Second):
			return 0, "not closed within 5s"
		}
	}

	// An operator closes the connection: the broker's close reaches the client as it is.
	directName, proxiedName := uniqueName(t, "direct"), uniqueName(t, "proxied")
	_, directClosed := dialNamed(nodeAddr(n), directName)
	_, proxiedClosed := dialNamed(p.addr, proxiedName)
	pids := connectionPIDs(t, n)
	for _, name := range []string{directName, proxiedName} {
		if pids[name] == "" {
			t.Fatalf("no connection named %s on %s: %v", name, n.Name, pids)
		}
		rabbitmqctl(t, n, "close_connection", pids[name], "closed by the error test")
	}
	directCode, directText := awaitClose(directClosed)
	proxiedCode, proxiedText := awaitClose(proxiedClosed)
	verify(t, []check{
		{"closed by the operator: broker's code", directCode, amqp.ConnectionForced},
		{"closed by the operator: proxy's code", proxiedCode, amqp.ConnectionForced},
		{"closed by the operator: proxy's text", proxiedText, directText},
	})

	// The node dies: the proxy itself tells the client, with 320 as a stopping broker would.
	_, proxiedClosed = dialNamed(p.addr, uniqueName(t, "killed"))
	start := time.Now()
	if err := n.Kill(); err != nil {
		t.Fatalf("kill %s: %v", n.Name, err)
	}
	killedCode, killedText := awaitClose(proxiedClosed)
	t.Logf("after the kill, in %v: %d %s", time.Since(start).Round(time.Millisecond), killedCode, killedText)
	verify(t, []check{{"node killed: proxy's code", killedCode, amqp.ConnectionForced}})

	if err := n.Restart(testContext(t, time.Minute)); err != nil {
		t.Fatalf("restart %s: %v", n.Name, err)
	}
	assertServes(t, p.url)
	testutil.Eventually(t, 5*time.Second, p.allClosed)
	verify(t, []check{
		{"connections closed as backend_closed", p.closedBy(proxy.ReasonBackendClosed), uint64(1)},
		{"connections closed as backend_lost", p.closedBy(proxy.ReasonBackendLost), uint64(1)},
	})
}

func TestProxyErrorsClientVanishes(t *testing.T) {
	n := node(t, "rabbit1")
	p := serveProxy(t, n)
	cases := []struct {
		name   string
		vanish func(*rawClient)
	}{
		{"socket closed after the handshake", func(c *rawClient) { c.conn.Close() }},
		{"socket reset", func(c *rawClient) {
			c.conn.(*net.TCPConn).SetLinger(0)
			c.conn.Close()
		}},
		{"socket closed inside a frame", func(c *rawClient) {
			c.write(frame(frames.FrameMethod, 1, []byte{0, 60, 0, 40, 0, 0, 0, 0, 0}, frames.FrameEnd)[:9])
			c.conn.Close()
		}},
	}
	names := make([]string, len(cases))
	clients := make([]*rawClient, len(cases))
	for i := range cases {
		names[i] = uniqueName(t, fmt.Sprint(i))
		clients[i] = dialRaw(t, p.addr)
		clients[i].open(login{user: "guest", password: "guest", vhost: "/", name: names[i]})
	}
	pids := connectionPIDs(t, n)
	for i, c := range cases {
		if pids[names[i]] == "" {
			t.Fatalf("%s: the proxy's backend connection is not on %s before the client vanishes", c.name, n.Name)
		}
		c.vanish(clients[i])
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		pids := connectionPIDs(t, n)
		var left []string
		for i, c := range cases {
			if pids[names[i]] != "" {
				left = append(left, c.name)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("backend connections still on %s after: %s", n.Name, strings.Join(left, ", "))
		}
		return nil
	})
	testutil.Eventually(t, 5*time.Second, p.allClosed)
	verify(t, []check{{"connections closed as client_gone", p.closedBy(proxy.ReasonClientGone), uint64(len(cases))}})
}

func TestProxyLeaksNeitherGoroutinesNorSockets(t *testing.T) {
	leakOptions := []goleak.Option{goleak.IgnoreCurrent()}
	descriptorsBefore := openDescriptors(t)
	p := serveProxy(t, node(t, "rabbit1"))
	const connections, channels = 50, 10
	sockets := make([]net.Conn, connections)
	conns := make([]*amqp.Connection, connections)
	var wg sync.WaitGroup
	failures := make(chan error, connections)
	limit := make(chan struct{}, 10)
	for i := range connections {
		wg.Go(func() {
			limit <- struct{}{}
			defer func() { <-limit }()
			conn, err := amqp.DialConfig(p.url, amqp.Config{Heartbeat: 10 * time.Second, Dial: func(network, addr string) (net.Conn, error) {
				socket, err := net.DialTimeout(network, addr, 10*time.Second)
				sockets[i] = socket
				return socket, err
			}})
			if err != nil {
				failures <- fmt.Errorf("connection %d: %w", i, err)
				return
			}
			conns[i] = conn
			for j := range channels { // all left open, each with its consumer
				channel, err := conn.Channel()
				if err == nil {
					err = roundTrip(channel)
				}
				if err != nil {
					failures <- fmt.Errorf("connection %d channel %d: %w", i, j, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	for i := range connections {
		switch {
		case conns[i] == nil:
		case i%2 == 0:
			conns[i].Close()
		case i%4 == 1:
			sockets[i].Close()
		default:
			sockets[i].(*net.TCPConn).SetLinger(0)
			sockets[i].Close()
		}
	}
	testutil.Eventually(t, 15*time.Second, p.allClosed)
	verify(t, []check{{"connections the proxy served", p.srv.Stats().ConnectionsOpened.Load(), uint64(connections)}})
	p.close(t)
	leaktest.VerifyNone(t, leakOptions...)
	testutil.Eventually(t, 10*time.Second, func() error {
		if now := openDescriptors(t); now > descriptorsBefore {
			return fmt.Errorf("%d file descriptors open, %d before the test", now, descriptorsBefore)
		}
		return nil
	})
}

// usable runs one message through a new channel of conn and closes the channel.
func usable(conn *amqp.Connection) error {
	channel, err := conn.Channel()
	if err != nil {
		return err
	}
	defer channel.Close()
	return roundTrip(channel)
}

// roundTrip publishes a message to a new exclusive queue and consumes and
// acknowledges it; the consumer stays.
func roundTrip(channel *amqp.Channel) error {
	q, err := channel.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	if err := channel.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("leak check")}); err != nil {
		return err
	}
	deliveries, err := channel.Consume(q.Name, "", false, true, false, false, nil)
	if err != nil {
		return err
	}
	select {
	case d := <-deliveries:
		return d.Ack(false)
	case <-time.After(10 * time.Second):
		return errors.New("no delivery within 10s")
	}
}

func openDescriptors(t testing.TB) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("counting file descriptors: %v", err)
	}
	return len(entries)
}

func TestProxyErrorsHeartbeats(t *testing.T) {
	const interval = time.Second
	p := serveProxy(t, node(t, "rabbit1"), func(o *proxy.Options) { o.Heartbeat = interval })

	t.Run("silent client is disconnected within two intervals", func(t *testing.T) {
		client := dialRaw(t, p.addr)
		if _, err := client.handshake(login{user: "guest", password: "guest", vhost: "/", heartbeat: 1}); err != nil {
			t.Fatalf("handshake: %v", err)
		}
		lastSent := time.Now()
		heartbeats := 0
		var err error
		for err == nil {
			var f frames.Frame
			f, _, err = client.next(3 * interval)
			if err == nil && f.Type == frames.FrameHeartbeat {
				heartbeats++
			}
		}
		silent := time.Since(lastSent)
		verify(t, []check{
			{"disconnected (EOF)", errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET), true},
			{"disconnected within two intervals", silent <= 2*interval+300*time.Millisecond, true},
			{"heartbeats received meanwhile", heartbeats > 0, true},
		})
		t.Logf("disconnected %v after the last frame sent, %d heartbeats received (%v)", silent.Round(time.Millisecond), heartbeats, err)
	})

	t.Run("heartbeating client stays connected", func(t *testing.T) {
		client := dialRaw(t, p.addr)
		if _, err := client.handshake(login{user: "guest", password: "guest", vhost: "/", heartbeat: 1}); err != nil {
			t.Fatalf("handshake: %v", err)
		}
		received := client.stream()
		for deadline := time.Now().Add(4 * interval); time.Now().Before(deadline); time.Sleep(interval / 3) {
			if err := client.sendHeartbeat(); err != nil {
				t.Fatalf("sending a heartbeat: %v", err)
			}
		}
		if err := client.sendMethod(1, &frames.ChannelOpen{}); err != nil {
			t.Fatalf("channel.open after 4 intervals: %v", err)
		}
		for r := range received {
			if r.err != nil {
				t.Fatalf("connection ended while the client sent heartbeats: %v", r.err)
			}
			if _, ok := r.method.(*frames.ChannelOpenOk); ok {
				return
			}
		}
	})
	testutil.Eventually(t, 5*time.Second, p.allClosed)
	verify(t, []check{{"connections closed as missed_heartbeats", p.closedBy(proxy.ReasonMissedHeartbeats), uint64(1)}})
}

func TestProxyErrorsShutdown(t *testing.T) {
	p := serveProxy(t, node(t, "rabbit1"))
	const clients = 3
	var closes []chan *amqp.Error
	for range clients {
		conn := dialURL(t, p.url)
		openChannel(t, conn)
		closes = append(closes, conn.NotifyClose(make(chan *amqp.Error, 1)))
	}
	start := time.Now()
	err := p.srv.Shutdown(testContext(t, 10*time.Second))
	took := time.Since(start)
	verify(t, []check{
		{"Shutdown's error", err, nil},
		{"Shutdown took under 5s", took < 5*time.Second, true},
	})
	for i, closed := range closes {
		select {
		case err := <-closed:
			code, text := amqpReply(err)
			verify(t, []check{
				{fmt.Sprintf("client %d: code", i), code, amqp.ConnectionForced},
				{fmt.Sprintf("client %d: text", i), text, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"},
			})
		case <-time.After(time.Second):
			t.Errorf("client %d: no connection.close after Shutdown returned", i)
		}
	}
	verify(t, []check{
		{"connections closed as shutdown", p.closedBy(proxy.ReasonShutdown), uint64(clients)},
		{"connections open", p.srv.Stats().ConnectionsOpen.Load(), int64(0)},
	})
	if conn, err := amqp.Dial(p.url); err == nil {
		conn.Close()
		t.Error("a new client connected after Shutdown")
	}
}

// proxyCloseBound bounds Server.Close in these tests: a connection that never
// ends must fail the test that caused it, not hang the whole package.
const proxyCloseBound = 15 * time.Second

// target is where an exchange runs: the node itself or the proxy in front of it.
type target struct{ name, addr string }

func directAndProxied(n *localbroker.Node, p *runningProxy) []target {
	return []target{{"direct", nodeAddr(n)}, {"proxy", p.addr}}
}

func nodeAddr(n *localbroker.Node) string { return fmt.Sprintf("127.0.0.1:%d", n.Port) }

func amqpURL(addr, user, password, vhost string) string {
	u := url.URL{Scheme: "amqp", User: url.UserPassword(user, password), Host: addr, Path: "/" + vhost}
	if vhost == "/" {
		u.Path = "/"
	}
	return u.String()
}

// assertServes checks that a new amqp091-go client gets served through url.
func assertServes(t testing.TB, url string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("a new client after the errors: %v", err)
	}
	defer conn.Close()
	if err := usable(conn); err != nil {
		t.Fatalf("a new client after the errors: %v", err)
	}
}

// amqpReply is the reply code and text of an *amqp.Error, or 0 and the error.
func amqpReply(err error) (int, string) {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e.Code, e.Reason
	}
	return 0, fmt.Sprint(err)
}

func rabbitmqctl(t testing.TB, n *localbroker.Node, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := n.Ctl(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// connectionPIDs maps the connection_name of n's AMQP connections to their
// Erlang pids; connections without a name are left out.
func connectionPIDs(t testing.TB, n *localbroker.Node) map[string]string {
	t.Helper()
	pids := map[string]string{}
	out := rabbitmqctl(t, n, "list_connections", "--no-table-headers", "pid", "client_properties")
	for _, line := range strings.Split(out, "\n") {
		const key = `{"connection_name","`
		i := strings.Index(line, key)
		if i < 0 {
			continue
		}
		name, _, _ := strings.Cut(line[i+len(key):], `"`)
		pids[name] = strings.Fields(line)[0]
	}
	return pids
}

// uniqueName names a connection after the test, for rabbitmqctl.
func uniqueName(t testing.TB, suffix string) string {
	return fmt.Sprintf("%s-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), suffix, time.Now().UnixNano())
}
