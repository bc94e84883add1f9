package admin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// The read-only view commands: cluster_status, list_connections and
// list_consumers, with rabbitmqctl's output conventions.

// column is one column of a list command over rows of type T.
type column[T any] struct {
	name        string
	description string
	value       func(T) any // string, []string, int, bool or map[string]any
}

// columnSet is a list command's columns, the default ones and rabbitmqctl's
// names accepted for some (the output keeps the name asked for).
type columnSet[T any] struct {
	columns  []column[T]
	defaults []string
	aliases  map[string]string
}

func (cs columnSet[T]) find(name string) (column[T], bool) {
	if real, ok := cs.aliases[name]; ok {
		name = real
	}
	for _, c := range cs.columns {
		if c.name == name {
			return c, true
		}
	}
	return column[T]{}, false
}

// check refuses unknown column names before anything is asked of the
// proxy, naming the valid ones.
func (cs columnSet[T]) check(args []string) error {
	var unknown []string
	for _, a := range args {
		if _, ok := cs.find(a); !ok {
			unknown = append(unknown, fmt.Sprintf("%q", a))
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	valid := make([]string, 0, len(cs.columns))
	for _, c := range cs.columns {
		valid = append(valid, c.name)
	}
	aliases := ""
	if len(cs.aliases) > 0 {
		names := slices.Sorted(maps.Keys(cs.aliases))
		aliases = " (also rabbitmqctl's " + strings.Join(names, ", ") + ")"
	}
	return fmt.Errorf("unknown column(s) %s: valid columns are %s%s", strings.Join(unknown, ", "), strings.Join(valid, ", "), aliases)
}

// help lists the columns, one line each, then the default.
func (cs columnSet[T]) help() string {
	width := 0
	for _, c := range cs.columns {
		width = max(width, len(c.name))
	}
	var b strings.Builder
	for _, c := range cs.columns {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, c.name, c.description)
	}
	return b.String() + "Default: " + strings.Join(cs.defaults, " ") + "."
}

// print prints rows with the given (checked) columns, the defaults when
// none: a tab-separated table with a header line, or with --formatter json
// an array of objects keyed by column, in the order asked.
func (cs columnSet[T]) print(o *ctlOptions, rows []T, names []string) error {
	if len(names) == 0 {
		names = cs.defaults
	}
	columns := make([]column[T], len(names))
	for i, n := range names {
		columns[i], _ = cs.find(n)
	}
	if o.formatter == formatJSON {
		objects := make([]orderedObject, 0, len(rows))
		for _, row := range rows {
			object := make(orderedObject, len(columns))
			for i, c := range columns {
				object[i] = field{names[i], c.value(row)}
			}
			objects = append(objects, object)
		}
		return o.json(objects)
	}
	fmt.Fprintln(o.stdout, strings.Join(names, "\t"))
	cells := make([]string, len(columns))
	for _, row := range rows {
		for i, c := range columns {
			cells[i] = tableCell(c.value(row))
		}
		fmt.Fprintln(o.stdout, strings.Join(cells, "\t"))
	}
	return nil
}

// connectionColumns are list_connections' columns: rabbitmqctl's that
// apply to a proxy, then where the connection is served.
var connectionColumns = columnSet[mirror.Connection]{
	columns: []column[mirror.Connection]{
		{"name", "the connection's name: client address -> proxy address", func(c mirror.Connection) any { return c.Name }},
		{"user", "the user the client logged in as", func(c mirror.Connection) any { return c.User }},
		{"vhost", "the connection's virtual host", func(c mirror.Connection) any { return c.VHost }},
		{"peer_host", "the client's address", func(c mirror.Connection) any { return c.PeerHost }},
		{"peer_port", "the client's port", func(c mirror.Connection) any { return c.PeerPort }},
		{"host", "the proxy's address the client connected to", func(c mirror.Connection) any { return c.Host }},
		{"port", "the proxy's port the client connected to", func(c mirror.Connection) any { return c.Port }},
		{"state", "running, or closing while its close handshake runs", func(c mirror.Connection) any { return c.State }},
		{"channels", "channels open", func(c mirror.Connection) any { return c.Channels }},
		{"ssl", "true over TLS (listen.amqps)", func(c mirror.Connection) any { return c.SSL }},
		{"protocol", "the protocol: AMQP 0-9-1", func(c mirror.Connection) any { return c.Protocol }},
		{"connected_at", "when the handshake finished, in milliseconds since the Unix epoch, as rabbitmqctl gives it", func(c mirror.Connection) any { return int(c.ConnectedAt.UnixMilli()) }},
		{"frame_max", "the largest frame agreed, in bytes", func(c mirror.Connection) any { return int(c.FrameMax) }},
		{"channel_max", "the most channels agreed", func(c mirror.Connection) any { return int(c.ChannelMax) }},
		{"timeout", "the heartbeat interval agreed, in seconds (0: none)", func(c mirror.Connection) any { return c.Timeout }},
		{"node", "the proxy the client is connected to (its config node; empty in drop-in mode)", func(c mirror.Connection) any { return c.Node }},
		{"backend", "the home backend: where the connection's channel 0 and unmirrored queues are", func(c mirror.Connection) any { return c.Backend }},
		{"backends", "every backend the connection has a link to now", func(c mirror.Connection) any { return nonNil(c.Backends) }},
	},
	defaults: []string{"user", "peer_host", "peer_port", "state", "backend"},
}

// consumerColumns are list_consumers' columns: rabbitmqctl's, with the
// channel named as RabbitMQ names channels, then where the consumer is
// served.
var consumerColumns = columnSet[mirror.Consumer]{
	columns: []column[mirror.Consumer]{
		{"queue_name", "the queue consumed, as the client named it", func(c mirror.Consumer) any { return c.Queue }},
		{"channel", "the channel, named as RabbitMQ names channels: connection name (channel number)", func(c mirror.Consumer) any { return channelName(c) }},
		{"connection", "the connection's name (list_connections name)", func(c mirror.Consumer) any { return c.Connection }},
		{"channel_number", "the channel's number on its connection", func(c mirror.Consumer) any { return int(c.Channel) }},
		{"consumer_tag", "the consumer's tag", func(c mirror.Consumer) any { return c.Tag }},
		{"ack_required", "false for a no-ack consumer", func(c mirror.Consumer) any { return c.AckRequired }},
		{"exclusive", "true for an exclusive consumer", func(c mirror.Consumer) any { return c.Exclusive }},
		{"prefetch_count", "the channel's per-consumer basic.qos when it started consuming (0: none)", func(c mirror.Consumer) any { return c.PrefetchCount }},
		{"active", "false while it waits for its queue's new master after a failover", func(c mirror.Consumer) any { return c.Active }},
		{"arguments", "basic.consume's arguments", func(c mirror.Consumer) any { return nonNilMap(c.Arguments) }},
		{"node", "the proxy of the consumer's connection", func(c mirror.Consumer) any { return c.Node }},
		{"backend", "the backend it consumes on: its queue's master", func(c mirror.Consumer) any { return c.Backend }},
	},
	defaults: []string{"queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active", "arguments", "backend"},
	aliases:  map[string]string{"channel_pid": "channel"},
}

// channelName is RabbitMQ's name of a channel.
func channelName(c mirror.Consumer) string {
	return c.Connection + " (" + strconv.Itoa(int(c.Channel)) + ")"
}

func nonNilMap(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// The view commands, served by the node's Views.
var (
	clusterStatusCommand = command{
		usage: "cluster_status [--formatter table|json]",
		brief: "shows the proxies, the metadata leader and voters, the pause and the backends",
		summary: "Shows the cluster as this proxy sees it, as rabbitmqctl cluster_status shows a RabbitMQ\n" +
			"cluster: the proxies (alive, leaving, left or failed; voter and leader of the metadata\n" +
			"log), whether this proxy is paused for want of a majority, and each backend (up, down\n" +
			"or unknown, drained, home). A proxy alone lists itself. --formatter json prints one object.",
		run: func(ctx context.Context, c *Client, o *ctlOptions, _ []string) error {
			st, err := c.ClusterStatus(ctx)
			if err != nil {
				return err
			}
			if o.formatter == formatJSON {
				return o.json(st)
			}
			o.say("Cluster status of proxy %s ...", st.Node)
			printClusterStatus(o, st)
			return nil
		},
	}
	listConnectionsCommand = command{
		usage: "list_connections [--formatter table|json] [COLUMN ...]",
		brief: "lists the client connections of every proxy",
		summary: "Lists the client connections that finished their handshake, of this proxy and, in a\n" +
			"sidecar cluster, of every other live proxy (a proxy that does not answer is named in a\n" +
			"warning). COLUMN is one or more of:\n" + connectionColumns.help(),
		moreArgs: true,
		check:    connectionColumns.check,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Listing connections ...")
			list, err := c.ListConnections(ctx)
			if err != nil {
				return err
			}
			return connectionColumns.print(o, list, a)
		},
	}
	listConsumersCommand = command{
		usage: "list_consumers [-p VHOST] [--formatter table|json] [COLUMN ...]",
		brief: "lists the consumers of the proxies' clients in a vhost",
		summary: "Lists the consumers of a vhost's client connections, of this proxy and, in a sidecar\n" +
			"cluster, of every other live proxy (a proxy that does not answer is named in a warning).\n" +
			"COLUMN is one or more of:\n" + consumerColumns.help(),
		moreArgs: true,
		check:    consumerColumns.check,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Listing consumers in vhost %s ...", o.vhost)
			list, err := c.ListConsumers(ctx, o.vhost)
			if err != nil {
				return err
			}
			return consumerColumns.print(o, list, a)
		},
	}
)

// printClusterStatus prints the status in sections, as rabbitmqctl does:
// the basics, then the proxies and the backends as tab-separated tables.
func printClusterStatus(o *ctlOptions, st ClusterStatus) {
	yesNo := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	leader := st.Leader
	if leader == "" {
		leader = "none"
	}
	fmt.Fprintf(o.stdout, "Basics\n\nProxy: %s\nVersion: %s\nSidecar cluster: %s\nMirroring: %s\nMetadata leader: %s\nVoters: %s\nPaused: %s\n",
		st.Node, st.Version, yesNo(st.Sidecar), yesNo(st.Mirroring), leader, tableCell(nonNil(st.Voters)), yesNo(st.Paused))
	fmt.Fprintf(o.stdout, "\nProxies\n\nname\tstate\tvoter\tleader\tbackend\tamqp\tadmin\n")
	for _, n := range st.Nodes {
		fmt.Fprintf(o.stdout, "%s\t%s\t%t\t%t\t%s\t%s\t%s\n", n.Name, n.State, n.Voter, n.Leader, n.Backend, n.AMQP, n.Admin)
	}
	fmt.Fprintf(o.stdout, "\nBackends\n\nname\tstate\tdrained\thome\n")
	for _, b := range st.Backends {
		fmt.Fprintf(o.stdout, "%s\t%s\t%t\t%t\n", b.Name, b.State, b.Drained, b.Home)
	}
}
