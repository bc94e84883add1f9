package proxy

import (
	"crypto/tls"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// Read-only views of the proxy's clients, for ctl list_connections and
// list_consumers. Each is a copy taken through the types' own methods and
// locks, one at a time and never across I/O: a listing holds the data
// path of a connection or a channel no longer than it takes to copy a few
// fields.

// Connections returns the client connections that finished their
// handshake, oldest first.
func (s *Server) Connections() []mirror.Connection {
	var out []mirror.Connection
	for _, c := range s.connections() {
		if v, ok := c.view(); ok {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b mirror.Connection) int { return a.ConnectedAt.Compare(b.ConnectedAt) })
	return out
}

// Consumers returns the consumers of the client connections of vhost (""
// for every vhost), by connection (oldest first), channel and tag.
func (s *Server) Consumers(vhost string) []mirror.Consumer {
	var out []mirror.Consumer
	for _, c := range s.connections() {
		v, ok := c.view()
		if !ok || vhost != "" && v.VHost != vhost {
			continue
		}
		first := len(out)
		c.channels.each(func(ch *channelState) {
			out = ch.appendConsumers(out, func(link int) string { return c.srv.backends[link].Name })
		})
		for i := first; i < len(out); i++ {
			out[i].Node, out[i].VHost, out[i].Connection = v.Node, v.VHost, v.Name
		}
		slices.SortFunc(out[first:], func(a, b mirror.Consumer) int {
			if a.Channel != b.Channel {
				return int(a.Channel) - int(b.Channel)
			}
			return strings.Compare(a.Tag, b.Tag)
		})
	}
	return out
}

// connections returns the server's client connections, in no order.
func (s *Server) connections() []*clientConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	conns := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// view returns the connection as list_connections shows it, and false
// while its handshake runs or once it is torn down. The fields the
// handshake settled (the terms, channels) are read after opened is seen
// under mu, which open sets with them.
func (c *clientConn) view() (mirror.Connection, bool) {
	c.mu.Lock()
	if c.opened.IsZero() || c.closer.tornDown() {
		c.mu.Unlock()
		return mirror.Connection{}, false
	}
	opened := c.opened
	backends := c.links.liveNames()
	c.mu.Unlock()
	conn := c.client.Conn()
	peerHost, peerPort := hostPort(conn.RemoteAddr())
	host, port := hostPort(conn.LocalAddr())
	_, ssl := conn.(*tls.Conn)
	state := "running"
	if c.closer.inProgress() != closeNone {
		state = "closing"
	}
	channels := 0
	c.channels.each(func(*channelState) { channels++ })
	return mirror.Connection{
		Node:        c.srv.opts.ClientNode,
		Name:        conn.RemoteAddr().String() + " -> " + conn.LocalAddr().String(),
		User:        c.terms.user,
		VHost:       c.terms.vhost,
		PeerHost:    peerHost,
		PeerPort:    peerPort,
		Host:        host,
		Port:        port,
		State:       state,
		Channels:    channels,
		SSL:         ssl,
		Protocol:    "AMQP 0-9-1",
		ConnectedAt: opened,
		FrameMax:    c.terms.frameMax,
		ChannelMax:  c.terms.channelMax,
		Timeout:     int(c.terms.clientHeartbeat / time.Second),
		Backend:     c.links.home().name,
		Backends:    backends,
	}, true
}

// hostPort splits a TCP address; a port that is not a number is 0.
func hostPort(addr net.Addr) (string, int) {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String(), 0
	}
	n, _ := strconv.Atoi(port)
	return host, n
}

// appendConsumers appends the channel's consumers to out, the orphans
// (waiting for a new master) inactive; backend names a link's backend.
// The connection's fields are the caller's to fill.
func (ch *channelState) appendConsumers(out []mirror.Consumer, backend func(link int) string) []mirror.Consumer {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.consumers.appendTo(out, ch.id, backend)
}

// tableValues turns a field table into JSON's terms: nested tables become
// objects, byte arrays strings, decimals numbers. Where a key repeats, the
// first wins, as Table.Get reads it.
func tableValues(t frames.Table) map[string]any {
	out := make(map[string]any, len(t))
	for _, f := range t {
		if _, seen := out[f.Key]; !seen {
			out[f.Key] = fieldValue(f.Value)
		}
	}
	return out
}

func fieldValue(v any) any {
	switch v := v.(type) {
	case frames.Table:
		return tableValues(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = fieldValue(e)
		}
		return out
	case []byte:
		return string(v)
	case frames.Decimal:
		f := float64(v.Value)
		for range v.Scale {
			f /= 10
		}
		return f
	case frames.Timestamp:
		return uint64(v)
	}
	return v
}
