package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/amqp-mirror/amqp-mirror/config"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Client calls the admin API.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:15680
	Token   string
	HTTP    *http.Client // nil means http.DefaultClient
	// Warn, when set, receives the warnings an answer carries (a
	// set_policy naming unknown backends); nil drops them.
	Warn func(warning string)
}

// APIError is a refusal from the server, carrying its message.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status)
}

// SetPolicy is rabbitmqctl set_policy. applyTo "" means all;
// definitionJSON is the DEFINITION argument as given.
func (c *Client) SetPolicy(ctx context.Context, vhost, name, pattern, applyTo string, priority int, definitionJSON string) error {
	return c.set(ctx, "policies", vhost, name, pattern, applyTo, priority, definitionJSON)
}

// SetOperatorPolicy is rabbitmqctl set_operator_policy.
func (c *Client) SetOperatorPolicy(ctx context.Context, vhost, name, pattern, applyTo string, priority int, definitionJSON string) error {
	return c.set(ctx, "operator-policies", vhost, name, pattern, applyTo, priority, definitionJSON)
}

// ClearPolicy is rabbitmqctl clear_policy.
func (c *Client) ClearPolicy(ctx context.Context, vhost, name string) error {
	return c.do(ctx, http.MethodDelete, policyPath("policies", vhost, name), nil, nil)
}

// ClearOperatorPolicy is rabbitmqctl clear_operator_policy.
func (c *Client) ClearOperatorPolicy(ctx context.Context, vhost, name string) error {
	return c.do(ctx, http.MethodDelete, policyPath("operator-policies", vhost, name), nil, nil)
}

// ListPolicies lists the policies of vhost ("" for all vhosts).
func (c *Client) ListPolicies(ctx context.Context, vhost string) ([]config.Policy, error) {
	return c.list(ctx, "policies", vhost)
}

// ListOperatorPolicies lists the operator policies of vhost ("" for all).
func (c *Client) ListOperatorPolicies(ctx context.Context, vhost string) ([]config.Policy, error) {
	return c.list(ctx, "operator-policies", vhost)
}

// Explain asks which policies apply to queue in vhost, and why.
func (c *Client) Explain(ctx context.Context, vhost, queue string) (config.Report, error) {
	var r config.Report
	q := url.Values{"vhost": {vhost}, "name": {queue}}
	err := c.do(ctx, http.MethodGet, "/api/explain?"+q.Encode(), nil, &r)
	return r, err
}

// The Client is the engine's Queues over HTTP: ctl and the server speak the
// same three calls.
var _ Queues = (*Client)(nil)

// ListQueues lists the queues of vhost ("" means "/") with their master,
// slaves and counts, sorted by name; the unacknowledged counts only with
// unacked.
func (c *Client) ListQueues(ctx context.Context, vhost string, unacked bool) ([]mirror.QueueStatus, error) {
	query := url.Values{}
	if vhost != "" {
		query.Set("vhost", vhost)
	}
	if !unacked {
		query.Set("unacked", "false")
	}
	path := "/api/queues"
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	var out []mirror.QueueStatus
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// ClusterStatus is rabbitmqctl cluster_status.
func (c *Client) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	var st ClusterStatus
	err := c.do(ctx, http.MethodGet, "/api/cluster", nil, &st)
	return st, err
}

// ListConnections is rabbitmqctl list_connections: every proxy's client
// connections.
func (c *Client) ListConnections(ctx context.Context) ([]mirror.Connection, error) {
	var out []mirror.Connection
	err := c.do(ctx, http.MethodGet, "/api/connections", nil, &out)
	return out, err
}

// ListConsumers is rabbitmqctl list_consumers: the consumers of vhost (""
// for every vhost) of every proxy's clients.
func (c *Client) ListConsumers(ctx context.Context, vhost string) ([]mirror.Consumer, error) {
	path := "/api/consumers"
	if vhost != "" {
		path += "?" + url.Values{"vhost": {vhost}}.Encode()
	}
	var out []mirror.Consumer
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// SyncQueue is rabbitmqctl sync_queue: it starts synchronising the queue's
// unsynchronised slaves.
func (c *Client) SyncQueue(ctx context.Context, id mirror.QueueID) error {
	return c.queueAction(ctx, id, actionSync)
}

// CancelSyncQueue is rabbitmqctl cancel_sync_queue.
func (c *Client) CancelSyncQueue(ctx context.Context, id mirror.QueueID) error {
	return c.queueAction(ctx, id, actionCancelSync)
}

func (c *Client) queueAction(ctx context.Context, id mirror.QueueID, action string) error {
	vhost := id.VHost
	if vhost == "" {
		vhost = "/"
	}
	path := "/api/queues/" + url.PathEscape(vhost) + "/" + url.PathEscape(id.Name) + "/actions"
	return c.do(ctx, http.MethodPost, path, QueueAction{Action: action}, nil)
}

func (c *Client) set(ctx context.Context, kind, vhost, name, pattern, applyTo string, priority int, definitionJSON string) error {
	if !json.Valid([]byte(definitionJSON)) {
		return &config.FieldError{Path: "definition", Message: fmt.Sprintf("expected a JSON object such as '{\"ha-mode\":\"all\"}', found %q", definitionJSON)}
	}
	body := PolicyRequest{Pattern: pattern, Definition: json.RawMessage(definitionJSON), Priority: priority, ApplyTo: applyTo}
	return c.do(ctx, http.MethodPut, policyPath(kind, vhost, name), body, nil)
}

func (c *Client) list(ctx context.Context, kind, vhost string) ([]config.Policy, error) {
	path := "/api/" + kind
	if vhost != "" {
		path += "?" + url.Values{"vhost": {vhost}}.Encode()
	}
	var out []config.Policy
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

func policyPath(kind, vhost, name string) string {
	if vhost == "" {
		vhost = "/"
	}
	return "/api/" + kind + "/" + url.PathEscape(vhost) + "/" + url.PathEscape(name)
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	header := http.Header{"Authorization": {"Bearer " + c.Token}}
	if body != nil {
		header.Set("Content-Type", "application/json")
	}
	resp, data, err := c.roundTrip(ctx, method, path, header, rd, 16<<20)
	if err != nil {
		return err
	}
	if len(data) > 0 && !isJSON(resp) && !strings.Contains(string(data), "HTTP request to an HTTPS server") {
		// Every answer of the admin API is JSON: this is another server
		// (RabbitMQ's management plugin is a natural mistake), whose page
		// would mean nothing printed as an error.
		return &NotAdminAPIError{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Server: resp.Header.Get("Server")}
	}
	if resp.StatusCode >= 300 {
		var e errorBody
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		return &APIError{Status: resp.StatusCode, Message: e.Error}
	}
	if c.Warn != nil {
		for _, warning := range resp.Header.Values(WarningHeader) {
			c.Warn(warning)
		}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("admin API %s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

// roundTrip sends one request to the admin API and reads at most limit
// bytes of the answer.
func (c *Client) roundTrip(ctx context.Context, method, path string, header http.Header, body io.Reader, limit int64) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.BaseURL, "/")+path, body)
	if err != nil {
		return nil, nil, err
	}
	maps.Copy(req.Header, header)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	return resp, data, err
}

// isJSON reports whether resp says its body is JSON.
func isJSON(resp *http.Response) bool {
	media, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return media == "application/json"
}

// NotAdminAPIError is an answer that cannot come from the admin API: it
// is not JSON.
type NotAdminAPIError struct {
	Status      int
	ContentType string
	Server      string // the Server header, "" when there is none
}

func (e *NotAdminAPIError) Error() string {
	what := e.ContentType
	if what == "" {
		what = "no content type"
	}
	if e.Server != "" {
		what += ", server " + e.Server
	}
	return fmt.Sprintf("HTTP %d with %s, not the admin API's JSON", e.Status, what)
}
