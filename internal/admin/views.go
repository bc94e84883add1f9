package admin

import (
	"context"
	"net/http"
	"strings"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Views is what the read-only views show beyond the engine's queues: the
// cluster of proxies, their clients and the failovers (ctl cluster_status,
// list_connections, list_consumers and the status page). internal/node
// implements it. The lists of a sidecar cluster are every proxy's: when a
// proxy does not answer, a method returns the rows it has with an error
// naming it, which the API passes on as a warning.
type Views interface {
	// ClusterStatus describes this proxy, the others it knows, the
	// metadata log's leader and voters, and the backends.
	ClusterStatus(ctx context.Context) (ClusterStatus, error)
	// Connections lists the client connections of the proxies.
	Connections(ctx context.Context) ([]mirror.Connection, error)
	// Consumers lists the consumers of the proxies' clients in vhost (""
	// for every vhost).
	Consumers(ctx context.Context, vhost string) ([]mirror.Consumer, error)
	// Failovers lists the last promotions the proxies wrote, newest first.
	Failovers(ctx context.Context) ([]mirror.Failover, error)
	// Queues lists every recorded queue with its copies, asking no broker;
	// nil without mirroring.
	Queues() []mirror.QueueStatus
}

// WithViews serves cluster_status, list_connections, list_consumers and
// the status page from v. Without it the first three answer 501 and the
// status page shows nothing but this proxy's health.
func WithViews(v Views) Option { return func(s *Server) { s.views = v } }

// ClusterStatus is the answer of GET /api/cluster (ctl cluster_status),
// as rabbitmqctl cluster_status describes a RabbitMQ cluster: the proxies
// are its nodes, the backends its brokers. A proxy alone lists itself.
type ClusterStatus struct {
	// Node is the proxy asked (its config `node`, "proxy" in drop-in mode)
	// and Version its build.
	Node    string `json:"node"`
	Version string `json:"version"`
	// Sidecar is set for a member of a sidecar cluster; Mirroring unless
	// the proxy has one backend (then there is no metadata log).
	Sidecar   bool `json:"sidecar"`
	Mirroring bool `json:"mirroring"`
	// Paused: this proxy sees no majority of its cluster (pause_minority),
	// or waits for its log to catch up, and refuses clients.
	Paused bool `json:"paused"`
	// Leader is the metadata log's leader as this proxy knows it, "" for
	// none; Voters its voters.
	Leader   string          `json:"leader"`
	Voters   []string        `json:"voters"`
	Nodes    []NodeStatus    `json:"nodes"`
	Backends []BackendStatus `json:"backends"`
}

// NodeStatus is one proxy of the cluster.
type NodeStatus struct {
	Name string `json:"name"`
	// State is serf's: alive, leaving, left or failed.
	State string `json:"state"`
	// Backend is the broker beside the proxy, AMQP and Admin its
	// listeners' addresses.
	Backend string `json:"backend"`
	AMQP    string `json:"amqp"`
	Admin   string `json:"admin"`
	Voter   bool   `json:"voter"`
	Leader  bool   `json:"leader"`
	// Self marks the proxy asked.
	Self bool `json:"self"`
}

// BackendStatus is one configured backend.
type BackendStatus struct {
	Name string `json:"name"`
	// State is up, down or unknown (not probed yet), as the proxy counts
	// it: its own probe, and in a sidecar cluster serf's verdict on the
	// proxy beside it.
	State string `json:"state"`
	// Drained: ctl drain moved everything off it on this proxy.
	Drained bool `json:"drained"`
	// Home: this proxy's clients are served by it first.
	Home bool `json:"home"`
}

// errNoViews answers the view endpoints of a server built without them.
const errNoViews = "this admin server has no views of the proxy"

// clusterStatus serves GET /api/cluster.
func (s *Server) clusterStatus(w http.ResponseWriter, r *http.Request) {
	if s.views == nil {
		writeError(w, http.StatusNotImplemented, errNoViews)
		return
	}
	st, err := s.views.ClusterStatus(r.Context())
	if err != nil {
		writeError(w, engineStatus(err), "cluster status: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// listConnections serves GET /api/connections.
func (s *Server) listConnections(w http.ResponseWriter, r *http.Request) {
	if s.views == nil {
		writeError(w, http.StatusNotImplemented, errNoViews)
		return
	}
	list, err := s.views.Connections(r.Context())
	writeRows(w, list, err)
}

// listConsumers serves GET /api/consumers[?vhost=V]; no vhost means every
// vhost.
func (s *Server) listConsumers(w http.ResponseWriter, r *http.Request) {
	if s.views == nil {
		writeError(w, http.StatusNotImplemented, errNoViews)
		return
	}
	list, err := s.views.Consumers(r.Context(), r.URL.Query().Get("vhost"))
	writeRows(w, list, err)
}

// writeRows answers a list that may be partial: the rows that came, and
// the error naming the proxies that did not answer as a warning.
func writeRows[T any](w http.ResponseWriter, rows []T, partial error) {
	if rows == nil {
		rows = []T{}
	}
	if partial != nil {
		// One line: errors.Join puts each proxy's on a line of its own.
		w.Header().Set(WarningHeader, "incomplete: "+strings.ReplaceAll(partial.Error(), "\n", "; "))
	}
	writeJSON(w, http.StatusOK, rows)
}
