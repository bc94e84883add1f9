package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Writes from any node. Only the raft leader can commit, so a follower
// sends its write to the leader: it dials the leader's raft address (which
// raft itself knows, no serf lookup needed), sends forwardByte and one JSON
// request, and reads one JSON response. One connection per write: metadata
// writes are rare (a queue declared, deleted, promoted), and a connection
// of its own cannot be confused with raft's pipelined traffic. The leader
// applies the write to its own store and never forwards it further, so a
// request cannot loop between nodes that disagree on the leader.

// forwardTimeout bounds a forwarded write when the caller's context has no
// deadline.
const forwardTimeout = 10 * time.Second

type forwardRequest struct {
	Op         string               `json:"op"` // "put", "delete", "put_exchange", "delete_exchange" or "policy"
	Meta       *mirror.QueueMeta    `json:"meta,omitempty"`
	ID         mirror.QueueID       `json:"id,omitzero"`
	Exchange   *mirror.ExchangeMeta `json:"exchange,omitempty"`
	ExchangeID mirror.ExchangeID    `json:"exchange_id,omitzero"`
	Expect     uint64               `json:"expect"`
	Policy     *store.PolicyChange  `json:"policy,omitempty"`
	Timeout    time.Duration        `json:"timeout"`
}

type forwardResponse struct {
	Meta     *mirror.QueueMeta    `json:"meta,omitempty"`
	Exchange *mirror.ExchangeMeta `json:"exchange,omitempty"`
	Policy   *store.PolicyResult  `json:"policy,omitempty"`
	Error    string               `json:"error,omitempty"`
	// Kind names a sentinel the error stands for, so that errors.Is works
	// on the forwarding side: "conflict", "not_leader", "closed" or
	// "policy_not_found".
	Kind string `json:"kind,omitempty"`
}

// Put writes meta through the leader of the metadata log, on this node or
// forwarded to it, if the queue's version is still expect (0: it must not
// exist), and returns the record as written. Errors are those of
// store.Store.Put: ErrConflict (read again, decide again), ErrNotLeader
// (no leader reachable: this node is on a minority side or an election is
// under way).
func (c *Cluster) Put(ctx context.Context, meta mirror.QueueMeta, expect uint64) (mirror.QueueMeta, error) {
	if c.store.IsLeader() {
		return c.store.Put(ctx, meta, expect)
	}
	resp, err := c.forward(ctx, forwardRequest{Op: "put", Meta: &meta, Expect: expect})
	if err != nil {
		return mirror.QueueMeta{}, fmt.Errorf("recording %s: %w", meta.ID, err)
	}
	if resp.Meta == nil {
		return mirror.QueueMeta{}, fmt.Errorf("recording %s: the leader answered without the record", meta.ID)
	}
	return *resp.Meta, nil
}

// Delete removes the queue's metadata through the leader if its version is
// still expect.
func (c *Cluster) Delete(ctx context.Context, id mirror.QueueID, expect uint64) error {
	if c.store.IsLeader() {
		return c.store.Delete(ctx, id, expect)
	}
	if _, err := c.forward(ctx, forwardRequest{Op: "delete", ID: id, Expect: expect}); err != nil {
		return fmt.Errorf("removing %s: %w", id, err)
	}
	return nil
}

// PutExchange writes an exchange's record through the leader, as Put does
// a queue's.
func (c *Cluster) PutExchange(ctx context.Context, x mirror.ExchangeMeta, expect uint64) (mirror.ExchangeMeta, error) {
	if c.store.IsLeader() {
		return c.store.PutExchange(ctx, x, expect)
	}
	resp, err := c.forward(ctx, forwardRequest{Op: "put_exchange", Exchange: &x, Expect: expect})
	if err != nil {
		return mirror.ExchangeMeta{}, fmt.Errorf("recording %s: %w", x.ID, err)
	}
	if resp.Exchange == nil {
		return mirror.ExchangeMeta{}, fmt.Errorf("recording %s: the leader answered without the record", x.ID)
	}
	return *resp.Exchange, nil
}

// DeleteExchange removes an exchange's record through the leader if its
// version is still expect.
func (c *Cluster) DeleteExchange(ctx context.Context, id mirror.ExchangeID, expect uint64) error {
	if c.store.IsLeader() {
		return c.store.DeleteExchange(ctx, id, expect)
	}
	if _, err := c.forward(ctx, forwardRequest{Op: "delete_exchange", ExchangeID: id, Expect: expect}); err != nil {
		return fmt.Errorf("removing the record of %s: %w", id, err)
	}
	return nil
}

// ChangePolicies records a change of the runtime policies through the
// leader, on this node or forwarded to it, and waits until this node has
// applied it, so that this proxy's reads (and its PolicyStore, fed from
// the log) show the change when it returns. Errors are those of
// store.Store.ChangePolicies: ErrNotLeader when no majority is reachable
// from here, config.ErrPolicyNotFound for a clear of a policy the log does
// not have.
func (c *Cluster) ChangePolicies(ctx context.Context, change store.PolicyChange) (store.PolicyResult, error) {
	var res store.PolicyResult
	if c.store.IsLeader() {
		var err error
		if res, err = c.store.ChangePolicies(ctx, change); err != nil {
			return store.PolicyResult{}, err
		}
	} else {
		resp, err := c.forward(ctx, forwardRequest{Op: "policy", Policy: &change})
		if err != nil {
			return store.PolicyResult{}, fmt.Errorf("recording a runtime policy change (%s): %w", change.Op, err)
		}
		if resp.Policy == nil {
			return store.PolicyResult{}, fmt.Errorf("recording a runtime policy change (%s): the leader answered without a result", change.Op)
		}
		res = *resp.Policy
	}
	if err := c.store.WaitApplied(ctx, res.Index); err != nil {
		return res, fmt.Errorf("the runtime policy change is committed, but this proxy has not applied it yet: %w", err)
	}
	return res, nil
}

func (c *Cluster) forward(ctx context.Context, req forwardRequest) (resp forwardResponse, err error) {
	if err := ctx.Err(); err != nil {
		return forwardResponse{}, err
	}
	defer func() {
		// A connection closed because the context ended is the context's
		// error, not the leader's.
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("forwarding to the leader: %w (the write may or may not have committed)", ctx.Err())
		}
	}()
	leaderID, leaderAddr := c.store.Leader()
	if leaderAddr == "" {
		return forwardResponse{}, fmt.Errorf("%w: no leader known", store.ErrNotLeader)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(forwardTimeout)
	}
	req.Timeout = time.Until(deadline)
	if req.Timeout <= 0 {
		return forwardResponse{}, context.DeadlineExceeded
	}
	conn, err := c.raftLayer.Dial(raft.ServerAddress(leaderAddr), req.Timeout)
	if err != nil {
		return forwardResponse{}, fmt.Errorf("%w: forwarding to leader %s at %s: %v", store.ErrNotLeader, leaderID, leaderAddr, err)
	}
	defer conn.Close()
	// The context may end before the deadline: closing the connection
	// ends the exchange.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	conn.SetDeadline(deadline)

	w := bufio.NewWriter(conn)
	w.WriteByte(forwardByte)
	if err := json.NewEncoder(w).Encode(req); err != nil {
		return forwardResponse{}, fmt.Errorf("encoding a forwarded write: %w", err)
	}
	if err := w.Flush(); err != nil {
		return forwardResponse{}, fmt.Errorf("%w: forwarding to leader %s at %s: %v", store.ErrNotLeader, leaderID, leaderAddr, err)
	}
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		// The write may have committed: the caller must read again.
		return forwardResponse{}, fmt.Errorf("no answer from leader %s at %s, the write may or may not have committed: %w", leaderID, leaderAddr, err)
	}
	switch resp.Kind {
	case "":
		if resp.Error != "" {
			return resp, fmt.Errorf("leader %s: %s", leaderID, resp.Error)
		}
		return resp, nil
	case "conflict":
		return resp, fmt.Errorf("%w (leader %s)", store.ErrConflict, leaderID)
	case "not_leader", "closed":
		return resp, fmt.Errorf("%w: %s is no longer the leader: %s", store.ErrNotLeader, leaderID, resp.Error)
	case "policy_not_found":
		return resp, fmt.Errorf("%w (leader %s: %s)", config.ErrPolicyNotFound, leaderID, resp.Error)
	}
	return resp, fmt.Errorf("leader %s: %s (%s)", leaderID, resp.Error, resp.Kind)
}

// serveForward applies one forwarded write on this node, which the sender
// believed to lead, and answers it.
func (c *Cluster) serveForward(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(forwardTimeout))
	var req forwardRequest
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&req); err != nil {
		c.log.Warn("undecodable forwarded write", "remote", conn.RemoteAddr(), "error", err)
		return
	}
	timeout := min(max(req.Timeout, 0), forwardTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn.SetDeadline(time.Now().Add(timeout + time.Second))

	var resp forwardResponse
	var err error
	switch req.Op {
	case "put":
		if req.Meta == nil {
			err = errors.New("forwarded put without a record")
			break
		}
		var written mirror.QueueMeta
		if written, err = c.store.Put(ctx, *req.Meta, req.Expect); err == nil {
			resp.Meta = &written
		}
	case "delete":
		err = c.store.Delete(ctx, req.ID, req.Expect)
	case "put_exchange":
		if req.Exchange == nil {
			err = errors.New("forwarded exchange put without a record")
			break
		}
		var written mirror.ExchangeMeta
		if written, err = c.store.PutExchange(ctx, *req.Exchange, req.Expect); err == nil {
			resp.Exchange = &written
		}
	case "delete_exchange":
		err = c.store.DeleteExchange(ctx, req.ExchangeID, req.Expect)
	case "policy":
		if req.Policy == nil {
			err = errors.New("forwarded policy change without a change")
			break
		}
		var res store.PolicyResult
		if res, err = c.store.ChangePolicies(ctx, *req.Policy); err == nil {
			resp.Policy = &res
		}
	default:
		err = fmt.Errorf("unknown forwarded operation %q", req.Op)
	}
	if err != nil {
		resp.Error = err.Error()
		switch {
		case errors.Is(err, store.ErrConflict):
			resp.Kind = "conflict"
		case errors.Is(err, store.ErrNotLeader):
			resp.Kind = "not_leader"
		case errors.Is(err, store.ErrClosed):
			resp.Kind = "closed"
		case errors.Is(err, config.ErrPolicyNotFound):
			resp.Kind = "policy_not_found"
		}
	}
	if err := json.NewEncoder(conn).Encode(resp); err != nil {
		c.log.Warn("answering a forwarded write", "remote", conn.RemoteAddr(), "error", err)
	}
}
