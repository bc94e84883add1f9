package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// opening is a client connection's handshake, from the client's protocol
// header to connection.open-ok: it chooses the home backend, relays the
// login and the vhost, and settles the connection's terms. It runs on the
// connection's goroutine before the connection serves, and hands what it
// established to the connection (established); teardown may abort it from
// another goroutine.
type opening struct {
	srv    *Server
	client *wire.Socket
	log    *slog.Logger
	// ctx ends with the connection: it cancels a dial in progress.
	ctx context.Context
	// deadline bounds the whole handshake (HandshakeTimeout).
	deadline time.Time
	// startRelayed is set once the client has seen connection.start.
	startRelayed bool
	// homeIdx is the backend the handshake talks to (connectHome).
	homeIdx int
	// terms are what the handshake settled so far.
	terms terms
	// failedAt is when each backend that could not be home failed, by
	// backend index; nil until one failed.
	failedAt []time.Time

	// mu guards backend and aborted, which teardown reaches from another
	// goroutine; the handshake's goroutine, the only one to set backend,
	// reads it without the lock.
	mu sync.Mutex
	// backend is the socket to the home backend; nil until dialled.
	backend *wire.Socket
	// aborted is set once the connection ended: no socket may open after.
	aborted bool
}

// terms are what a connection's handshake settled, set once before the
// connection serves and only read after: who the client is and where, the
// limits both legs keep, and what opens further links.
type terms struct {
	user, vhost      string
	frameMax         uint32
	channelMax       uint16
	clientHeartbeat  time.Duration
	backendHeartbeat time.Duration
	// startOk and openPayload are the client's start-ok (its credentials)
	// and connection.open, kept with mirroring to open further links.
	startOk, openPayload []byte
	// cancelNotify: the client announced consumer_cancel_notify, so it may
	// be sent basic.cancel (failover.go); RabbitMQ sends it only then.
	cancelNotify bool
}

// established is what a finished handshake hands the connection.
type established struct {
	home  *link
	terms terms
	// failedAt is when backends tried before home failed, by backend
	// index; nil when none did.
	failedAt []time.Time
}

// unavailableError is a handshake refused for want of a backend, which
// refuse tells the client with 320 CONNECTION_FORCED.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

func newOpening(ctx context.Context, srv *Server, client *wire.Socket, log *slog.Logger) *opening {
	return &opening{srv: srv, client: client, log: log, ctx: ctx}
}

// holdBackend makes sock the handshake's backend socket, which abort
// closes. It reports false, having closed sock, when the connection ended
// meanwhile.
func (o *opening) holdBackend(sock *wire.Socket) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.aborted {
		sock.Conn().Close()
		return false
	}
	o.backend = sock
	return true
}

// dropBackend closes the backend socket, when there is one, and forgets
// it: the backend cannot be home, or the handshake ends without it.
func (o *opening) dropBackend() {
	o.mu.Lock()
	sock := o.backend
	o.backend = nil
	o.mu.Unlock()
	if sock != nil {
		sock.Conn().Close()
	}
}

// abort ends the handshake from teardown: the backend socket closes (with
// a TCP reset if reset is set, as for a paused proxy's links), and none
// opens after.
func (o *opening) abort(reset bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.aborted = true
	if o.backend == nil {
		return
	}
	if reset {
		resetOnClose(o.backend.Conn())
	}
	o.backend.Conn().Close()
}

// isAborted reports whether the connection ended: its context, which
// teardown cancels first, or abort, which comes after.
func (o *opening) isAborted() bool {
	if o.ctx.Err() != nil {
		return true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.aborted
}

// backendName names the backend the handshake talks to.
func (o *opening) backendName() string { return o.srv.backends[o.homeIdx].Name }

// handshake takes the client from its protocol header to connection.open-ok.
// The backend does the authentication: the proxy relays connection.start
// (the backend's own server properties and capabilities), the client's SASL
// response and connection.open with the client's own credentials and vhost,
// so each broker applies its own users and permissions. Tune is negotiated
// by the proxy on both legs so that they agree on channel_max and frame_max;
// heartbeats run on each leg independently.
//
// The whole handshake is bounded by HandshakeTimeout through socket deadlines.
func (o *opening) handshake() (established, error) {
	o.deadline = time.Now().Add(o.srv.opts.HandshakeTimeout)
	o.client.Conn().SetDeadline(o.deadline)

	if err := o.client.ReadProtocolHeader(); err != nil {
		var fe *frames.Error
		if errors.As(err, &fe) {
			// As the spec says: answer with the header we speak, then close.
			o.client.SendProtocolHeader()
		}
		return established{}, fmt.Errorf("reading protocol header: %w", err)
	}

	f, err := o.connectHome()
	if err != nil {
		return established{}, err
	}
	// connection.start, relayed as the home backend sent it.
	if err := o.client.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
		return established{}, err
	}
	o.startRelayed = true

	tune, err := o.authenticate()
	if err != nil {
		return established{}, err
	}
	if err := o.tune(tune); err != nil {
		return established{}, err
	}
	if err := o.openVHost(); err != nil {
		return established{}, err
	}
	o.client.Conn().SetDeadline(time.Time{})
	o.backend.Conn().SetDeadline(time.Time{})
	return established{
		home:     newLink(o.homeIdx, o.backendName(), 1, o.backend),
		terms:    o.terms,
		failedAt: o.failedAt,
	}, nil
}

// authenticate relays the SASL exchange, start-ok and then any number of
// secure / secure-ok rounds, and returns the backend's connection.tune,
// which ends it.
func (o *opening) authenticate() (frames.ConnectionTune, error) {
	var tune frames.ConnectionTune
	f, err := o.expectClient(frames.ConnectionStartOkKey)
	if err != nil {
		return tune, err
	}
	var startOk frames.ConnectionStartOk
	if err := decodeArgs(f.Payload, &startOk); err != nil {
		return tune, o.clientSyntaxError(err)
	}
	o.terms.user = saslUser(startOk.Mechanism, startOk.Response)
	if o.srv.opts.Mirror != nil {
		o.terms.startOk = append([]byte(nil), f.Payload...)
		o.terms.cancelNotify = capability(startOk.ClientProperties, "consumer_cancel_notify")
	}
	if err := o.backend.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
		return tune, o.refuseUnavailable(err)
	}
	for {
		f, err = o.readBackendHandshake()
		if err != nil {
			if backendHungUp(err) {
				return tune, o.loginDropped(err)
			}
			return tune, o.refuseUnavailable(err)
		}
		classID, methodID, _, _ := frames.ParseMethodID(f.Payload)
		switch frames.MethodKey(classID, methodID) {
		case frames.ConnectionSecureKey:
			if err := o.client.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
				return tune, err
			}
			f, err = o.expectClient(frames.ConnectionSecureOkKey)
			if err != nil {
				return tune, err
			}
			if err := o.backend.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
				return tune, o.refuseUnavailable(err)
			}
			continue
		case frames.ConnectionTuneKey:
			if err := decodeArgs(f.Payload, &tune); err != nil {
				return tune, o.refuseUnavailable(err)
			}
		case frames.ConnectionCloseKey: // authentication refused
			return tune, o.relayBackendRefusal(f.Payload)
		default:
			return tune, o.refuseUnavailable(fmt.Errorf("backend sent %s during the handshake", frames.MethodName(classID, methodID)))
		}
		return tune, nil
	}
}

// tune offers the client the backend's tune within the proxy's limits and
// settles both legs on the client's answer.
func (o *opening) tune(tune frames.ConnectionTune) error {
	opts := &o.srv.opts
	offer := frames.ConnectionTune{
		ChannelMax: capLimit16(tune.ChannelMax, opts.ChannelMax),
		FrameMax:   capLimit32(tune.FrameMax, opts.FrameMax),
		// The broker's own heartbeat: a client must negotiate through the
		// proxy what it would negotiate directly.
		Heartbeat: tune.Heartbeat,
	}
	if err := o.client.SendMethod(0, &offer); err != nil {
		return err
	}
	f, err := o.expectClient(frames.ConnectionTuneOkKey)
	if err != nil {
		return err
	}
	var tuneOk frames.ConnectionTuneOk
	if err := decodeArgs(f.Payload, &tuneOk); err != nil {
		return o.clientSyntaxError(err)
	}
	if err := o.negotiate(offer, &tuneOk); err != nil {
		return err
	}
	backendTuneOk := frames.ConnectionTuneOk{
		ChannelMax: tuneOk.ChannelMax,
		FrameMax:   tuneOk.FrameMax,
		Heartbeat:  uint16(o.terms.backendHeartbeat / time.Second),
	}
	if err := o.backend.SendMethod(0, &backendTuneOk); err != nil {
		return o.refuseUnavailable(err)
	}
	o.client.SetMaxFrameSize(o.terms.frameMax)
	o.backend.SetMaxFrameSize(o.terms.frameMax)
	return nil
}

// openVHost relays connection.open: the backend checks the vhost and the
// user's access.
func (o *opening) openVHost() error {
	f, err := o.expectClient(frames.ConnectionOpenKey)
	if err != nil {
		return err
	}
	var open frames.ConnectionOpen
	if err := decodeArgs(f.Payload, &open); err != nil {
		return o.clientSyntaxError(err)
	}
	o.terms.vhost = open.VirtualHost
	if o.srv.opts.Mirror != nil {
		o.terms.openPayload = append([]byte(nil), f.Payload...)
	}
	if err := o.backend.SendFrame(frames.FrameMethod, 0, f.Payload); err != nil {
		return o.refuseUnavailable(err)
	}
	f, err = o.readBackendHandshake()
	if err != nil {
		return o.refuseUnavailable(err)
	}
	classID, methodID, _, _ := frames.ParseMethodID(f.Payload)
	switch frames.MethodKey(classID, methodID) {
	case frames.ConnectionOpenOkKey:
	case frames.ConnectionCloseKey:
		return o.relayBackendRefusal(f.Payload)
	default:
		return o.refuseUnavailable(fmt.Errorf("backend sent %s instead of connection.open-ok", frames.MethodName(classID, methodID)))
	}
	return o.client.SendFrame(frames.FrameMethod, 0, f.Payload)
}

// negotiate checks the client's tune-ok against the offer, as RabbitMQ
// does, and fixes the limits both legs use.
func (o *opening) negotiate(offer frames.ConnectionTune, tuneOk *frames.ConnectionTuneOk) error {
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
		o.client.SendMethod(0, &frames.ConnectionClose{ReplyCode: frames.NotAllowed, ReplyText: problem, ClassID: 10, MethodID: 31})
		return errors.New(problem)
	}
	o.terms.frameMax = tuneOk.FrameMax
	o.terms.channelMax = tuneOk.ChannelMax
	o.terms.clientHeartbeat = time.Duration(tuneOk.Heartbeat) * time.Second
	// The backend leg keeps heartbeats even when the client turned them
	// off: the proxy must notice a dead backend on its own.
	o.terms.backendHeartbeat = o.terms.clientHeartbeat
	if o.terms.backendHeartbeat == 0 {
		o.terms.backendHeartbeat = o.srv.opts.Heartbeat
	}
	if o.terms.backendHeartbeat == 0 {
		o.terms.backendHeartbeat = 60 * time.Second
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
func (o *opening) connectHome() (frames.Frame, error) {
	var failures []string
	for i, b := range o.srv.backends {
		if m := o.srv.opts.Mirror; m != nil && m.BackendDown(b.Name) {
			failures = append(failures, fmt.Sprintf("backend %s counted down", b.Name))
			continue
		}
		o.homeIdx = i
		f, err := o.startHome(b, i == len(o.srv.backends)-1)
		if err == nil {
			return f, nil
		}
		if o.isAborted() {
			return f, err
		}
		if o.failedAt == nil {
			o.failedAt = make([]time.Time, len(o.srv.backends))
		}
		o.failedAt[i] = time.Now()
		failures = append(failures, fmt.Sprintf("backend %s unavailable: %v", b.Name, err))
		o.log.Debug("home backend unavailable; trying the next", "backend", b.Name, "err", err)
	}
	text := strings.Join(failures, "; ")
	if len(failures) > 1 {
		text = "no backend available (" + text + ")"
	}
	return frames.Frame{}, o.refuse(errors.New(text))
}

// startHome dials backend b and reads its connection.start. Unless b is
// the last backend to try, dial and start share one DialTimeout, so that a
// broker that accepts but does not answer (frozen, booting) leaves the next
// one the rest of the handshake.
func (o *opening) startHome(b Backend, last bool) (frames.Frame, error) {
	startBy := o.deadline
	if !last {
		startBy = minTime(o.deadline, time.Now().Add(o.srv.opts.DialTimeout))
	}
	conn, err := dialBackend(o.ctx, b, minTime(startBy, time.Now().Add(o.srv.opts.DialTimeout)))
	if err != nil {
		return frames.Frame{}, err
	}
	if !o.holdBackend(wire.NewSocket(conn)) { // shutdown raced with the dial
		return frames.Frame{}, errors.New("proxy shutting down")
	}
	conn.SetDeadline(startBy)
	f, err := frames.Frame{}, pki.Refusal(conn, o.backend.SendProtocolHeader())
	if err == nil {
		f, err = o.expectBackend(frames.ConnectionStartKey)
	}
	if err != nil {
		o.dropBackend()
		return f, err
	}
	conn.SetDeadline(o.deadline)
	return f, nil
}

// dialBackend connects to backend b, over TLS when b says so, by deadline;
// ctx's end cancels the dial.
func dialBackend(ctx context.Context, b Backend, deadline time.Time) (net.Conn, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
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
func (o *opening) refuseUnavailable(cause error) error {
	return o.refuse(fmt.Errorf("backend %s unavailable: %w", o.backendName(), cause))
}

// refuse ends the handshake with 320 CONNECTION_FORCED and err's text, as
// refuseUnavailable says, and returns err as an unavailableError.
func (o *opening) refuse(err error) error {
	o.dropBackend()
	refused := &unavailableError{err}
	if o.client.Conn().SetDeadline(time.Now().Add(o.srv.opts.CloseTimeout)) != nil {
		return refused
	}
	if !o.startRelayed {
		start := &frames.ConnectionStart{
			VersionMajor: 0, VersionMinor: 9,
			ServerProperties: frames.Table{{Key: "product", Value: "amqp-mirror"}},
			Mechanisms:       "PLAIN AMQPLAIN",
			Locales:          "en_US",
		}
		if o.client.SendMethod(0, start) != nil {
			return refused
		}
		if _, rerr := o.expectClient(frames.ConnectionStartOkKey); rerr != nil {
			return refused
		}
	}
	o.client.SendMethod(0, &frames.ConnectionClose{
		ReplyCode: frames.ConnectionForced,
		ReplyText: "CONNECTION_FORCED - " + err.Error(),
	})
	o.awaitClientCloseOk()
	return refused
}

// loginDropped ends a handshake whose backend closed the socket after the
// client's start-ok. That is how RabbitMQ refuses credentials to a client that
// did not announce the authentication_failure_close capability (amqp091-go,
// for one): it waits a few seconds and hangs up. The client must see the same,
// a closed socket, which its library reports as bad credentials; a
// connection.close of the proxy's own would turn a wrong password into a 320.
func (o *opening) loginDropped(cause error) error {
	o.dropBackend()
	return fmt.Errorf("backend %s closed the connection after start-ok (credentials refused): %w", o.backendName(), cause)
}

// backendHungUp reports read errors that mean the backend closed the socket.
func backendHungUp(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

// relayBackendRefusal passes the backend's connection.close (bad
// credentials, unknown vhost, no access) to the client and ends the handshake.
func (o *opening) relayBackendRefusal(payload []byte) error {
	var cl frames.ConnectionClose
	if err := decodeArgs(payload, &cl); err != nil {
		return o.refuseUnavailable(err)
	}
	o.backend.SendMethod(0, &frames.ConnectionCloseOk{})
	o.client.SendFrame(frames.FrameMethod, 0, payload)
	o.awaitClientCloseOk()
	return fmt.Errorf("backend refused the connection: %d %s", cl.ReplyCode, cl.ReplyText)
}

// awaitClientCloseOk reads until the client's close-ok, an error or the
// socket deadline.
func (o *opening) awaitClientCloseOk() {
	for {
		f, err := o.client.ReadFrame()
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
func (o *opening) expectClient(want uint32) (frames.Frame, error) {
	for {
		f, err := o.client.ReadFrame()
		if err != nil {
			var fe *frames.Error
			if errors.As(err, &fe) {
				o.client.SendMethod(0, &frames.ConnectionClose{ReplyCode: fe.Code, ReplyText: fe.ReplyText()})
			}
			return f, fmt.Errorf("waiting for %s: %w", keyName(want), err)
		}
		if f.Type == frames.FrameHeartbeat {
			continue
		}
		gotClass, gotMethod, _, perr := frames.ParseMethodID(f.Payload)
		if f.Type == frames.FrameMethod && perr == nil && !definedMethod(gotClass, gotMethod) {
			// RabbitMQ drops the socket, in the handshake as later.
			resetOnClose(o.client.Conn())
			return f, fmt.Errorf("waiting for %s: %w", keyName(want), undefinedMethod(gotClass, gotMethod))
		}
		if f.Type != frames.FrameMethod || perr != nil || f.Channel != 0 || frames.MethodKey(gotClass, gotMethod) != want {
			got := frameDescription(f)
			text := fmt.Sprintf("COMMAND_INVALID - expected %s, got %s", keyName(want), got)
			o.client.SendMethod(0, &frames.ConnectionClose{ReplyCode: frames.CommandInvalid, ReplyText: text, ClassID: gotClass, MethodID: gotMethod})
			return f, errors.New(text)
		}
		return f, nil
	}
}

// expectBackend reads the next backend frame during the handshake and
// requires the given connection method.
func (o *opening) expectBackend(want uint32) (frames.Frame, error) {
	f, err := o.readBackendHandshake()
	if err != nil {
		return f, err
	}
	if !isMethod(f.Payload, want) {
		return f, fmt.Errorf("expected %s, got %s", keyName(want), frameDescription(f))
	}
	return f, nil
}

// readBackendHandshake reads the backend's next method frame on channel 0.
func (o *opening) readBackendHandshake() (frames.Frame, error) {
	for {
		f, err := o.backend.ReadFrame()
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
func (o *opening) clientSyntaxError(err error) error {
	code, text := uint16(frames.SyntaxError), "SYNTAX_ERROR - "+err.Error()
	var fe *frames.Error
	if errors.As(err, &fe) {
		code, text = fe.Code, fe.ReplyText()
	}
	o.client.SendMethod(0, &frames.ConnectionClose{ReplyCode: code, ReplyText: text})
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
