package proxy

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/internal/pki"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/wire"
)

// link is a client connection's connection to one backend. The home link
// is the one the handshake opened (connectHome); with mirroring, links to the
// other backends open when the connection first needs them, with the
// client's own credentials, so that every broker authenticates and
// authorises the client as always. The credentials (the client's start-ok
// and open) stay in memory for the connection's life, as RabbitMQ's
// shovels keep theirs, and are never logged.
//
// A link is one socket with its own read loop (linkKeeper.linkLoop). It is identified
// by its backend index and a generation: a link that is lost and opened
// again gets a new generation, so that a delivery tag from the old one can
// never settle a message of the new one.
type link struct {
	idx  int
	name string
	gen  uint64
	sock *wire.Socket
	done chan struct{} // closed when the read loop returns

	mu sync.Mutex // guards the fields below
	// chans holds the link's side of each client channel, by channel id.
	chans map[uint16]*linkChannel
	// lost is set once the link failed; it is never used again.
	lost bool
	// closed is set when the connection-level close handshake ended.
	closed bool

	// Scratch for the read loop.
	deliver       frames.BasicDeliver
	getOk         frames.BasicGetOk
	cancel        frames.BasicCancel
	backAck       frames.BasicAck
	backNack      frames.BasicNack
	confirmed     []ledger.ClientConfirm
	missed        []ledger.MissedCopy
	refused       []ledger.RefusedPublish // scratch for confirm
	headerScratch []byte
}

// linkChannel is one client channel's channel on one backend link.
type linkChannel struct {
	// open: channel.open was sent and no close since. The client loop sets
	// it; the replays (qos, confirm.select, tx.select) follow the open.
	open    bool
	confirm bool // confirm.select sent on this link's channel
	closing bool // the proxy sent channel.close; frames until its close-ok are dropped
	// clientClosing: the client's channel.close went to the link and its
	// close-ok has not come.
	clientClosing bool
	// owesCloseOk: the broker closed the channel too while the proxy's or
	// the client's close was out; the proxy's close-ok to it follows the
	// broker's answer to that close (closeOkArrived).
	owesCloseOk bool
	replies     []*rpcGroup
	assembled   message // content being assembled (read loop only)
}

func newLink(idx int, name string, gen uint64, sock *wire.Socket) *link {
	return &link{idx: idx, name: name, gen: gen, sock: sock, done: make(chan struct{}), chans: make(map[uint16]*linkChannel)}
}

// channelLocked returns the link's side of client channel id, made on first
// use. Callers hold l.mu.
func (l *link) channelLocked(id uint16) *linkChannel {
	lc := l.chans[id]
	if lc == nil {
		lc = &linkChannel{}
		l.chans[id] = lc
	}
	return lc
}

// channelSide returns the link's side of client channel id (nil when the
// link never had it) and whether the proxy's close of it is out.
func (l *link) channelSide(id uint16) (lc *linkChannel, closing bool) {
	l.mu.Lock() // no defer: every frame from the link comes here
	lc = l.chans[id]
	closing = lc != nil && lc.closing
	l.mu.Unlock()
	return lc, closing
}

// channelOpen reports whether client channel id is open on the link.
func (l *link) channelOpen(id uint16) bool {
	l.mu.Lock() // no defer: every publish comes here
	lc := l.chans[id]
	open := lc != nil && lc.open
	l.mu.Unlock()
	return open
}

// openChannel records that channel.open of client channel id goes to the
// link.
func (l *link) openChannel(id uint16) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc := l.channelLocked(id)
	lc.open, lc.confirm, lc.closing = true, false, false
}

// selectConfirm records that channel id is in confirm mode on the link,
// and reports whether it was not yet (confirm.select is to be sent).
func (l *link) selectConfirm(id uint16) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc := l.channelLocked(id)
	send := !lc.confirm
	lc.confirm = true
	return send
}

// beginProxyClose starts the proxy's close of channel id on the link, with
// g to count its close-ok, and reports false when the channel is not open
// there.
func (l *link) beginProxyClose(id uint16, g *rpcGroup) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc := l.chans[id]
	if lc == nil || !lc.open {
		return false
	}
	lc.open, lc.closing = false, true
	lc.replies = append(lc.replies, g)
	return true
}

// proxyCloseOk ends the proxy's close of channel id on the link.
func (l *link) proxyCloseOk(id uint16) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc := l.chans[id]; lc != nil {
		lc.closing = false
	}
}

// beginClientClose records that the client's channel.close of id goes to
// the link, and reports false when the channel is not open there.
func (l *link) beginClientClose(id uint16) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc := l.chans[id]
	if lc == nil || !lc.open {
		return false
	}
	lc.open, lc.clientClosing = false, true
	return true
}

// owesCloseOk records that the proxy owes the broker close-ok for its
// close of channel id, sent after the broker's answer (closeOkArrived).
func (l *link) owesCloseOk(id uint16) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.channelLocked(id).owesCloseOk = true
}

// brokerCloses applies the broker's channel.close of id to the link's side.
// crossed: the proxy's or the client's close is out to the link, and the
// broker's crossed it. The broker answers that close with close-ok, and
// frees the channel at ours, which waits for that answer (closeOkArrived):
// answered at once, the broker's close-ok came after the client had closed
// the channel, or reopened it, and reached the client. The broker answers
// nothing sent before the close that is not answered yet: only the close's
// own reply stays owed (the client sends nothing after its close), and the
// earlier ones are returned in abandoned. Otherwise the channel is closed
// on the link, wasOpen says whether it was open, and every reply owed is
// abandoned: the link answers nothing more on the channel but the close
// handshake.
func (l *link) brokerCloses(id uint16) (crossed, wasOpen bool, abandoned []*rpcGroup) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc := l.channelLocked(id)
	if (lc.closing || lc.clientClosing) && !lc.open {
		lc.owesCloseOk = true
		if lc.clientClosing && len(lc.replies) > 1 {
			abandoned = lc.replies[: len(lc.replies)-1 : len(lc.replies)-1]
			lc.replies = lc.replies[len(lc.replies)-1:]
		}
		return true, false, abandoned
	}
	wasOpen = lc.open
	lc.open = false
	abandoned = lc.replies
	lc.replies = nil
	return false, wasOpen, abandoned
}

// openWithReplays records that channel.open of id goes to the link, followed
// by the replays of what the client set on the channel (confirm: with
// confirm.select among them), and that the link owes replies for them. It
// reports false when the channel is open there already.
func (l *link) openWithReplays(id uint16, replies int, confirm bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc := l.channelLocked(id)
	if lc.open {
		return false
	}
	lc.open, lc.confirm = true, confirm
	for range replies {
		lc.replies = append(lc.replies, nil)
	}
	return true
}

// lose marks the link lost, never to be used again, and hands over the
// link's sides of the client channels, for the loss to settle.
func (l *link) lose() map[uint16]*linkChannel {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost = true
	chans := l.chans
	l.chans = map[uint16]*linkChannel{}
	return chans
}

// isLost reports whether the link failed.
func (l *link) isLost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// expect queues a reply the link owes on channel id, for g (nil: swallow it).
func (l *link) expect(id uint16, g *rpcGroup) {
	l.mu.Lock()
	lc := l.channelLocked(id)
	lc.replies = append(lc.replies, g)
	l.mu.Unlock()
}

// nextReply takes the oldest reply the link owes on channel id; ok is false
// when it owes none (the reply answers nothing the proxy sent).
func (l *link) nextReply(id uint16) (g *rpcGroup, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc := l.chans[id]
	if lc == nil || len(lc.replies) == 0 {
		return nil, false
	}
	g = lc.replies[0]
	lc.replies[0] = nil
	lc.replies = lc.replies[1:]
	if len(lc.replies) == 0 {
		lc.replies = nil
	}
	return g, true
}

// closeOkArrived ends, on the link's side of channel id, a close of the
// proxy's or the client's, and sends the close-ok the proxy owes for a close
// of the broker's that crossed it. A broker frees the channel at that
// close-ok: sent before the broker's answer, it could let the answer be
// lost, or let it reach the client after the channel was closed there.
func (l *link) closeOkArrived(id uint16) error {
	l.mu.Lock()
	owes := false
	if lc := l.chans[id]; lc != nil {
		owes = lc.owesCloseOk
		lc.owesCloseOk, lc.clientClosing = false, false
	}
	l.mu.Unlock()
	if !owes {
		return nil
	}
	return l.sock.SendMethod(id, &frames.ChannelCloseOk{})
}

// logIn connects to backend b and opens an AMQP connection on it with the
// client's credentials and vhost and the limits negotiated with the client
// (t), by deadline.
func logIn(ctx context.Context, b Backend, t *terms, deadline time.Time) (*wire.Socket, error) {
	conn, err := dialBackend(ctx, b, deadline)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", b.Name, err)
	}
	s := wire.NewSocket(conn)
	fail := func(err error) (*wire.Socket, error) {
		conn.Close()
		return nil, fmt.Errorf("backend %s: %w", b.Name, err)
	}
	conn.SetDeadline(deadline)
	if err := pki.Refusal(conn, s.SendProtocolHeader()); err != nil {
		return fail(err)
	}
	expect := func(want uint32) (frames.Frame, error) {
		for {
			f, err := s.ReadFrame()
			if err != nil {
				return f, err
			}
			if f.Type == frames.FrameHeartbeat {
				continue
			}
			if isMethod(f.Payload, frames.ConnectionCloseKey) {
				var cl frames.ConnectionClose
				decodeArgs(f.Payload, &cl)
				return f, fmt.Errorf("refused: %d %s", cl.ReplyCode, cl.ReplyText)
			}
			if f.Type != frames.FrameMethod || !isMethod(f.Payload, want) {
				return f, fmt.Errorf("expected %s, got %s", keyName(want), frameDescription(f))
			}
			return f, nil
		}
	}
	if _, err := expect(frames.ConnectionStartKey); err != nil {
		return fail(err)
	}
	if err := s.SendFrame(frames.FrameMethod, 0, t.startOk); err != nil {
		return fail(err)
	}
	if _, err := expect(frames.ConnectionTuneKey); err != nil {
		return fail(fmt.Errorf("login (only mechanisms without a challenge open further links): %w", err))
	}
	tuneOk := frames.ConnectionTuneOk{
		ChannelMax: t.channelMax,
		FrameMax:   t.frameMax,
		Heartbeat:  uint16(t.backendHeartbeat / time.Second),
	}
	if err := s.SendMethod(0, &tuneOk); err != nil {
		return fail(err)
	}
	s.SetMaxFrameSize(t.frameMax)
	if err := s.SendFrame(frames.FrameMethod, 0, t.openPayload); err != nil {
		return fail(err)
	}
	if _, err := expect(frames.ConnectionOpenOkKey); err != nil {
		return fail(err)
	}
	conn.SetDeadline(time.Time{})
	return s, nil
}

// ensureChannel opens client channel ch on link l if it is not open there,
// and repeats on it what the client set on the channel (prefetch, confirm
// or transaction mode, a consumer of amq.rabbitmq.reply-to), swallowing the
// replies. The client loop calls it, and the failover of consumers with the
// client loop held (the send gate).
func ensureChannel(ch *channelState, l *link) error {
	replyTag := ch.replyConsumerTag()
	qos := ch.qos
	tx := ch.transactional // the client loop's to write
	confirm := (ch.confirming.Load() || ch.ownConfirms.Load()) && !tx
	replies := 1 // channel.open-ok, and one for each replay
	if qos != nil {
		replies++
	}
	if confirm {
		replies++
	}
	if tx {
		replies++
	}
	if replyTag != "" {
		replies++ // consume-ok
	}
	if !l.openWithReplays(ch.id, replies, confirm) {
		return nil
	}

	w := l.sock
	if err := w.WriteMethod(ch.id, &frames.ChannelOpen{}); err != nil {
		return err
	}
	if qos != nil {
		if err := w.WriteMethod(ch.id, qos); err != nil {
			return err
		}
	}
	if confirm {
		if err := w.WriteMethod(ch.id, &frames.ConfirmSelect{}); err != nil {
			return err
		}
	}
	if tx {
		if err := w.WriteMethod(ch.id, &frames.TxSelect{}); err != nil {
			return err
		}
	}
	if replyTag != "" {
		if err := w.WriteMethod(ch.id, replyConsume(replyTag)); err != nil {
			return err
		}
	}
	return nil
}

// markLinkClosed records that a link's connection ended its close handshake.
func (l *link) markClosed() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}
