package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Messages between proxies that need no consensus: settles for slave
// copies trimmed by another node's proxy, and whatever else the proxy
// sends with Send (runtime policies). They travel on the raft port too, on
// one long-lived connection per destination whose first byte is
// peerByte, as a stream of JSON batches. Delivery is best effort: a
// message is dropped when its destination is unknown or not alive, when
// the queue to it is full, or when the write fails (the connection is
// dialled again for the next batch). Nothing here may block a sender:
// SendSettles is on the client's ack path.

// peerByte opens a connection that carries peer messages.
const peerByte = 0xF1

// peerQueue bounds the messages waiting for one destination; beyond it
// they are dropped (and counted), never waited for.
const peerQueue = 8192

// peerBatch bounds how many queued messages one write carries.
const peerBatch = 512

// peerMessage is one message on the wire. A batch is a JSON array of them.
type peerMessage struct {
	// Settles: what became of the master's copies (Outcome: acked,
	// rejected without requeue, delivered, requeued) of messages of queue
	// (VHost, Name); IDs are their identities, 16 bytes each,
	// concatenated.
	VHost   string         `json:"v,omitempty"`
	Name    string         `json:"q,omitempty"`
	IDs     []byte         `json:"ids,omitempty"`
	Outcome mirror.Outcome `json:"o,omitempty"`
	// Or a message of Kind for a handler set with Handle.
	Kind    string          `json:"k,omitempty"`
	From    string          `json:"f,omitempty"`
	Payload json.RawMessage `json:"p,omitempty"`
}

// peerSender carries the messages for one destination node.
type peerSender struct {
	node  string
	queue chan peerMessage
}

// Peers carries the messages and calls between the proxies of a cluster
// that need no consensus (the engine's Peers). It owns its senders, the
// address maps and the handlers; the Cluster feeds it membership
// (refresh) and hands it the connections its raft port classifies as
// peer messages or calls.
type Peers struct {
	node string // this proxy's member name
	// dial opens a connection to another member's raft port (the
	// cluster's stream layer: mutual TLS when it is on).
	dial func(address raft.ServerAddress, timeout time.Duration) (net.Conn, error)
	log  *slog.Logger
	// stop and wg are the Cluster's: senders end with it, and its
	// Shutdown waits for them.
	stop <-chan struct{}
	wg   *sync.WaitGroup

	mu      sync.Mutex
	senders map[string]*peerSender // by node name
	// addrs maps every alive member but this one to its raft address, and
	// backends maps a backend name to the member beside it. Both are
	// replaced as a whole after membership events.
	addrs    atomic.Pointer[map[string]string]
	backends atomic.Pointer[map[string]string]
	// members counts the cluster's proxies as pause_minority does: alive,
	// failed and leaving, this one included.
	members  atomic.Int32
	settle   atomic.Pointer[func(mirror.QueueID, []mirror.MessageID, mirror.Outcome)]
	handlers sync.Map // kind -> func(from string, payload []byte)
	calls    sync.Map // kind -> callHandler
	dropped  atomic.Uint64
}

// HandleSettles sets the function that receives the settles other proxies
// send for this node's slave copies (engine.Member.SettleLocal). Settles arriving
// before it is set are dropped.
func (p *Peers) HandleSettles(f func(mirror.QueueID, []mirror.MessageID, mirror.Outcome)) {
	p.settle.Store(&f)
}

// Handle sets the function that receives peer messages of kind sent with
// Send. It runs on the connection's reader: keep it short.
func (p *Peers) Handle(kind string, f func(from string, payload []byte)) {
	p.handlers.Store(kind, f)
}

// SendSettles hands what became of the master's copies of ids (acked,
// rejected without requeue, delivered, requeued) to the proxy beside
// backend, for its slave copy, batched with others for it. It never
// blocks and does not keep ids; settles for a backend with no alive proxy
// are dropped (that proxy's trimmer is gone with it, and its channel's
// unacknowledged messages are back in the copy).
func (p *Peers) SendSettles(backend string, id mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome) {
	node := (*p.backends.Load())[backend]
	if node == "" || node == p.node {
		return
	}
	raw := make([]byte, 0, len(ids)*len(mirror.MessageID{}))
	for _, m := range ids {
		raw = append(raw, m[:]...)
	}
	p.enqueue(node, peerMessage{VHost: id.VHost, Name: id.Name, IDs: raw, Outcome: outcome})
}

// Send sends a message of kind to the proxy named node, best effort. It
// never blocks.
func (p *Peers) Send(node, kind string, payload []byte) {
	p.enqueue(node, peerMessage{Kind: kind, From: p.node, Payload: payload})
}

// PeersDropped counts the peer messages dropped because a destination's
// queue was full.
func (p *Peers) PeersDropped() uint64 { return p.dropped.Load() }

func (p *Peers) enqueue(node string, m peerMessage) {
	if _, alive := (*p.addrs.Load())[node]; !alive {
		return
	}
	p.mu.Lock()
	s := p.senders[node]
	if s == nil {
		select {
		case <-p.stop:
			p.mu.Unlock()
			return
		default:
		}
		s = &peerSender{node: node, queue: make(chan peerMessage, peerQueue)}
		p.senders[node] = s
		p.wg.Add(1)
		go p.sendLoop(s)
	}
	p.mu.Unlock()
	select {
	case s.queue <- m:
	default:
		if n := p.dropped.Add(1); n == 1 || n%1000 == 0 {
			p.log.Warn("peer message queue full; dropping", "to", node, "dropped_total", n)
		}
	}
}

// refresh rebuilds the address maps from the members serf knows.
func (p *Peers) refresh(members []Member) {
	addrs, backends := map[string]string{}, map[string]string{}
	counted := 0
	for _, m := range members {
		if m.Status != StatusLeft {
			counted++
		}
		if m.Status != StatusAlive || m.Raft == "" {
			continue
		}
		if m.Backend != "" {
			backends[m.Backend] = m.Name
		}
		if m.Name != p.node {
			addrs[m.Name] = m.Raft
		}
	}
	p.addrs.Store(&addrs)
	p.backends.Store(&backends)
	p.members.Store(int32(counted))
}

// sendLoop writes the messages queued for one destination, many per
// write, until the cluster stops.
func (p *Peers) sendLoop(s *peerSender) {
	defer p.wg.Done()
	var conn net.Conn
	var w *bufio.Writer
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	batch := make([]peerMessage, 0, peerBatch)
	for {
		batch = batch[:0]
		select {
		case <-p.stop:
			return
		case m := <-s.queue:
			batch = append(batch, m)
		}
	more:
		for len(batch) < peerBatch {
			select {
			case m := <-s.queue:
				batch = append(batch, m)
			default:
				break more
			}
		}
		if conn == nil {
			addr := (*p.addrs.Load())[s.node]
			if addr == "" {
				continue // not alive (any more): drop
			}
			var err error
			conn, err = p.dial(raft.ServerAddress(addr), 2*time.Second)
			if err != nil {
				p.log.Debug("cannot reach a peer; dropping its messages", "to", s.node, "messages", len(batch), "error", err)
				conn = nil
				continue
			}
			w = bufio.NewWriter(conn)
			w.WriteByte(peerByte)
		}
		conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		err := json.NewEncoder(w).Encode(batch)
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			p.log.Debug("writing to a peer failed; dropping its messages", "to", s.node, "messages", len(batch), "error", err)
			conn.Close()
			conn = nil
		}
	}
}

// servePeer reads the peer messages of one connection until it closes.
func (p *Peers) servePeer(conn net.Conn) {
	dec := json.NewDecoder(bufio.NewReader(conn))
	for {
		var batch []peerMessage
		if err := dec.Decode(&batch); err != nil {
			return
		}
		for _, m := range batch {
			if m.Kind != "" {
				if h, ok := p.handlers.Load(m.Kind); ok {
					h.(func(string, []byte))(m.From, m.Payload)
				}
				continue
			}
			f := p.settle.Load()
			if f == nil || len(m.IDs)%len(mirror.MessageID{}) != 0 {
				continue
			}
			ids := make([]mirror.MessageID, len(m.IDs)/len(mirror.MessageID{}))
			for i := range ids {
				copy(ids[i][:], m.IDs[i*len(mirror.MessageID{}):])
			}
			(*f)(mirror.QueueID{VHost: m.VHost, Name: m.Name}, ids, m.Outcome)
		}
	}
}

// Calls: a request to the proxy of one node that waits for its answer, on
// a connection of its own (first byte callByte), as forwarded writes do.
// Used where the caller must know the work is done before it answers its
// client: a purge of a slave copy that another proxy trims.

// callByte opens a connection that carries one call.
const callByte = 0xF2

type callRequest struct {
	Kind    string          `json:"kind"`
	Payload json.RawMessage `json:"payload"`
	Timeout time.Duration   `json:"timeout"`
}

type callResponse struct {
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// callHandler answers a call of one kind.
type callHandler func(ctx context.Context, payload []byte) ([]byte, error)

// call sends a request of kind to the proxy named node and waits for its
// answer, at most until ctx ends (forwardTimeout without a deadline).
func (p *Peers) call(ctx context.Context, node, kind string, payload []byte) ([]byte, error) {
	addr := (*p.addrs.Load())[node]
	if addr == "" {
		return nil, fmt.Errorf("calling %s: no alive proxy of that name", node)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(forwardTimeout)
	}
	timeout := time.Until(deadline)
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	conn, err := p.dial(raft.ServerAddress(addr), timeout)
	if err != nil {
		return nil, fmt.Errorf("calling %s at %s: %w", node, addr, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	conn.SetDeadline(deadline)
	w := bufio.NewWriter(conn)
	w.WriteByte(callByte)
	if err := json.NewEncoder(w).Encode(callRequest{Kind: kind, Payload: payload, Timeout: timeout}); err != nil {
		return nil, fmt.Errorf("encoding a call: %w", err)
	}
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("calling %s at %s: %w", node, addr, err)
	}
	var resp callResponse
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("no answer from %s at %s: %w", node, addr, err)
	}
	if resp.Error != "" {
		return nil, fmt.Errorf("%s: %s", node, resp.Error)
	}
	return resp.Payload, nil
}

// serveCall answers one call.
func (p *Peers) serveCall(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(forwardTimeout))
	var req callRequest
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&req); err != nil {
		p.log.Warn("undecodable call", "remote", conn.RemoteAddr(), "error", err)
		return
	}
	timeout := min(max(req.Timeout, 0), forwardTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn.SetDeadline(time.Now().Add(timeout + time.Second))
	var resp callResponse
	h, ok := p.calls.Load(req.Kind)
	if !ok {
		resp.Error = fmt.Sprintf("no handler for calls of kind %q", req.Kind)
	} else if payload, err := h.(callHandler)(ctx, req.Payload); err != nil {
		resp.Error = err.Error()
	} else {
		resp.Payload = payload
	}
	if err := json.NewEncoder(conn).Encode(resp); err != nil {
		p.log.Warn("answering a call", "remote", conn.RemoteAddr(), "error", err)
	}
}

// purgeCall is the kind of the call that purges a slave copy.
const purgeCall = "purge-slave"

// HandlePurges sets the function that purges this node's slave copy of a
// queue when another proxy asks (engine.Member.PurgeLocal).
func (p *Peers) HandlePurges(f func(ctx context.Context, id mirror.QueueID) error) {
	p.calls.Store(purgeCall, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var id mirror.QueueID
		if err := json.Unmarshal(payload, &id); err != nil {
			return nil, fmt.Errorf("decoding a purge: %w", err)
		}
		return nil, f(ctx, id)
	}))
}

// PurgeSlave asks the proxy beside backend to purge its slave copy of the
// queue (through its trimmer, which holds most of the copy's messages) and
// waits until it did.
func (p *Peers) PurgeSlave(ctx context.Context, backend string, id mirror.QueueID) error {
	node := (*p.backends.Load())[backend]
	if node == "" {
		return fmt.Errorf("purging the copy of %s on %s: no alive proxy beside it", id, backend)
	}
	payload, err := json.Marshal(id)
	if err != nil {
		return err
	}
	if _, err := p.call(ctx, node, purgeCall, payload); err != nil {
		return fmt.Errorf("purging the copy of %s on %s: %w", id, backend, err)
	}
	return nil
}

// syncCall is the kind of the call that starts a slave's sync.
const syncCall = "sync-slave"

// HandleSyncs sets the function that starts synchronising this node's
// slave copy of a queue when another proxy asks (engine.SyncQueue).
func (p *Peers) HandleSyncs(f func(ctx context.Context, id mirror.QueueID) error) {
	p.calls.Store(syncCall, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var id mirror.QueueID
		if err := json.Unmarshal(payload, &id); err != nil {
			return nil, fmt.Errorf("decoding a sync request: %w", err)
		}
		return nil, f(ctx, id)
	}))
}

// SyncSlave asks the proxy beside backend to start synchronising its slave
// copy of the queue, and returns once it started (or refused).
func (p *Peers) SyncSlave(ctx context.Context, backend string, id mirror.QueueID) error {
	node := (*p.backends.Load())[backend]
	if node == "" {
		return fmt.Errorf("no alive proxy beside %s", backend)
	}
	payload, err := json.Marshal(id)
	if err != nil {
		return err
	}
	_, err = p.call(ctx, node, syncCall, payload)
	return err
}

// copyCall is the kind of the call that starts copying a synchronised
// slave's copy into a slave that synchronises; copyStateCall asks how the
// copy stands. A copy outlasts a call, so the asker starts it and then
// asks until it is done.
const (
	copyCall      = "copy-slave"
	copyStateCall = "copy-slave-state"
)

// copyStateQuestion is the payload of copyStateCall.
type copyStateQuestion struct {
	Job    string `json:"job"`
	Cancel bool   `json:"cancel,omitempty"`
}

// HandleCopies sets the functions that start a copy of this node's slave
// copy into another node's (engine.Member.CopyLocal) and tell how it stands
// (engine.Member.CopyStateLocal).
func (p *Peers) HandleCopies(start func(ctx context.Context, job mirror.CopyJob) error, state func(ctx context.Context, job string, cancel bool) (mirror.CopyState, error)) {
	p.calls.Store(copyCall, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var job mirror.CopyJob
		if err := json.Unmarshal(payload, &job); err != nil {
			return nil, fmt.Errorf("decoding a copy request: %w", err)
		}
		return nil, start(ctx, job)
	}))
	p.calls.Store(copyStateCall, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var q copyStateQuestion
		if err := json.Unmarshal(payload, &q); err != nil {
			return nil, fmt.Errorf("decoding a copy question: %w", err)
		}
		st, err := state(ctx, q.Job, q.Cancel)
		if err != nil {
			return nil, err
		}
		return json.Marshal(st)
	}))
}

// StartCopy asks the proxy beside source, a synchronised slave's backend,
// to copy its slave copy of job.Queue into the copy on job.Target, and
// returns once the copy started (or was refused).
func (p *Peers) StartCopy(ctx context.Context, source string, job mirror.CopyJob) error {
	node := (*p.backends.Load())[source]
	if node == "" {
		return fmt.Errorf("copying the slave of %s on %s: no alive proxy beside it", job.Queue, source)
	}
	payload, err := json.Marshal(job)
	if err != nil {
		return err
	}
	if _, err := p.call(ctx, node, copyCall, payload); err != nil {
		return fmt.Errorf("copying the slave of %s on %s: %w", job.Queue, source, err)
	}
	return nil
}

// CopyState asks the proxy beside source how the copy job stands, and with
// cancel set stops it.
func (p *Peers) CopyState(ctx context.Context, source, job string, cancel bool) (mirror.CopyState, error) {
	node := (*p.backends.Load())[source]
	if node == "" {
		return mirror.CopyState{}, fmt.Errorf("asking after copy %s on %s: no alive proxy beside it", job, source)
	}
	payload, err := json.Marshal(copyStateQuestion{Job: job, Cancel: cancel})
	if err != nil {
		return mirror.CopyState{}, err
	}
	answer, err := p.call(ctx, node, copyStateCall, payload)
	if err != nil {
		return mirror.CopyState{}, fmt.Errorf("asking after copy %s on %s: %w", job, source, err)
	}
	var st mirror.CopyState
	if err := json.Unmarshal(answer, &st); err != nil {
		return mirror.CopyState{}, fmt.Errorf("decoding the state of copy %s on %s: %w", job, source, err)
	}
	return st, nil
}

// unackedCall is the kind of the call that asks a proxy what it holds of
// the queues' messages (mirror.Held). It keeps its first name: proxies of
// an older release answer it with the unacknowledged counts alone.
const unackedCall = "unacked"

// queueCount is one queue's count in an answer to unackedCall.
type queueCount struct {
	VHost string `json:"v"`
	Name  string `json:"q"`
	Count int    `json:"n"`
	Began uint64 `json:"cb,omitempty"`
	Ended uint64 `json:"ce,omitempty"`
}

// HandleHeld sets the function that says, per queue of a vhost, what this
// proxy holds of its messages (its clients' unacknowledged deliveries, its
// copies from the master), for other proxies' list_queues and backlog
// checks (engine.Engine.HeldHere).
func (p *Peers) HandleHeld(f func(vhost string) map[mirror.QueueID]mirror.Held) {
	p.calls.Store(unackedCall, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var vhost string
		if err := json.Unmarshal(payload, &vhost); err != nil {
			return nil, fmt.Errorf("decoding a count request: %w", err)
		}
		var out []queueCount
		for id, h := range f(vhost) {
			out = append(out, queueCount{VHost: id.VHost, Name: id.Name, Count: h.Unacked, Began: h.Copies.Began, Ended: h.Copies.Ended})
		}
		return json.Marshal(out)
	}))
}

// Held asks every other alive proxy, at once, what it holds of each queue
// of vhost ("" for all), and adds the answers up. It fails when one of
// them does not answer before ctx ends (forwardTimeout without a
// deadline): the sum would be short.
func (p *Peers) Held(ctx context.Context, vhost string) (map[mirror.QueueID]mirror.Held, error) {
	sum := make(map[mirror.QueueID]mirror.Held)
	err := p.askEveryone(ctx, unackedCall, vhost, func(node string, raw []byte) error {
		var counts []queueCount
		if err := json.Unmarshal(raw, &counts); err != nil {
			return fmt.Errorf("decoding %s's counts: %w", node, err)
		}
		for _, qc := range counts {
			id := mirror.QueueID{VHost: qc.VHost, Name: qc.Name}
			sum[id] = sum[id].Add(mirror.Held{Unacked: qc.Count, Copies: mirror.CopyRuns{Began: qc.Began, Ended: qc.Ended}})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("counting what the proxies hold: %w", err)
	}
	return sum, nil
}

// unrecordedCall is the kind of the call that asks a proxy for the queues
// its clients declared that the metadata log does not record.
const unrecordedCall = "unrecorded"

// HandleUnrecorded sets the function that lists, for other proxies'
// list_queues, the queues of a vhost this proxy's clients declared that
// the log does not record (proxy.Server.UnrecordedQueues).
func (p *Peers) HandleUnrecorded(f func(vhost string) []mirror.UnrecordedQueue) {
	p.calls.Store(unrecordedCall, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var vhost string
		if err := json.Unmarshal(payload, &vhost); err != nil {
			return nil, fmt.Errorf("decoding a listing request: %w", err)
		}
		return json.Marshal(f(vhost))
	}))
}

// Unrecorded asks every other alive proxy, at once, for the queues of
// vhost ("" for all) its clients declared that the log does not record.
// When one does not answer before ctx ends it returns the others' queues
// with the error.
func (p *Peers) Unrecorded(ctx context.Context, vhost string) ([]mirror.UnrecordedQueue, error) {
	var all []mirror.UnrecordedQueue
	err := p.askEveryone(ctx, unrecordedCall, vhost, func(node string, raw []byte) error {
		var queues []mirror.UnrecordedQueue
		if err := json.Unmarshal(raw, &queues); err != nil {
			return fmt.Errorf("decoding %s's queues: %w", node, err)
		}
		all = append(all, queues...)
		return nil
	})
	if err != nil {
		return all, fmt.Errorf("listing unrecorded queues: %w", err)
	}
	return all, nil
}

// downCall is the kind of the call that asks a proxy whether it counts a
// backend down.
const downCall = "down"

// HandleDown sets the function that answers other proxies' CountDown:
// whether this proxy counts a backend down (engine.BackendDown).
func (p *Peers) HandleDown(f func(backend string) bool) {
	p.calls.Store(downCall, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var backend string
		if err := json.Unmarshal(payload, &backend); err != nil {
			return nil, fmt.Errorf("decoding a liveness question: %w", err)
		}
		return json.Marshal(f(backend))
	}))
}

// CountDown asks every other alive proxy, at once, whether it counts
// backend down, and returns how many do, and how many proxies the cluster
// has (this one and failed ones included). A proxy that does not answer
// before ctx ends counts as not seeing the backend down; err names it.
func (p *Peers) CountDown(ctx context.Context, backend string) (down, members int, err error) {
	err = p.askEveryone(ctx, downCall, backend, func(node string, raw []byte) error {
		var isDown bool
		if err := json.Unmarshal(raw, &isDown); err != nil {
			return fmt.Errorf("decoding %s's answer: %w", node, err)
		}
		if isDown {
			down++
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("asking whether %s is down: %w", backend, err)
	}
	return down, int(p.members.Load()), err
}

// deliveredCall is the kind of the call that asks a proxy which messages
// of a queue it delivered before the queue's epoch rose.
const deliveredCall = "delivered"

// deliveredQuestion is a deliveredCall's request; its answer is the
// identities, 16 bytes each, concatenated.
type deliveredQuestion struct {
	VHost string `json:"v"`
	Name  string `json:"q"`
	Epoch uint64 `json:"e"`
}

// HandleDelivered sets the function that answers other proxies'
// Delivered: the messages of a queue this proxy delivered while its epoch
// was below epoch (proxy.Server.DeliveredBefore).
func (p *Peers) HandleDelivered(f func(id mirror.QueueID, epoch uint64) []mirror.MessageID) {
	p.calls.Store(deliveredCall, callHandler(func(ctx context.Context, payload []byte) ([]byte, error) {
		var q deliveredQuestion
		if err := json.Unmarshal(payload, &q); err != nil {
			return nil, fmt.Errorf("decoding a deliveries question: %w", err)
		}
		ids := f(mirror.QueueID{VHost: q.VHost, Name: q.Name}, q.Epoch)
		raw := make([]byte, 0, len(ids)*len(mirror.MessageID{}))
		for _, id := range ids {
			raw = append(raw, id[:]...)
		}
		return json.Marshal(raw)
	}))
}

// Delivered asks every other alive proxy, at once, which messages of queue
// id its clients were delivered while the queue's epoch was below epoch,
// for the redelivered flag of what the queue's new master delivers through
// this proxy. When one does not answer before ctx ends it returns the
// others' messages with the error.
func (p *Peers) Delivered(ctx context.Context, id mirror.QueueID, epoch uint64) ([]mirror.MessageID, error) {
	var all []mirror.MessageID
	err := p.askEveryone(ctx, deliveredCall, deliveredQuestion{VHost: id.VHost, Name: id.Name, Epoch: epoch}, func(node string, raw []byte) error {
		var ids []byte
		if err := json.Unmarshal(raw, &ids); err != nil {
			return fmt.Errorf("decoding %s's deliveries: %w", node, err)
		}
		size := len(mirror.MessageID{})
		if len(ids)%size != 0 {
			return fmt.Errorf("%s's deliveries: %d bytes is no whole number of identities", node, len(ids))
		}
		for i := 0; i < len(ids); i += size {
			all = append(all, mirror.MessageID(ids[i:i+size]))
		}
		return nil
	})
	if err != nil {
		return all, fmt.Errorf("asking what the other proxies delivered of queue %q in vhost %q: %w", id.Name, id.VHost, err)
	}
	return all, nil
}

// askEveryone sends a call of kind with request to every other alive
// proxy at once and hands each answer to take, one at a time, on the
// calling goroutine. The error names the proxies that did not answer or
// whose answer take refused.
func (p *Peers) askEveryone(ctx context.Context, kind string, request any, take func(node string, raw []byte) error) error {
	payload, err := json.Marshal(request)
	if err != nil {
		return err
	}
	addrs := *p.addrs.Load()
	type answer struct {
		node string
		raw  []byte
		err  error
	}
	answers := make(chan answer, len(addrs))
	for node := range addrs {
		go func() {
			raw, err := p.call(ctx, node, kind, payload)
			answers <- answer{node: node, raw: raw, err: err}
		}()
	}
	var errs []error
	for range addrs {
		a := <-answers
		if a.err == nil {
			a.err = take(a.node, a.raw)
		}
		if a.err != nil {
			errs = append(errs, a.err)
		}
	}
	return errors.Join(errs...)
}
