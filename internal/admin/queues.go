package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// Queues is the replication engine as the admin API sees it: the data of
// list_queues and the manual synchronisation of sync_queue. mirror/engine
// implements it; a proxy with one backend has none.
type Queues interface {
	// ListQueues returns the queues of vhost that the metadata log holds,
	// with their master's counts.
	// With unacked, the counts of unacknowledged messages are asked of
	// every proxy; without, they are -1.
	ListQueues(ctx context.Context, vhost string, unacked bool) ([]mirror.QueueStatus, error)
	// SyncQueue starts copying the master's messages to the queue's
	// unsynchronised slaves. ctx bounds the request, not the
	// synchronisation: it goes on after the call returns, until it is done
	// or CancelSyncQueue stops it. An unknown queue is mirror.ErrQueueNotFound
	// (wrapped).
	SyncQueue(ctx context.Context, id mirror.QueueID) error
	// CancelSyncQueue stops a synchronisation of the queue in progress.
	CancelSyncQueue(ctx context.Context, id mirror.QueueID) error
}

// WithQueues serves list_queues, sync_queue and cancel_sync_queue from q.
// Without it those endpoints answer errMirroringOff.
func WithQueues(q Queues) Option {
	return func(s *Server) {
		s.queues = q
		if d, ok := q.(Drainer); ok && s.drainer == nil {
			s.drainer = d // the engine is both (drain.go)
		}
	}
}

// errMirroringOff is the answer of the queue endpoints when the proxy was
// started without an engine, because it has a single backend.
const errMirroringOff = "mirroring is off: the proxy has one backend"

// Queue actions of POST /api/queues/{vhost}/{name}/actions, named as in
// RabbitMQ's management API.
const (
	actionSync       = "sync"
	actionCancelSync = "cancel_sync"
)

// QueueAction is the body of POST /api/queues/{vhost}/{name}/actions.
type QueueAction struct {
	Action string `json:"action"`
}

// listQueues serves GET /api/queues[?vhost=V][&unacked=false]; the vhost defaults to "/",
// as rabbitmqctl list_queues' -p does.
func (s *Server) listQueues(w http.ResponseWriter, r *http.Request) {
	if s.queues == nil {
		writeError(w, http.StatusConflict, errMirroringOff)
		return
	}
	vhost := r.URL.Query().Get("vhost")
	if vhost == "" {
		vhost = "/"
	}
	// unacked=false spares the round trip to every other proxy that the
	// unacknowledged counts take.
	unacked := r.URL.Query().Get("unacked") != "false"
	list, err := s.queues.ListQueues(r.Context(), vhost, unacked)
	if err != nil {
		writeError(w, engineStatus(err), fmt.Sprintf("listing queues of vhost '%s': %v", vhost, err))
		return
	}
	if list == nil {
		list = []mirror.QueueStatus{}
	}
	// The engine's order is a map's; an operator comparing two listings,
	// and a test, want the same order each time.
	slices.SortFunc(list, func(a, b mirror.QueueStatus) int {
		return strings.Compare(a.Meta.ID.Name, b.Meta.ID.Name)
	})
	writeJSON(w, http.StatusOK, list)
}

// queueAction serves POST /api/queues/{vhost}/{name}/actions.
func (s *Server) queueAction(w http.ResponseWriter, r *http.Request, id mirror.QueueID) {
	var req QueueAction
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("request body: expected {\"action\": %q or %q}: %v", actionSync, actionCancelSync, err))
		return
	}
	var do func(context.Context, mirror.QueueID) error
	switch req.Action {
	case actionSync:
		if s.queues != nil {
			do = s.queues.SyncQueue
		}
	case actionCancelSync:
		if s.queues != nil {
			do = s.queues.CancelSyncQueue
		}
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("action: expected %q or %q, found %q", actionSync, actionCancelSync, req.Action))
		return
	}
	if s.queues == nil {
		writeError(w, http.StatusConflict, errMirroringOff)
		return
	}
	if err := do(r.Context(), id); err != nil {
		if errors.Is(err, mirror.ErrQueueNotFound) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("%v not found (list_queues lists the queues the proxy knows)", id))
			return
		}
		writeError(w, engineStatus(err), fmt.Sprintf("%s %v: %v", req.Action, id, err))
		return
	}
	s.logger.Info("queue action", "action", req.Action, "vhost", id.VHost, "queue", id.Name)
	w.WriteHeader(http.StatusNoContent)
}

// engineStatus is the HTTP status of an engine failure: 503 when the
// metadata log has no leader to answer (try again), 500 otherwise.
func engineStatus(err error) int {
	if errors.Is(err, store.ErrNotLeader) || errors.Is(err, store.ErrClosed) {
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
