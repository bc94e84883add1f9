package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
)

// Drainer is the replication engine's controlled stop of one backend (ctl
// drain, undrain). mirror/engine implements it; a proxy with one backend
// has none.
type Drainer interface {
	// Drain moves every queue off backend: masters promoted per
	// ha-promote-on-shutdown, slaves dropped; nothing is placed there
	// until Undrain. An unconfigured backend is engine.ErrUnknownBackend
	// (wrapped).
	Drain(ctx context.Context, backend string) (engine.DrainReport, error)
	// Undrain lets the engine place copies on backend again.
	Undrain(ctx context.Context, backend string) error
}

// WithDrainer serves drain and undrain from d. WithQueues given a Queues
// that is also a Drainer (the engine) sets it too. Without either, those
// endpoints answer errMirroringOff.
func WithDrainer(d Drainer) Option { return func(s *Server) { s.drainer = d } }

// Backend actions of POST /api/backends/{name}/actions.
const (
	actionDrain   = "drain"
	actionUndrain = "undrain"
)

// BackendAction is the body of POST /api/backends/{name}/actions.
type BackendAction struct {
	Action string `json:"action"`
}

// backendAction serves POST /api/backends/{name}/actions: drain answers
// the engine's report, undrain nothing.
func (s *Server) backendAction(w http.ResponseWriter, r *http.Request, backend string) {
	var req BackendAction
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("request body: expected {\"action\": %q or %q}: %v", actionDrain, actionUndrain, err))
		return
	}
	if req.Action != actionDrain && req.Action != actionUndrain {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("action: expected %q or %q, found %q", actionDrain, actionUndrain, req.Action))
		return
	}
	if s.drainer == nil {
		writeError(w, http.StatusConflict, errMirroringOff)
		return
	}
	var report engine.DrainReport
	var err error
	if req.Action == actionDrain {
		report, err = s.drainer.Drain(r.Context(), backend)
	} else {
		err = s.drainer.Undrain(r.Context(), backend)
	}
	if err != nil {
		if errors.Is(err, engine.ErrUnknownBackend) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("%s: %v", req.Action, err))
			return
		}
		writeError(w, engineStatus(err), fmt.Sprintf("%s backend '%s': %v", req.Action, backend, err))
		return
	}
	s.logger.Info("backend action", "action", req.Action, "backend", backend)
	if req.Action == actionUndrain {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// The engine's order is the log's; an operator reading the output, and
	// a test, want the same order each time.
	slices.SortStableFunc(report.Queues, func(a, b engine.DrainedQueue) int {
		if c := strings.Compare(a.ID.VHost, b.ID.VHost); c != 0 {
			return c
		}
		return strings.Compare(a.ID.Name, b.ID.Name)
	})
	writeJSON(w, http.StatusOK, report)
}

// Drain is `ctl drain`: it moves every queue off backend and keeps new
// copies off it until Undrain.
func (c *Client) Drain(ctx context.Context, backend string) (engine.DrainReport, error) {
	var out engine.DrainReport
	err := c.do(ctx, http.MethodPost, backendPath(backend), BackendAction{Action: actionDrain}, &out)
	return out, err
}

// Undrain is `ctl undrain`.
func (c *Client) Undrain(ctx context.Context, backend string) error {
	return c.do(ctx, http.MethodPost, backendPath(backend), BackendAction{Action: actionUndrain}, nil)
}

// The Client is the engine's Drainer over HTTP; the engine is one, which
// is what lets WithQueues(engine) serve drain too.
var (
	_ Drainer = (*Client)(nil)
	_ Drainer = (*engine.Engine)(nil)
)

func backendPath(backend string) string {
	return "/api/backends/" + url.PathEscape(backend) + "/actions"
}

// The backend commands, served by the engine's Drainer.
var (
	drainCommand = command{
		usage: "drain [--formatter table|json] BACKEND",
		brief: "moves every queue off a backend before it is stopped",
		summary: "A controlled stop of BACKEND (a name of the config's backends). Every queue mastered\n" +
			"there gets a new master as on the broker's clean shutdown: ha-promote-on-shutdown decides\n" +
			"(when-synced by default: the oldest live synchronised slave; a queue without one keeps\n" +
			"its master, and drain lists it). The epoch rises, and consumers move to the new master\n" +
			"by themselves. Slaves on BACKEND leave their queues and their copies are deleted; the\n" +
			"old masters' copies stay on the broker, unused, purged before they are slaves again.\n" +
			"No new master or slave is placed on BACKEND until undrain, or until the proxy restarts\n" +
			"(the drained state is kept in memory, by the proxy asked only). Draining again retries\n" +
			"the queues that stayed, e.g. after sync_queue.",
		args: 1,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Draining backend %s ...", a[0])
			report, err := c.Drain(ctx, a[0])
			if err != nil {
				return err
			}
			if o.formatter == formatJSON {
				if err := o.json(report); err != nil {
					return err
				}
			} else {
				o.drainReport(report)
			}
			if failed := countDrained(report, func(q engine.DrainedQueue) bool { return q.Error != "" }); failed > 0 {
				return fmt.Errorf("%d queue(s) could not be drained: the metadata log did not take the change; run drain again", failed)
			}
			return nil
		},
	}
	undrainCommand = command{
		usage:   "undrain BACKEND",
		brief:   "lets a drained backend hold masters and slaves again",
		summary: "Ends a drain: the engine places new masters and slaves on BACKEND again, and the\npolicies' slaves come back there (purged, then synchronised per ha-sync-mode). Masters\nthat moved stay where they are.",
		args:    1,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Undraining backend %s ...", a[0])
			return c.Undrain(ctx, a[0])
		},
	}
)

// drainReport prints one line per queue, as rabbitmqctl does per item,
// then a summary.
func (o *ctlOptions) drainReport(r engine.DrainReport) {
	for _, q := range r.Queues {
		switch {
		case q.Error != "":
			fmt.Fprintf(o.stdout, "%v: not drained: %s\n", q.ID, q.Error)
		case q.Moved():
			lost := ""
			if !q.Synchronised {
				lost = " (unsynchronised: messages only " + r.Backend + " held are lost)"
			}
			fmt.Fprintf(o.stdout, "%v: master %s -> %s%s\n", q.ID, r.Backend, q.To, lost)
		case q.Kept():
			fmt.Fprintf(o.stdout, "%v: master stays on %s: %s\n", q.ID, r.Backend, q.Reason)
		case q.Dropped():
			fmt.Fprintf(o.stdout, "%v: slave on %s dropped\n", q.ID, r.Backend)
		}
	}
	moved := countDrained(r, engine.DrainedQueue.Moved)
	kept := countDrained(r, engine.DrainedQueue.Kept)
	dropped := countDrained(r, engine.DrainedQueue.Dropped)
	o.say("Backend %s drained: %d master(s) moved, %d master(s) kept, %d slave(s) dropped. Nothing new is placed on it until `ctl undrain %s`.",
		r.Backend, moved, kept, dropped, r.Backend)
	if kept > 0 {
		o.say("The queues whose master stayed have no synchronised slave: stopping %s now leaves them without a master until it returns. Synchronise them (sync_queue) and drain again.", r.Backend)
	}
}

func countDrained(r engine.DrainReport, f func(engine.DrainedQueue) bool) int {
	n := 0
	for _, q := range r.Queues {
		if f(q) {
			n++
		}
	}
	return n
}
