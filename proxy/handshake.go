package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// handshake takes the client from its protocol header to connection.open-ok.
// The backend does the authentication: the proxy relays connection.start
// (the backend's own server properties and capabilities), the client's SASL
// response and connection.open with the client's own credentials and vhost,
// so each broker applies its own users and permissions. Tune is negotiated
// by the proxy on both legs so that they agree on channel_max and frame_max;
// heartbeats run on each leg independently.
//
// The whole handshake is bounded by HandshakeTimeout through socket deadlines.
func (c *clientConn) handshake() error {
	deadline := time.Now().Add(c.srv.opts.HandshakeTimeout)
	c.client.Conn().SetDeadline(deadline)

	if err := c.client.ReadProtocolHeader(); err != nil {
		var fe *frames.Error
		if errors.As(err, &fe) {
			// As the spec says: answer with the header we speak, then close.
			c.client.SendProtocolHeader()
		}
		return fmt.Errorf("reading protocol header: %w", err)
	}

	f, err := c.connectHome(deadline)
	if err != nil {
		return err
	}
	// connection.start, relayed as the home backend sent it.
	if err := c.client.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
		return err
	}
	c.startRelayed = true

	tune, err := c.authenticate()
	if err != nil {
		return err
	}
	channelMax, err := c.tune(tune)
	if err != nil {
		return err
	}
	if err := c.openVHost(channelMax); err != nil {
		return err
	}
	c.client.Conn().SetDeadline(time.Time{})
	c.backend.Conn().SetDeadline(time.Time{})
	return nil
}

// authenticate relays the SASL exchange, start-ok and then any number of
// secure / secure-ok rounds, and returns the backend's connection.tune,
// which ends it.
func (c *clientConn) authenticate() (frames.ConnectionTune, error) {
	var tune frames.ConnectionTune
	f, err := c.expectClient(frames.ConnectionStartOkKey)
	if err != nil {
		return tune, err
	}
	var startOk frames.ConnectionStartOk
	if err := decodeArgs(f.Payload, &startOk); err != nil {
		return tune, c.clientSyntaxError(err)
	}
	c.user = saslUser(startOk.Mechanism, startOk.Response)
	if c.srv.opts.Mirror != nil {
		c.startOk = append([]byte(nil), f.Payload...)
		c.cancelNotify = capability(startOk.ClientProperties, "consumer_cancel_notify")
	}
	if err := c.backend.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
		return tune, c.refuseUnavailable(err)
	}
	for {
		f, err = c.readBackendHandshake()
		if err != nil {
			if backendHungUp(err) {
				return tune, c.loginDropped(err)
			}
			return tune, c.refuseUnavailable(err)
		}
		classID, methodID, _, _ := frames.ParseMethodID(f.Payload)
		switch frames.MethodKey(classID, methodID) {
		case frames.ConnectionSecureKey:
			if err := c.client.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
				return tune, err
			}
			f, err = c.expectClient(frames.ConnectionSecureOkKey)
			if err != nil {
				return tune, err
			}
			if err := c.backend.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
				return tune, c.refuseUnavailable(err)
			}
			continue
		case frames.ConnectionTuneKey:
			if err := decodeArgs(f.Payload, &tune); err != nil {
				return tune, c.refuseUnavailable(err)
			}
		case frames.ConnectionCloseKey: // authentication refused
			return tune, c.relayBackendRefusal(f.Payload)
		default:
			return tune, c.refuseUnavailable(fmt.Errorf("backend sent %s during the handshake", frames.MethodName(classID, methodID)))
		}
		return tune, nil
	}
}

// tune offers the client the backend's tune within the proxy's limits,
// settles both legs on the client's answer, and returns the channel_max
// agreed.
func (c *clientConn) tune(tune frames.ConnectionTune) (uint16, error) {
	opts := &c.srv.opts
	offer := frames.ConnectionTune{
		ChannelMax: capLimit16(tune.ChannelMax, opts.ChannelMax),
		FrameMax:   capLimit32(tune.FrameMax, opts.FrameMax),
		// The broker's own heartbeat: a client must negotiate through the
		// proxy what it would negotiate directly.
		Heartbeat: tune.Heartbeat,
	}
	if err := c.client.SendMethod(0, &offer); err != nil {
		return 0, err
	}
	f, err := c.expectClient(frames.ConnectionTuneOkKey)
	if err != nil {
		return 0, err
	}
	var tuneOk frames.ConnectionTuneOk
	if err := decodeArgs(f.Payload, &tuneOk); err != nil {
		return 0, c.clientSyntaxError(err)
	}
	if err := c.negotiate(offer, &tuneOk); err != nil {
		return 0, err
	}
	backendTuneOk := frames.ConnectionTuneOk{
		ChannelMax: tuneOk.ChannelMax,
		FrameMax:   tuneOk.FrameMax,
		Heartbeat:  uint16(c.backendHeartbeat / time.Second),
	}
	if err := c.backend.SendMethod(0, &backendTuneOk); err != nil {
		return 0, c.refuseUnavailable(err)
	}
	c.client.SetMaxFrameSize(c.frameMax)
	c.backend.SetMaxFrameSize(c.frameMax)
	c.channels = newChannelTable(tuneOk.ChannelMax)
	return tuneOk.ChannelMax, nil
}

// openVHost relays connection.open: the backend checks the vhost and the
// user's access.
func (c *clientConn) openVHost(channelMax uint16) error {
	f, err := c.expectClient(frames.ConnectionOpenKey)
	if err != nil {
		return err
	}
	var open frames.ConnectionOpen
	if err := decodeArgs(f.Payload, &open); err != nil {
		return c.clientSyntaxError(err)
	}
	c.vhost = open.VirtualHost
	c.channelMax = channelMax
	if c.srv.opts.Mirror != nil {
		c.openPayload = append([]byte(nil), f.Payload...)
	}
	if err := c.backend.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
		return c.refuseUnavailable(err)
	}
	f, err = c.readBackendHandshake()
	if err != nil {
		return c.refuseUnavailable(err)
	}
	classID, methodID, _, _ := frames.ParseMethodID(f.Payload)
	switch frames.MethodKey(classID, methodID) {
	case frames.ConnectionOpenOkKey:
	case frames.ConnectionCloseKey:
		return c.relayBackendRefusal(f.Payload)
	default:
		return c.refuseUnavailable(fmt.Errorf("backend sent %s instead of connection.open-ok", frames.MethodName(classID, methodID)))
	}
	return c.client.SendFrame(frames.FrameMethod, 0, f.Payload)
}

// negotiate checks the client's tune-ok against the offer, as RabbitMQ
// does, and fixes the limits both legs use.
func (c *clientConn) negotiate(offer frames.ConnectionTune, tuneOk *frames.ConnectionTuneOk) error {
	if tuneOk.ChannelMax == 0 {
		tuneOk.ChannelMax = offer.ChannelMax
	}
	if tuneOk.FrameMax == 0 {
		tuneOk.FrameMax = offer.FrameMax
	}
	var problem string
	switch {
	case offer.FrameMax != 0 && tuneOk.FrameMax > offer.FrameMax:
		problem = fmt.Sprintf("NOT_ALLOWED - frame_max=%d > %d max size", tuneOk.FrameMax, offer.FrameMax)
	case tuneOk.FrameMax < frames.FrameMinSize:
		problem = fmt.Sprintf("NOT_ALLOWED - frame_max=%d < %d min size", tuneOk.FrameMax, frames.FrameMinSize)
	case offer.ChannelMax != 0 && tuneOk.ChannelMax > offer.ChannelMax:
		problem = fmt.Sprintf("NOT_ALLOWED - channel_max=%d > %d max", tuneOk.ChannelMax, offer.ChannelMax)
	}
	if problem != "" {
		c.client.SendMethod(0, &frames.ConnectionClose{ReplyCode: frames.NotAllowed, ReplyText: problem, ClassID: 10, MethodID: 31})
		return errors.New(problem)
	}
	c.frameMax = tuneOk.FrameMax
	c.clientHeartbeat = time.Duration(tuneOk.Heartbeat) * time.Second
	// The backend leg keeps heartbeats even when the client turned them
	// off: the proxy must notice a dead backend on its own.
	c.backendHeartbeat = c.clientHeartbeat
	if c.backendHeartbeat == 0 {
		c.backendHeartbeat = c.srv.opts.Heartbeat
	}
	if c.backendHeartbeat == 0 {
		c.backendHeartbeat = 60 * time.Second
	}
	return nil
}

// connectHome chooses the connection's home backend and returns its
// connection.start. The backends are tried in the server's order (the
// node beside this proxy first, then the others as configured), leaving out
// those the engine counts down; one that cannot be dialled, or sends no
// connection.start in time, gives way to the next. Until the client has
// seen a connection.start nothing ties it to a backend, so the choice is
// invisible to it; from then on every answer, a refused login or vhost
// included, is the chosen backend's.
func (c *clientConn) connectHome(deadline time.Time) (frames.Frame, error) {
	var failures []string
	for i, b := range c.srv.backends {
		if m := c.srv.opts.Mirror; m != nil && m.BackendDown(b.Name) {
			failures = append(failures, fmt.Sprintf("backend %s counted down", b.Name))
			continue
		}
		c.homeIdx = i
		f, err := c.startHome(b, deadline, i == len(c.srv.backends)-1)
		if err == nil {
			return f, nil
		}
		if c.tornDown.Load() {
			return f, err
		}
		c.mu.Lock()
		c.linkFailedAt[i] = time.Now()
		c.mu.Unlock()
		failures = append(failures, fmt.Sprintf("backend %s unavailable: %v", b.Name, err))
		c.log.Debug("home backend unavailable; trying the next", "backend", b.Name, "err", err)
	}
	text := strings.Join(failures, "; ")
	if len(failures) > 1 {
		text = "no backend available (" + text + ")"
	}
	return frames.Frame{}, c.refuse(errors.New(text))
}

// startHome dials backend b and reads its connection.start. Unless b is
// the last backend to try, dial and start share one DialTimeout, so that a
// broker that accepts but does not answer (frozen, booting) leaves the next
// one the rest of the handshake.
func (c *clientConn) startHome(b Backend, deadline time.Time, last bool) (frames.Frame, error) {
	startBy := deadline
	if !last {
		startBy = minTime(deadline, time.Now().Add(c.srv.opts.DialTimeout))
	}
	conn, err := c.dialBackend(b, startBy)
	if err != nil {
		return frames.Frame{}, err
	}
	sock := wire.NewSocket(conn)
	c.mu.Lock()
	tornDown := c.tornDown.Load()
	if !tornDown {
		c.backend = sock
	}
	c.mu.Unlock()
	if tornDown { // shutdown raced with the dial
		conn.Close()
		return frames.Frame{}, errors.New("proxy shutting down")
	}
	conn.SetDeadline(startBy)
	f, err := frames.Frame{}, pki.Refusal(conn, sock.SendProtocolHeader())
	if err == nil {
		f, err = c.expectBackend(frames.ConnectionStartKey)
	}
	if err != nil {
		c.mu.Lock()
		c.backend = nil
		c.mu.Unlock()
		conn.Close()
		return f, err
	}
	conn.SetDeadline(deadline)
	return f, nil
}

func (c *clientConn) dialBackend(b Backend, deadline time.Time) (net.Conn, error) {
	ctx, cancel := context.WithDeadline(context.Background(), minTime(deadline, time.Now().Add(c.srv.opts.DialTimeout)))
	defer cancel()
	go func() { // a shutdown during the dial cancels it
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", b.Addr)
	if err != nil {
		return nil, err
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetNoDelay(true)
	}
	if b.TLS == nil {
		return conn, nil
	}
	tlsConn := tls.Client(conn, b.TLS)
	if err := tlsConn.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return tlsConn, nil
}

// refuseUnavailable tells the client the backend could not serve it. Before
// the client has seen connection.start there is no AMQP way to say so, so the
// proxy sends its own start, waits for start-ok and then closes with 320
// CONNECTION_FORCED and a text that names the backend and the cause.
func (c *clientConn) refuseUnavailable(cause error) error {
	return c.refuse(fmt.Errorf("backend %s unavailable: %w", c.homeName(), cause))
}

// refuse ends the handshake with 320 CONNECTION_FORCED and err's text, as
// refuseUnavailable says.
func (c *clientConn) refuse(err error) error {
	c.mu.Lock()
	c.reason, c.detail = ReasonBackendUnavailable, err.Error()
	if c.backend != nil {
		c.backendClosed = true
		c.backend.Conn().Close()
	}
	c.mu.Unlock()
	if c.client.Conn().SetDeadline(time.Now().Add(c.srv.opts.CloseTimeout)) != nil {
		return err
	}
	if !c.startRelayed {
		start := &frames.ConnectionStart{
			VersionMajor: 0, VersionMinor: 9,
			ServerProperties: frames.Table{{Key: "product", Value: "amqp-mirror"}},
			Mechanisms:       "PLAIN AMQPLAIN",
			Locales:          "en_US",
		}
		if c.client.SendMethod(0, start) != nil {
			return err
		}
		if _, rerr := c.expectClient(frames.ConnectionStartOkKey); rerr != nil {
			return err
		}
	}
	c.client.SendMethod(0, &frames.ConnectionClose{
		ReplyCode: frames.ConnectionForced,
		ReplyText: "CONNECTION_FORCED - " + err.Error(),
	})
	c.awaitClientCloseOk()
	return err
}

// loginDropped ends a handshake whose backend closed the socket after the
// client's start-ok. That is how RabbitMQ refuses credentials to a client that
// did not announce the authentication_failure_close capability (amqp091-go,
// for one): it waits a few seconds and hangs up. The client must see the same,
// a closed socket, which its library reports as bad credentials; a
// connection.close of the proxy's own would turn a wrong password into a 320.
func (c *clientConn) loginDropped(cause error) error {
	c.mu.Lock()
	c.backendClosed = true
	c.mu.Unlock()
	c.backend.Conn().Close()
	return fmt.Errorf("backend %s closed the connection after start-ok (credentials refused): %w", c.homeName(), cause)
}

// backendHungUp reports read errors that mean the backend closed the socket.
func backendHungUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// relayBackendRefusal passes the backend's connection.close (bad
// credentials, unknown vhost, no access) to the client and ends the handshake.
func (c *clientConn) relayBackendRefusal(payload []byte) error {
	var cl frames.ConnectionClose
	if err := decodeArgs(payload, &cl); err != nil {
		return c.refuseUnavailable(err)
	}
	c.mu.Lock()
	c.backendClosed = true
	c.mu.Unlock()
	c.backend.SendMethod(0, &frames.ConnectionCloseOk{})
	c.client.SendFrame(frames.FrameMethod, 0, payload)
	c.awaitClientCloseOk()
	return fmt.Errorf("backend refused the connection: %d %s", cl.ReplyCode, cl.ReplyText)
}

// awaitClientCloseOk reads until the client's close-ok, an error or the
// socket deadline.
func (c *clientConn) awaitClientCloseOk() {
	for {
		f, err := c.client.ReadFrame()
		if err != nil {
			return
		}
		if f.Type == frames.FrameMethod && f.Channel == 0 && isMethod(f.Payload, frames.ConnectionCloseOkKey) {
			return
		}
	}
}

// expectClient reads the next client frame during the handshake and requires
// the given connection method. Anything else is answered like RabbitMQ does.
func (c *clientConn) expectClient(want uint32) (frames.Frame, error) {
	for {
		f, err := c.client.ReadFrame()
		if err != nil {
			var fe *frames.Error
			if errors.As(err, &fe) {
				c.client.SendMethod(0, &frames.ConnectionClose{ReplyCode: fe.Code, ReplyText: fe.ReplyText()})
			}
			return f, fmt.Errorf("waiting for %s: %w", keyName(want), err)
		}
		if f.Type == frames.FrameHeartbeat {
			continue
		}
		gotClass, gotMethod, _, perr := frames.ParseMethodID(f.Payload)
		if f.Type == frames.FrameMethod && perr == nil && !definedMethod(gotClass, gotMethod) {
			// RabbitMQ drops the socket, in the handshake as later.
			resetOnClose(c.client.Conn())
			return f, fmt.Errorf("waiting for %s: %w", keyName(want), undefinedMethod(gotClass, gotMethod))
		}
		if f.Type != frames.FrameMethod || perr != nil || f.Channel != 0 || frames.MethodKey(gotClass, gotMethod) != want {
			got := frameDescription(f)
			text := fmt.Sprintf("COMMAND_INVALID - expected %s, got %s", keyName(want), got)
			c.client.SendMethod(0, &frames.ConnectionClose{ReplyCode: frames.CommandInvalid, ReplyText: text, ClassID: gotClass, MethodID: gotMethod})
			return f, errors.New(text)
		}
		return f, nil
	}
}

// expectBackend reads the next backend frame during the handshake and
// requires the given connection method.
func (c *clientConn) expectBackend(want uint32) (frames.Frame, error) {
	f, err := c.readBackendHandshake()
	if err != nil {
		return f, err
	}
	if !isMethod(f.Payload, want) {
		return f, fmt.Errorf("expected %s, got %s", keyName(want), frameDescription(f))
	}
	return f, nil
}

// readBackendHandshake reads the backend's next method frame on channel 0.
func (c *clientConn) readBackendHandshake() (frames.Frame, error) {
	for {
		f, err := c.backend.ReadFrame()
		if err != nil {
			return f, err
		}
		if f.Type == frames.FrameHeartbeat {
			continue
		}
		if f.Type != frames.FrameMethod || f.Channel != 0 {
			return f, fmt.Errorf("unexpected %s during the handshake", frameDescription(f))
		}
		return f, nil
	}
}

// clientSyntaxError closes the client connection for an undecodable
// handshake method.
func (c *clientConn) clientSyntaxError(err error) error {
	code, text := uint16(frames.SyntaxError), "SYNTAX_ERROR - "+err.Error()
	var fe *frames.Error
	if errors.As(err, &fe) {
		code, text = fe.Code, fe.ReplyText()
	}
	c.client.SendMethod(0, &frames.ConnectionClose{ReplyCode: code, ReplyText: text})
	return err
}

// capability reports whether a client's properties announce a capability.
func capability(clientProperties frames.Table, name string) bool {
	v, ok := clientProperties.Get("capabilities")
	if !ok {
		return false
	}
	capabilities, ok := v.(frames.Table)
	if !ok {
		return false
	}
	on, _ := capabilities.Get(name)
	b, _ := on.(bool)
	return b
}

// saslUser extracts the user name from a SASL response, for logs only. The
// password is never kept or logged.
func saslUser(mechanism, response string) string {
	switch mechanism {
	case "PLAIN": // authzid NUL authcid NUL passwd
		parts := bytes.SplitN([]byte(response), []byte{0}, 3)
		if len(parts) == 3 {
			return string(parts[1])
		}
	case "AMQPLAIN": // a field table without its length prefix
		buf := make([]byte, 4+len(response))
		binary.BigEndian.PutUint32(buf, uint32(len(response)))
		copy(buf[4:], response)
		if t, _, err := frames.DecodeTable(buf); err == nil {
			if v, ok := t.Get("LOGIN"); ok {
				if s, ok := v.(string); ok {
					return s
				}
			}
		}
	}
	return ""
}

func decodeArgs(payload []byte, m frames.Method) error {
	_, _, args, err := frames.ParseMethodID(payload)
	if err != nil {
		return err
	}
	return m.Decode(args)
}

func keyName(key uint32) string { return frames.MethodName(uint16(key>>16), uint16(key)) }

func frameDescription(f frames.Frame) string {
	switch f.Type {
	case frames.FrameMethod:
		classID, methodID, _, err := frames.ParseMethodID(f.Payload)
		if err != nil {
			return "a malformed method frame"
		}
		return fmt.Sprintf("%s on channel %d", frames.MethodName(classID, methodID), f.Channel)
	}
	return fmt.Sprintf("a %s frame on channel %d", frames.FrameTypeName(f.Type), f.Channel)
}

// capLimit16 combines the backend's limit with the proxy's: 0 means none.
func capLimit16(backend, proxy uint16) uint16 {
	if backend == 0 || (proxy != 0 && proxy < backend) {
		return proxy
	}
	return backend
}

func capLimit32(backend, proxy uint32) uint32 {
	if backend == 0 || (proxy != 0 && proxy < backend) {
		return proxy
	}
	return backend
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
