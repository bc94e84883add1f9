package proxy

import "github.com/amqp-mirror/amqp-mirror/mirror"

// Unacked returns, per recorded queue of vhost ("" for every vhost), how
// many messages this proxy's clients hold unacknowledged: RabbitMQ counts
// them in a queue's messages beside the ready ones, which are all that
// queue.declare-ok tells (ctl list_queues adds the two). Deliveries of a
// queue the proxy does not record (no mirroring) are not counted.
func (s *Server) Unacked(vhost string) map[mirror.QueueID]int {
	s.mu.Lock()
	conns := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	counts := make(map[mirror.QueueID]int)
	for _, c := range conns {
		// Its channels exist once the handshake is done (opened is set
		// under c.mu after them).
		if c.isOpen() {
			c.countUnacked(vhost, counts)
		}
	}
	return counts
}

// countUnacked adds the connection's unacknowledged deliveries to counts.
func (c *clientConn) countUnacked(vhost string, counts map[mirror.QueueID]int) {
	gens := c.links.generations() // 0: no open link
	live := func(backend int, gen uint64) bool {
		return backend < len(gens) && gens[backend] == gen && gen != 0
	}
	c.channels.each(func(ch *channelState) {
		ch.countUnacked(vhost, live, counts)
	})
}
