package proxy

import (
	"unicode/utf8"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// A client channel is open on one or more links. Closing it closes it on
// every link, and the client sees one close handshake, as with one broker:
//
//   - the client closes: channel.close goes to every link; the client gets
//     close-ok when all answered (clientClosing);
//   - a link closes it (a channel error): the proxy closes it on the other
//     links, and once they answered, the client gets the link's
//     channel.close; the client's close-ok goes to that link
//     (backendClosing);
//   - the proxy closes it (an error it found itself, or the only link that
//     could answer was lost): channel.close on every link, and then the
//     proxy's own to the client (proxyClosing).
//
// Until the client may reuse the channel id, every link must have finished:
// the client learns of a close only after the links' close-oks, and a link
// still closing the id answers (close-ok) before anything sent after it.
const (
	chanOpen uint32 = iota
	chanClientClosing
	chanBackendClosing
	chanProxyClosing
)

// closeOnLinks sends the proxy's channel.close on every link where the
// channel is open, except skip, and counts the close-oks owed in closeWait.
// The links drop the channel's frames until their close-ok. Callers hold no
// locks.
func (c *clientConn) closeOnLinks(ch *channelState, skip *link, text string) {
	for _, l := range c.links.live() {
		if l == skip {
			continue
		}
		g := &rpcGroup{pending: 1, primary: -1, own: true, after: func([]byte) []byte {
			c.linkCloseOk(ch, l)
			return nil
		}}
		if !l.beginProxyClose(ch.id, g) {
			continue
		}
		ch.closeOkOwed()
		// A close of the broker's own that crosses this one is answered
		// only once the broker answered this (fromLinkOnClosingChannel), so
		// the proxy's close-ok never overtakes this close on the wire.
		if err := l.sock.SendMethod(ch.id, &frames.ChannelClose{ReplyCode: frames.ReplySuccess, ReplyText: text}); err != nil {
			c.keeper.writeFailed(l, err)
		}
	}
}

// removeChannel forgets a channel whose close handshake is over, on every
// link: the brokers took back what the client had not settled, and the
// engine is told (settler.takenBack).
func (c *clientConn) removeChannel(ch *channelState) {
	c.settler.takenBack(ch.outstandingMirrored())
	c.channels.remove(ch.id, ch)
}

// linkCloseOk counts one link's close-ok for a close of the proxy's, and
// tells the client once none is owed.
func (c *clientConn) linkCloseOk(ch *channelState, l *link) {
	l.proxyCloseOk(ch.id)
	c.closeWaitDone(ch, ch.closeOkArrived())
}

// closeWaitDone sends the client what waited for the links' close-oks, once
// none is owed (done): the notice of the close, or the close-ok of a close
// the client crossed it with.
func (c *clientConn) closeWaitDone(ch *channelState, o closeOutcome) {
	if !o.done {
		return
	}
	switch {
	case o.crossed:
		c.out.methodOnChannel(ch, &frames.ChannelCloseOk{})
		c.removeChannel(ch)
	case o.notice != nil:
		c.out.methodOnChannel(ch, o.notice)
	}
	// The client loop may get here too, and it flushes only the links.
	c.out.flush()
}

// clientClosesChannel sends the client's channel.close to every link where
// the channel is open; the client gets the first link's close-ok once all
// answered.
func (c *clientConn) clientClosesChannel(ch *channelState, f frames.Frame) {
	ch.closing.Store(chanClientClosing)
	c.logChannelUnconfirmed(ch)
	var targets []*link
	for _, l := range c.links.live() {
		if l.beginClientClose(ch.id) {
			targets = append(targets, l)
		}
	}
	if len(targets) == 0 {
		c.out.sendOnChannel(ch, &frames.ChannelCloseOk{})
		c.removeChannel(ch)
		return
	}
	c.router.send(ch, f, targets, true, func(reply []byte) []byte {
		c.removeChannel(ch)
		return reply
	})
}

// linkClosesChannel handles a link's channel.close (a channel error there).
func (c *clientConn) linkClosesChannel(ch *channelState, l *link, f frames.Frame) error {
	var cl frames.ChannelClose
	if err := decodeArgs(f.Payload, &cl); err != nil {
		return err
	}
	crossed, wasOpen, abandoned := l.brokerCloses(ch.id)
	if crossed {
		// Our close or the client's crossed the broker's (link.brokerCloses).
		for _, g := range abandoned {
			c.router.abandonReply(ch, g)
		}
		return nil
	}
	// The link answers nothing more on the channel but the close handshake.
	for _, g := range abandoned {
		if g != nil && g.own {
			g.after(nil) // a close of the proxy's: this close answers it
			continue
		}
		c.router.abandonReply(ch, g)
	}
	// With several links, what this read loop writes on the channel waits
	// until the client loop is not between a publish's frames (boundary.go).
	write := func(run func()) { run() }
	if c.srv.opts.Mirror != nil {
		write = func(run func()) { c.send.atBoundary(ch, run) }
	}
	// Several links may close the channel at once (a publish to a missing
	// exchange reaches every backend): only the first one's close reaches
	// the client, so the change of state is one compare-and-swap. Were two
	// link loops that both saw the channel open both its closer, the client
	// would get two notices, and its second close-ok would reach a broker
	// that had freed the channel: 504, which closes the connection.
	if !wasOpen || !ch.linkCloses(l, &cl) {
		// Closes crossed: the proxy, the client or another link closed it
		// meanwhile. The link gets its close-ok; what the client is owed
		// is settled by the close under way.
		write(func() {
			if err := l.sock.SendMethod(ch.id, &frames.ChannelCloseOk{}); err != nil {
				c.keeper.writeFailed(l, err)
			}
		})
		return nil
	}
	write(func() {
		c.closeOnLinks(ch, l, "closed by amqp-mirror: "+cl.ReplyText)
		c.closeWaitDone(ch, ch.closeWaitOutcome())
	})
	return nil
}

// closeChannelByProxy closes a channel for a reason the proxy found itself:
// channel.close on every link, and channel.close with the broker's code and
// text to the client once the links answered.
func (c *clientConn) closeChannelByProxy(ch *channelState, code uint16, text string, classID, methodID uint16) {
	if !ch.proxyCloses(&frames.ChannelClose{ReplyCode: code, ReplyText: shortstr(text), ClassID: classID, MethodID: methodID}) {
		return
	}
	c.closeOnLinks(ch, nil, shortstr("closed by amqp-mirror: "+text))
	c.closeWaitDone(ch, ch.closeWaitOutcome())
}

// fromClientOnClosingChannel handles client frames on a channel a link or
// the proxy is closing: only the close handshake counts, the rest is
// discarded, as the spec asks of a peer that sent channel.close.
func (c *clientConn) fromClientOnClosingChannel(ch *channelState, state uint32, key uint32, f frames.Frame) {
	switch key {
	case frames.ChannelCloseOkKey:
		closer := ch.closingLink()
		if state == chanBackendClosing && closer != nil {
			if err := closer.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
				c.keeper.writeFailed(closer, err)
			}
		}
		c.removeChannel(ch)
	case frames.ChannelCloseKey:
		// The client closed it too. If it has not been told of our close
		// yet, it never will be: it gets close-ok instead, once the links
		// answered; if it has, it gets close-ok now and its close-ok for
		// ours still follows.
		crossing, closer, o, answerErr := ch.clientCloseCrosses(func(closer *link) error {
			return closer.sock.WriteMethod(ch.id, &frames.ChannelCloseOk{})
		})
		if crossing {
			// A failed answer is reported only now, with the channel's
			// lock released: losing the link settles the channel again.
			if answerErr != nil {
				c.keeper.writeFailed(answerErr.link, answerErr.err)
			}
			c.closeWaitDone(ch, o)
			return
		}
		if state == chanBackendClosing && closer != nil {
			// The broker, closing, answers the client's close with
			// close-ok, as a direct client would see it.
			closer.expect(ch.id, &rpcGroup{pending: 1, primary: closer.idx})
			if err := closer.sock.WriteFrame(f.Type, f.Channel, f.Payload); err != nil {
				c.keeper.writeFailed(closer, err)
			}
			return
		}
		c.out.sendOnChannel(ch, &frames.ChannelCloseOk{})
	}
}

// shortstr cuts a reply text to the 255 bytes a shortstr holds, at a rune
// boundary: a longer one would not encode, and the close would be lost.
func shortstr(s string) string {
	if len(s) <= 255 {
		return s
	}
	cut := 255
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// closeHandshake is a channel's close in progress: the link whose
// channel.close the client gets, the close the client is told of, how many
// close-oks the links still owe for the proxy's close, and whether the
// client crossed it with its own close. The channel holds it by value and
// it is guarded by the channel's mu; its methods are called with it held,
// by channelState's methods only (below). The client loop, the link loops
// and whoever loses a link reach it through them.
type closeHandshake struct {
	closer    *link                // the link whose channel.close the client gets
	notice    *frames.ChannelClose // the close the client gets once closeWait is 0
	closeWait int                  // links that still owe close-ok for the proxy's close
	// crossed: the client closed the channel too before it saw the notice;
	// it gets close-ok instead, once closeWait is 0.
	crossed bool
}

// closeOutcome is what the client is owed once no link owes a close-ok for
// the proxy's close (done): the notice of the close, or, when the client
// crossed it with its own close, close-ok.
type closeOutcome struct {
	notice  *frames.ChannelClose
	crossed bool
	done    bool
}

// outcome hands out the notice once no close-ok is owed, so that the
// client is told once.
func (h *closeHandshake) outcome() closeOutcome {
	if h.closeWait > 0 {
		return closeOutcome{}
	}
	o := closeOutcome{notice: h.notice, crossed: h.crossed, done: true}
	h.notice = nil
	return o
}

// clientCrosses applies the client's channel.close (see
// channelState.clientCloseCrosses), answering the closer with answerCloser.
func (h *closeHandshake) clientCrosses(answerCloser func(*link) error) (crossing bool, closer *link, o closeOutcome, answerErr *linkWriteError) {
	closer = h.closer
	if h.notice == nil && h.closeWait == 0 {
		return false, closer, closeOutcome{}, nil
	}
	h.notice, h.crossed, h.closer = nil, true, nil
	if closer != nil {
		if err := answerCloser(closer); err != nil {
			answerErr = &linkWriteError{link: closer, err: err}
		}
	}
	return true, nil, h.outcome(), answerErr
}

// The channel's side of its close, through closeHandshake under mu: who
// closes it, what the client is told, and how many close-oks the links
// still owe.

// closeOkOwed counts a close-ok a link owes for the proxy's close.
func (ch *channelState) closeOkOwed() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.handshake.closeWait++
}

// closeOkArrived counts a link's close-ok for the proxy's close, and
// returns what the client is owed.
func (ch *channelState) closeOkArrived() closeOutcome {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.handshake.closeWait--
	return ch.handshake.outcome()
}

// closeWaitOutcome returns what the client is owed for the proxy's close.
func (ch *channelState) closeWaitOutcome() closeOutcome {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.handshake.outcome()
}

// linkCloses makes l the closer of an open channel, with the close the
// client is to get, and reports false when the channel was closing already
// (the proxy, the client or another link closed it meanwhile).
func (ch *channelState) linkCloses(l *link, notice *frames.ChannelClose) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !ch.closing.CompareAndSwap(chanOpen, chanBackendClosing) {
		return false
	}
	ch.handshake.closer, ch.handshake.notice = l, notice
	return true
}

// proxyCloses starts the proxy's own close of an open channel, with the
// close the client is to get, and reports false when the channel was
// closing already.
func (ch *channelState) proxyCloses(notice *frames.ChannelClose) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !ch.closing.CompareAndSwap(chanOpen, chanProxyClosing) {
		return false
	}
	ch.handshake.notice = notice
	return true
}

// closingLink is the link whose channel.close the client gets, nil when
// there is none.
func (ch *channelState) closingLink() *link {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.handshake.closer
}

// forgetCloser drops l as the channel's closer: l was lost.
func (ch *channelState) forgetCloser(l *link) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.handshake.closer == l {
		ch.handshake.closer = nil
	}
}

// clientCloseCrosses handles the client's channel.close on a channel whose
// close the client has not been told of yet, or whose close-oks the links
// still owe (crossing): it never will be told; it gets close-ok instead,
// once the links answered, and the closer gets its close-ok at once
// (answerCloser runs under mu, so that nothing about the close changes
// meanwhile; its failure is returned for the caller to report once mu is
// released, since handling a lost link takes mu again). Otherwise it
// returns the closer, to which the client's close goes.
func (ch *channelState) clientCloseCrosses(answerCloser func(*link) error) (crossing bool, closer *link, o closeOutcome, answerErr *linkWriteError) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.handshake.clientCrosses(answerCloser)
}

// linkWriteError is a write to a link that failed under a lock, to be
// reported (linkKeeper.writeFailed) once the lock is released.
type linkWriteError struct {
	link *link
	err  error
}
