package proxy

// Metrics is where the server registers its metrics; admin.Registry
// implements it. Counters and gauges are read at scrape time from the
// server's atomics; the confirm latency is a histogram the data path
// observes into, which takes no lock.
type Metrics interface {
	Gauge(name, help string, value func() float64)
	Counter(name, help string, value func() float64)
	Histogram(name, help string, buckets []float64) (observe func(float64))
}

// ConfirmBuckets are the upper bounds, in seconds, of the publish-to-
// confirm histogram: from a broker on the same host (under a millisecond)
// to a publish held through a failover (failover_grace, then the
// promotion: seconds).
var ConfirmBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// RegisterMetrics exposes the server's counters, and times every publish
// on a channel in confirm mode from its arrival to its ack. Channels that
// select confirms after the call are timed.
func (s *Server) RegisterMetrics(m Metrics) {
	m.Gauge("amqp_mirror_client_connections", "Client connections open now.",
		func() float64 { return float64(s.stats.ConnectionsOpen.Load()) })
	m.Counter("amqp_mirror_client_connections_opened_total", "Client connections accepted.",
		func() float64 { return float64(s.stats.ConnectionsOpened.Load()) })
	for reason := range s.stats.ClosedByReason {
		counter := &s.stats.ClosedByReason[reason]
		m.Counter(`amqp_mirror_client_connections_closed_total{reason="`+CloseReason(reason).String()+`"}`,
			"Client connections ended, by reason.",
			func() float64 { return float64(counter.Load()) })
	}
	m.Counter("amqp_mirror_publishes_total", "Messages the clients published (basic.publish).",
		func() float64 { return float64(s.stats.Publishes.Load()) })
	m.Counter("amqp_mirror_deliveries_total", "Messages delivered to the clients (basic.deliver and basic.get-ok).",
		func() float64 { return float64(s.stats.Deliveries.Load()) })
	m.Counter("amqp_mirror_acks_total", "Deliveries the clients acknowledged (basic.ack, each message of a multiple ack).",
		func() float64 { return float64(s.stats.Acks.Load()) })
	m.Counter("amqp_mirror_returns_total", "Messages returned to the clients as unroutable (basic.return).",
		func() float64 { return float64(s.stats.Returns.Load()) })
	m.Gauge("amqp_mirror_confirms_pending", "Publishes on the clients' channels in confirm mode that wait for their ack or nack.",
		func() float64 { return float64(s.confirmsPending()) })
	m.Gauge("amqp_mirror_paused", "1 while the proxy is paused (pause_minority: it sees a minority of its sidecar cluster) and refuses clients.",
		func() float64 {
			if s.Paused() {
				return 1
			}
			return 0
		})
	observe := m.Histogram("amqp_mirror_publish_confirm_seconds",
		"Time from a client's basic.publish reaching the proxy to the proxy's basic.ack for it, on channels in confirm mode: the master and every synchronised slave confirmed.",
		ConfirmBuckets)
	s.confirmLatency.Store(&observe)
}

// confirmsPending counts the publishes the clients' channels in confirm
// mode wait for.
func (s *Server) confirmsPending() int {
	s.mu.Lock()
	conns := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	pending := 0
	for _, c := range conns {
		// Its channels exist once the handshake is done.
		if !c.isOpen() {
			continue
		}
		c.channels.each(func(ch *channelState) {
			if ch.confirming.Load() {
				pending += ch.confirms.unconfirmedCount()
			}
		})
	}
	return pending
}
