package cluster

// Metrics is where the cluster registers its metrics; admin.Registry
// implements it. Every value is read when Prometheus scrapes: serf's
// member list and raft's state, both in memory.
type Metrics interface {
	Gauge(name, help string, value func() float64)
	GaugeFamily(name, help string, labels []string, collect func(emit func(value float64, labelValues ...string)))
}

// memberStatuses are the statuses amqp_mirror_cluster_members counts,
// each emitted at every scrape (0 included), so that a dashboard or an
// alert on failed members sees the series before the first failure.
var memberStatuses = [...]Status{StatusAlive, StatusLeaving, StatusLeft, StatusFailed}

// RegisterMetrics exposes the cluster's membership, as this proxy sees it,
// and its part in the metadata log.
func (c *Cluster) RegisterMetrics(m Metrics) {
	m.GaugeFamily("amqp_mirror_cluster_members",
		"Proxies of the sidecar cluster this proxy knows (itself included), by serf status: alive, leaving, left, failed.",
		[]string{"status"}, func(emit func(float64, ...string)) {
			var counts [len(memberStatuses)]int
			for _, member := range c.Members() {
				for i, status := range memberStatuses {
					if member.Status == status {
						counts[i]++
					}
				}
			}
			for i, status := range memberStatuses {
				emit(float64(counts[i]), status.String())
			}
		})
	m.Gauge("amqp_mirror_cluster_leader", "1 while this proxy leads the metadata log.",
		func() float64 { return boolValue(c.store.IsLeader()) })
	m.Gauge("amqp_mirror_cluster_has_leader", "1 while this proxy knows a leader of the metadata log (it is on a side with a majority).",
		func() float64 { return boolValue(c.Majority()) })
	m.Gauge("amqp_mirror_cluster_voters", "Voters of the metadata log in the latest configuration this proxy knows.",
		func() float64 {
			voters, err := c.store.Voters()
			if err != nil {
				return 0
			}
			return float64(len(voters))
		})
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
