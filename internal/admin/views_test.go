package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// fakeViews is what a node's views answer, fixed.
type fakeViews struct {
	cluster   ClusterStatus
	conns     []mirror.Connection
	consumers []mirror.Consumer
	failovers []mirror.Failover
	queues    []mirror.QueueStatus
	partial   error // returned with the lists, as a proxy that did not answer
}

func (f *fakeViews) ClusterStatus(context.Context) (ClusterStatus, error) { return f.cluster, nil }
func (f *fakeViews) Connections(context.Context) ([]mirror.Connection, error) {
	return f.conns, f.partial
}
func (f *fakeViews) Consumers(_ context.Context, vhost string) ([]mirror.Consumer, error) {
	var out []mirror.Consumer
	for _, c := range f.consumers {
		if vhost == "" || c.VHost == vhost {
			out = append(out, c)
		}
	}
	return out, f.partial
}
func (f *fakeViews) Failovers(context.Context) ([]mirror.Failover, error) {
	return f.failovers, f.partial
}
func (f *fakeViews) Queues() []mirror.QueueStatus { return f.queues }

var connectedAt = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

func newFakeViews() *fakeViews {
	return &fakeViews{
		cluster: ClusterStatus{
			Node: "rabbit1", Version: "v1.2.3", Sidecar: true, Mirroring: true, Leader: "rabbit2",
			Voters: []string{"rabbit1", "rabbit2", "rabbit3"},
			Nodes: []NodeStatus{
				{Name: "rabbit1", State: "alive", Backend: "rabbit1", AMQP: "10.0.0.1:5672", Admin: "127.0.0.1:15680", Voter: true, Self: true},
				{Name: "rabbit2", State: "alive", Backend: "rabbit2", AMQP: "10.0.0.2:5672", Admin: "127.0.0.1:15680", Voter: true, Leader: true},
				{Name: "rabbit3", State: "failed", Backend: "rabbit3", AMQP: "10.0.0.3:5672", Admin: "127.0.0.1:15680", Voter: true},
			},
			Backends: []BackendStatus{
				{Name: "rabbit1", State: "up", Home: true},
				{Name: "rabbit2", State: "up", Drained: true},
				{Name: "rabbit3", State: "down"},
			},
		},
		conns: []mirror.Connection{{
			Node: "rabbit1", Name: "10.0.0.9:40000 -> 10.0.0.1:5672", User: "app", VHost: "/", PeerHost: "10.0.0.9", PeerPort: 40000,
			Host: "10.0.0.1", Port: 5672, State: "running", Channels: 2, Protocol: "AMQP 0-9-1", ConnectedAt: connectedAt,
			FrameMax: 131072, ChannelMax: 2047, Timeout: 60, Backend: "rabbit1", Backends: []string{"rabbit1", "rabbit2"},
		}},
		consumers: []mirror.Consumer{
			{Node: "rabbit1", VHost: "/", Queue: "orders", Connection: "10.0.0.9:40000 -> 10.0.0.1:5672", Channel: 1, Tag: "ctag-1",
				AckRequired: true, PrefetchCount: 50, Active: true, Arguments: map[string]any{}, Backend: "rabbit2"},
			{Node: "rabbit1", VHost: "prod", Queue: "jobs", Connection: "10.0.0.9:40001 -> 10.0.0.1:5672", Channel: 3, Tag: "worker",
				Arguments: map[string]any{"x-priority": 5}, Backend: "rabbit3"},
		},
	}
}

func TestCtlViews(t *testing.T) {
	views := newFakeViews()
	f := newFixture(t, WithViews(views))
	partial := newFakeViews()
	partial.partial = errors.Join(errors.New("no answer from rabbit3"), errors.New("no answer from rabbit4"))
	p := newFixture(t, WithViews(partial))
	none := newFixture(t)
	runCtlCases(t, []ctlCase{
		{"cluster_status", f.client, []string{"cluster_status"}, 0,
			"Cluster status of proxy rabbit1 ...\nBasics\n\nProxy: rabbit1\nVersion: v1.2.3\nSidecar cluster: yes\nMirroring: yes\n" +
				"Metadata leader: rabbit2\nVoters: [rabbit1, rabbit2, rabbit3]\nPaused: no\n\n" +
				"Proxies\n\nname\tstate\tvoter\tleader\tbackend\tamqp\tadmin\n" +
				"rabbit1\talive\ttrue\tfalse\trabbit1\t10.0.0.1:5672\t127.0.0.1:15680\n" +
				"rabbit2\talive\ttrue\ttrue\trabbit2\t10.0.0.2:5672\t127.0.0.1:15680\n" +
				"rabbit3\tfailed\ttrue\tfalse\trabbit3\t10.0.0.3:5672\t127.0.0.1:15680\n\n" +
				"Backends\n\nname\tstate\tdrained\thome\nrabbit1\tup\tfalse\ttrue\nrabbit2\tup\ttrue\tfalse\nrabbit3\tdown\tfalse\tfalse\n", ""},
		{"cluster_status json is one object", f.client, []string{"cluster_status", "--formatter", "json"}, 0,
			`{"node":"rabbit1","version":"v1.2.3","sidecar":true,"mirroring":true,"paused":false,"leader":"rabbit2","voters":["rabbit1","rabbit2","rabbit3"],"nodes":[` +
				`{"name":"rabbit1","state":"alive","backend":"rabbit1","amqp":"10.0.0.1:5672","admin":"127.0.0.1:15680","voter":true,"leader":false,"self":true},` +
				`{"name":"rabbit2","state":"alive","backend":"rabbit2","amqp":"10.0.0.2:5672","admin":"127.0.0.1:15680","voter":true,"leader":true,"self":false},` +
				`{"name":"rabbit3","state":"failed","backend":"rabbit3","amqp":"10.0.0.3:5672","admin":"127.0.0.1:15680","voter":true,"leader":false,"self":false}],` +
				`"backends":[{"name":"rabbit1","state":"up","drained":false,"home":true},{"name":"rabbit2","state":"up","drained":true,"home":false},{"name":"rabbit3","state":"down","drained":false,"home":false}]}` + "\n", ""},
		{"list_connections, default columns", f.client, []string{"list_connections"}, 0,
			"Listing connections ...\nuser\tpeer_host\tpeer_port\tstate\tbackend\napp\t10.0.0.9\t40000\trunning\trabbit1\n", ""},
		{"list_connections, chosen columns", f.client, []string{"list_connections", "-q", "name", "channels", "connected_at", "timeout", "backends", "ssl"}, 0,
			"name\tchannels\tconnected_at\ttimeout\tbackends\tssl\n10.0.0.9:40000 -> 10.0.0.1:5672\t2\t1714564800000\t60\t[rabbit1, rabbit2]\tfalse\n", ""},
		{"list_connections json", f.client, []string{"list_connections", "--formatter", "json", "user", "vhost", "frame_max", "node"}, 0,
			`[{"user":"app","vhost":"/","frame_max":131072,"node":"rabbit1"}]` + "\n", ""},
		{"list_consumers, default columns and vhost", f.client, []string{"list_consumers"}, 0,
			"Listing consumers in vhost / ...\nqueue_name\tchannel_pid\tconsumer_tag\tack_required\tprefetch_count\tactive\targuments\tbackend\n" +
				"orders\t10.0.0.9:40000 -> 10.0.0.1:5672 (1)\tctag-1\ttrue\t50\ttrue\t[]\trabbit2\n", ""},
		{"list_consumers of another vhost", f.client, []string{"list_consumers", "-p", "prod", "-q", "queue_name", "channel_number", "active", "arguments", "exclusive"}, 0,
			"queue_name\tchannel_number\tactive\targuments\texclusive\njobs\t3\tfalse\t{\"x-priority\":5}\tfalse\n", ""},
		{"list_consumers json", f.client, []string{"list_consumers", "-p", "prod", "--formatter", "json", "consumer_tag", "channel", "arguments"}, 0,
			`[{"consumer_tag":"worker","channel":"10.0.0.9:40001 -> 10.0.0.1:5672 (3)","arguments":{"x-priority":5}}]` + "\n", ""},
		{"list_consumers, none", f.client, []string{"list_consumers", "-p", "empty", "--formatter", "json"}, 0, "[]\n", ""},
		{"unknown connection column", f.client, []string{"list_connections", "user", "pid"}, ExitUsage, "",
			`Error: unknown column(s) "pid": valid columns are name, user, vhost, peer_host, peer_port, host, port, state, channels, ssl, protocol, connected_at, frame_max, channel_max, timeout, node, backend, backends`},
		{"unknown consumer column", f.client, []string{"list_consumers", "queue"}, ExitUsage, "",
			`Error: unknown column(s) "queue": valid columns are queue_name, channel, connection, channel_number, consumer_tag, ack_required, exclusive, prefetch_count, active, arguments, node, backend (also rabbitmqctl's channel_pid)`},
		{"a proxy that did not answer is a warning", p.client, []string{"list_connections", "-q", "user"}, 0,
			"user\napp\n", "warning: incomplete: no answer from rabbit3; no answer from rabbit4"},
		{"a server without views", none.client, []string{"cluster_status"}, ExitSoftware, "", "Error: " + errNoViews},
	}, testToken)
}

// TestViewEndpointsNeedTheToken: the views are /api/ endpoints like the
// others; the status page is not.
func TestViewEndpointsNeedTheToken(t *testing.T) {
	f := newFixture(t, WithViews(newFakeViews()))
	for _, path := range []string{"/api/cluster", "/api/connections", "/api/consumers?vhost=%2F"} {
		resp, err := http.Get(f.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", path, resp.StatusCode)
		}
	}
	for _, path := range []string{"/", "/status"} {
		resp, err := http.Get(f.url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Errorf("GET %s without a token: %d %s, want 200 text/html", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if strings.Contains(string(body), testToken) {
			t.Errorf("GET %s shows the admin token", path)
		}
	}
	resp, err := http.Get(f.url + "/nothing-here")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nothing-here: %d, want 404 (only / and /status are the page)", resp.StatusCode)
	}
}
