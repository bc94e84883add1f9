// Package admin is amqp-mirror's HTTP admin API, used by `amqp-mirror ctl`:
// runtime policies (the rabbitmqctl set_policy family), policy explanations,
// the mirrored queues and their synchronisation (list_queues, sync_queue),
// the read-only views of the cluster and its clients (cluster_status,
// list_connections, list_consumers), a status page for browsers, and a
// Prometheus /metrics endpoint; plus the Go client and the ctl command
// line built on it.
//
// Endpoints (JSON; vhost and name are path-escaped, "/" is %2F):
//
//	GET    /api/policies[?vhost=V]                 list, with source
//	PUT    /api/policies/{vhost}/{name}            set_policy
//	DELETE /api/policies/{vhost}/{name}            clear_policy
//	GET    /api/operator-policies[?vhost=V]        list
//	PUT    /api/operator-policies/{vhost}/{name}   set_operator_policy
//	DELETE /api/operator-policies/{vhost}/{name}   clear_operator_policy
//	GET    /api/explain?vhost=V&name=Q[&kind=queue|exchange][&exclusive=true]
//	GET    /api/queues[?vhost=V][&unacked=false]    list_queues (vhost "/" by default)
//	GET    /api/cluster                            cluster_status: proxies, metadata leader and voters, pause, backends
//	GET    /api/connections                        list_connections: every proxy's client connections
//	GET    /api/consumers[?vhost=V]                list_consumers: their consumers (every vhost by default)
//	POST   /api/queues/{vhost}/{name}/actions      {"action":"sync"} or {"action":"cancel_sync"}
//	POST   /api/backends/{name}/actions            {"action":"drain"} (answers the report) or {"action":"undrain"}
//	GET    /metrics                                Prometheus text format (client_golang)
//	GET    /healthz                                200 "ok" while the process serves
//	GET    /readyz                                 200 "ok", or 503 "not ready: <reason>" (WithReadiness)
//	GET    / and /status                           the status page (HTML): nodes, backends, queues, recent failovers
//
// Every /api/ request needs "Authorization: Bearer <token>", compared in
// constant time; there is no anonymous access. /metrics, /healthz,
// /readyz and the status page are unauthenticated and read-only, like
// RabbitMQ's rabbitmq_prometheus plugin and its health checks, and hold
// nothing secret (no URL, password or token): bind listen.admin to a
// trusted interface. A list of a sidecar cluster that lacks a proxy's rows
// (it did not answer) comes with the Amqp-Mirror-Warning header naming it. Serve takes the listener it is given, a TLS one for
// HTTPS (listen.admin_tls). Errors are {"error": "..."} with 400 for bad input
// (the same validation and messages as the config file), 401 for a missing
// or wrong token, 404 for an unknown policy or queue, 409 for clearing a
// file policy or for the queue endpoints of a proxy without mirroring (one
// backend), 503 when the metadata log has no leader.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// maxBody bounds request bodies; a policy is a few hundred bytes.
const maxBody = 1 << 20

// PolicyRequest is the body of a PUT, shaped like RabbitMQ's management API.
type PolicyRequest struct {
	Pattern    string          `json:"pattern"`
	Definition json.RawMessage `json:"definition"`
	Priority   int             `json:"priority"`
	ApplyTo    string          `json:"apply-to,omitempty"`
}

// Server serves the admin API.
type Server struct {
	store    *config.PolicyStore
	token    [sha256.Size]byte
	hasToken bool
	logger   *slog.Logger
	registry *Registry
	queues   Queues       // nil: mirroring is off
	drainer  Drainer      // nil: mirroring is off (drain.go)
	keyring  Keyring      // nil: no sidecar cluster (keys.go)
	views    Views        // nil: no views (views.go)
	ready    func() error // nil: always ready (health.go)
	backends []string
	mux      *http.ServeMux
}

// WarningHeader carries, on a set_policy answer, what is legal in the
// policy but probably a mistake (config.PolicyWarning); ctl prints it.
const WarningHeader = "Amqp-Mirror-Warning"

// WithBackends names the configured backends, so that set_policy warns
// about ha-mode nodes names that are not among them.
func WithBackends(names []string) Option { return func(s *Server) { s.backends = names } }

// Option configures a Server.
type Option func(*Server)

// WithRegistry serves r at /metrics (by default a new, empty registry).
func WithRegistry(r *Registry) Option { return func(s *Server) { s.registry = r } }

// NewServer builds the API over store. An empty token refuses every /api/
// request.
func NewServer(store *config.PolicyStore, token string, logger *slog.Logger, opts ...Option) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{store: store, token: sha256.Sum256([]byte(token)), hasToken: token != "", logger: logger, mux: http.NewServeMux()}
	for _, o := range opts {
		o(s)
	}
	if s.registry == nil {
		s.registry = NewRegistry()
	}
	s.registry.Gauge(`amqp_mirror_policies{kind="policy"}`, "Policies in effect, file and runtime.", func() float64 {
		return float64(len(store.Snapshot().Policies))
	})
	s.registry.Gauge(`amqp_mirror_policies{kind="operator_policy"}`, "Policies in effect, file and runtime.", func() float64 {
		return float64(len(store.Snapshot().OperatorPolicies))
	})
	s.registry.Counter("amqp_mirror_policy_changes_total", "Changes of the policy set since start.", func() float64 {
		return float64(store.Snapshot().Version - 1)
	})
	// Policy paths are routed by hand on the escaped path: ServeMux
	// patterns cannot carry the default vhost "/", which arrives as %2F.
	s.mux.HandleFunc("/api/", s.auth(s.route))
	s.mux.Handle("GET /metrics", s.registry.Handler())
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET /{$}", s.statusPage)
	s.mux.HandleFunc("GET /status", s.statusPage)
	return s
}

// Registry returns the registry served at /metrics, for the proxy's metrics.
func (s *Server) Registry() *Registry { return s.registry }

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Serve serves on ln until ctx ends, then shuts down gracefully (waiting at
// most five seconds for requests in flight).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler: s.mux,
		// It bounds a TLS handshake too.
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(httpErrorLog{s.logger}, "", 0),
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(shutdownCtx)
	}()
	err := hs.Serve(ln)
	close(done)
	<-stopped
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		given, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(given))
		// Hashing first makes the comparison constant-time in the length too.
		if !ok || !s.hasToken || subtle.ConstantTimeCompare(sum[:], s.token[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="amqp-mirror"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong admin token (Authorization: Bearer <token>; see admin_token and state_dir/admin.token)")
			return
		}
		next(w, r)
	}
}

// route dispatches /api/{policies|operator-policies}[/{vhost}/{name}],
// /api/explain, /api/queues[/{vhost}/{name}/actions], /api/keys,
// /api/backends/{name}/actions and the views (/api/cluster,
// /api/connections, /api/consumers).
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/api/"), "/")
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("path: %v", err))
			return
		}
		parts[i] = u
	}
	operator := parts[0] == "operator-policies"
	switch {
	case len(parts) == 1 && parts[0] == "explain" && r.Method == http.MethodGet:
		s.explain(w, r)
	case len(parts) == 1 && parts[0] == "keys" && (r.Method == http.MethodGet || r.Method == http.MethodPost):
		s.keys(w, r)
	case len(parts) == 1 && parts[0] == "queues" && r.Method == http.MethodGet:
		s.listQueues(w, r)
	case len(parts) == 1 && parts[0] == "cluster" && r.Method == http.MethodGet:
		s.clusterStatus(w, r)
	case len(parts) == 1 && parts[0] == "connections" && r.Method == http.MethodGet:
		s.listConnections(w, r)
	case len(parts) == 1 && parts[0] == "consumers" && r.Method == http.MethodGet:
		s.listConsumers(w, r)
	case len(parts) == 4 && parts[0] == "queues" && parts[3] == "actions" && r.Method == http.MethodPost:
		s.queueAction(w, r, mirror.QueueID{VHost: parts[1], Name: parts[2]})
	case len(parts) == 3 && parts[0] == "backends" && parts[2] == "actions" && r.Method == http.MethodPost:
		s.backendAction(w, r, parts[1])
	case len(parts) == 1 && (parts[0] == "policies" || operator) && r.Method == http.MethodGet:
		s.list(w, r, operator)
	case len(parts) == 3 && (parts[0] == "policies" || operator) && r.Method == http.MethodPut:
		s.put(w, r, parts[1], parts[2], operator)
	case len(parts) == 3 && (parts[0] == "policies" || operator) && r.Method == http.MethodDelete:
		s.delete(w, parts[1], parts[2], operator)
	default:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.EscapedPath()))
	}
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, operator bool) {
	list := s.store.Snapshot().List(r.URL.Query().Get("vhost"), operator)
	if list == nil {
		list = []config.Policy{}
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) put(w http.ResponseWriter, r *http.Request, vhost, name string, operator bool) {
	var req PolicyRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "request body: expected {\"pattern\", \"definition\", \"priority\", \"apply-to\"}: "+err.Error())
		return
	}
	p, err := toPolicy(vhost, name, req, operator)
	if err == nil {
		if operator {
			p, err = s.store.SetOperatorPolicy(p)
		} else {
			p, err = s.store.SetPolicy(p)
		}
	}
	switch {
	case errors.Is(err, config.ErrNoMajority):
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.logger.Info("policy set", "vhost", p.VHost, "name", p.Name, "pattern", p.Pattern,
		"apply_to", p.ApplyTo.String(), "priority", p.Priority, "definition", p.Definition.String(), "operator", operator)
	if s.backends != nil {
		if warning := config.PolicyWarning(p, s.backends); warning != "" {
			s.logger.Warn(warning)
			w.Header().Set(WarningHeader, warning)
		}
	}
	writeJSON(w, http.StatusOK, p)
}

func toPolicy(vhost, name string, req PolicyRequest, operator bool) (config.Policy, error) {
	var errs []error
	p := config.Policy{Name: name, VHost: vhost, Pattern: req.Pattern, Priority: req.Priority}
	if req.ApplyTo != "" {
		a, ok := config.ParseApplyTo(req.ApplyTo)
		if !ok {
			errs = append(errs, &config.FieldError{Path: "apply-to", Message: fmt.Sprintf("expected one of queues, exchanges, all, found %q", req.ApplyTo)})
		}
		p.ApplyTo = a
	}
	if len(req.Definition) == 0 {
		errs = append(errs, &config.FieldError{Path: "definition", Message: "expected a JSON object such as {\"ha-mode\":\"all\"}, found none"})
	} else {
		parse := config.ParseDefinition
		if operator {
			parse = config.ParseOperatorDefinition
		}
		d, err := parse(req.Definition)
		if err != nil {
			errs = append(errs, err)
		}
		p.Definition = d
	}
	return p, errors.Join(errs...)
}

func (s *Server) delete(w http.ResponseWriter, vhost, name string, operator bool) {
	var err error
	if operator {
		err = s.store.ClearOperatorPolicy(vhost, name)
	} else {
		err = s.store.ClearPolicy(vhost, name)
	}
	switch {
	case errors.Is(err, config.ErrPolicyNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, config.ErrFilePolicy):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, config.ErrNoMajority):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		s.logger.Info("policy cleared", "vhost", vhost, "name", name, "operator", operator)
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) explain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	vhost, name := q.Get("vhost"), q.Get("name")
	if vhost == "" {
		vhost = "/"
	}
	if name == "" {
		writeError(w, http.StatusBadRequest, "name: expected the queue or exchange name to explain, found none")
		return
	}
	kind := config.KindQueue
	switch q.Get("kind") {
	case "", "queue":
	case "exchange":
		kind = config.KindExchange
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("kind: expected queue or exchange, found %q", q.Get("kind")))
		return
	}
	exclusive := q.Get("exclusive") == "true"
	writeJSON(w, http.StatusOK, s.store.Snapshot().Explain(vhost, name, kind, exclusive))
}

type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
