package proxy

// Metrics is where the server registers its counters; admin.Registry
// implements it. Values are read at scrape time from the server's atomics.
type Metrics interface {
	Gauge(name, help string, value func() float64)
	Counter(name, help string, value func() float64)
}

// RegisterMetrics exposes the server's counters.
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
}
