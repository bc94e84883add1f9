package cluster

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
)

// testNetwork is one node's view of a network a test can partition: the
// node cannot reach the addresses cut from it. Every node of a partition
// test gets one and both sides are cut, so blocking what a node sends is
// enough: gossip packets are dropped as lost datagrams, gossip and raft
// dials fail, and the raft connections already open across the cut are
// closed (raft's replies travel on the connection of the request).
type testNetwork struct {
	mu      sync.Mutex
	blocked map[string]bool
	conns   map[*trackedConn]string // open raft connections by destination
}

func newTestNetwork() *testNetwork {
	return &testNetwork{blocked: make(map[string]bool), conns: make(map[*trackedConn]string)}
}

// cut makes addrs unreachable from this node.
func (n *testNetwork) cut(addrs ...string) {
	n.mu.Lock()
	var doomed []*trackedConn
	for _, a := range addrs {
		n.blocked[a] = true
	}
	for c, dest := range n.conns {
		if n.blocked[dest] {
			doomed = append(doomed, c)
		}
	}
	n.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

// heal makes every address reachable again.
func (n *testNetwork) heal() {
	n.mu.Lock()
	clear(n.blocked)
	n.mu.Unlock()
}

func (n *testNetwork) reachable(addr string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.blocked[addr]
}

func (n *testNetwork) gossip(t memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
	return &partitionedGossip{NodeAwareTransport: t, net: n}
}

func (n *testNetwork) raft(l raft.StreamLayer) raft.StreamLayer {
	return &partitionedRaft{StreamLayer: l, net: n}
}

type partitionedGossip struct {
	memberlist.NodeAwareTransport
	net *testNetwork
}

func (g *partitionedGossip) WriteTo(b []byte, addr string) (time.Time, error) {
	if !g.net.reachable(addr) {
		return time.Now(), nil
	}
	return g.NodeAwareTransport.WriteTo(b, addr)
}

func (g *partitionedGossip) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if !g.net.reachable(a.Addr) {
		return time.Now(), nil
	}
	return g.NodeAwareTransport.WriteToAddress(b, a)
}

func (g *partitionedGossip) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if !g.net.reachable(addr) {
		return nil, fmt.Errorf("dial %s: partitioned", addr)
	}
	return g.NodeAwareTransport.DialTimeout(addr, timeout)
}

func (g *partitionedGossip) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if !g.net.reachable(a.Addr) {
		return nil, fmt.Errorf("dial %s: partitioned", a.Addr)
	}
	return g.NodeAwareTransport.DialAddressTimeout(a, timeout)
}

type partitionedRaft struct {
	raft.StreamLayer
	net *testNetwork
}

func (r *partitionedRaft) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	dest := string(address)
	if !r.net.reachable(dest) {
		return nil, fmt.Errorf("dial %s: partitioned", dest)
	}
	conn, err := r.StreamLayer.Dial(address, timeout)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: conn, net: r.net}
	r.net.mu.Lock()
	r.net.conns[tc] = dest
	r.net.mu.Unlock()
	return tc, nil
}

type trackedConn struct {
	net.Conn
	net *testNetwork
}

func (c *trackedConn) Close() error {
	c.net.mu.Lock()
	delete(c.net.conns, c)
	c.net.mu.Unlock()
	return c.Conn.Close()
}
