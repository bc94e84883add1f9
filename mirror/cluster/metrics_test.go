package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// scrapedMetrics is a Metrics that reads every series when asked, as a
// scrape does: name or name{label="value"} → value.
type scrapedMetrics struct {
	gauges   map[string]func() float64
	families map[string]func(emit func(float64, ...string))
	labels   map[string][]string
}

func (s *scrapedMetrics) Gauge(name, _ string, value func() float64) { s.gauges[name] = value }

func (s *scrapedMetrics) GaugeFamily(name, _ string, labels []string, collect func(emit func(float64, ...string))) {
	s.families[name], s.labels[name] = collect, labels
}

func (s *scrapedMetrics) scrape() map[string]float64 {
	out := map[string]float64{}
	for name, value := range s.gauges {
		out[name] = value()
	}
	for name, collect := range s.families {
		collect(func(v float64, values ...string) {
			out[fmt.Sprintf("%s{%s=%q}", name, s.labels[name][0], values[0])] = v
		})
	}
	return out
}

// Three proxies: one leads, each counts three voters and three members
// alive; once one shuts down, the others count it failed.
func TestClusterMetrics(t *testing.T) {
	nodes := startCluster(t, 3)
	scrapes := make([]*scrapedMetrics, len(nodes))
	for i, n := range nodes {
		scrapes[i] = &scrapedMetrics{gauges: map[string]func() float64{}, families: map[string]func(emit func(float64, ...string)){}, labels: map[string][]string{}}
		n.RegisterMetrics(scrapes[i])
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		leaders := 0.0
		for i, s := range scrapes {
			got := s.scrape()
			leaders += got["amqp_mirror_cluster_leader"]
			for series, want := range map[string]float64{
				"amqp_mirror_cluster_voters":                   3,
				"amqp_mirror_cluster_has_leader":               1,
				`amqp_mirror_cluster_members{status="alive"}`:  3,
				`amqp_mirror_cluster_members{status="failed"}`: 0,
			} {
				if got[series] != want {
					return fmt.Errorf("%s: %s = %v, want %v", nodes[i].cfg.NodeName, series, got[series], want)
				}
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%v proxies say they lead, want 1", leaders)
		}
		return nil
	})

	nodes[2].Shutdown()
	testutil.Eventually(t, 20*time.Second, func() error {
		for i, s := range scrapes[:2] {
			got := s.scrape()
			if got[`amqp_mirror_cluster_members{status="alive"}`] != 2 || got[`amqp_mirror_cluster_members{status="failed"}`] != 1 {
				return fmt.Errorf("%s: members %v alive, %v failed, want 2 and 1", nodes[i].cfg.NodeName,
					got[`amqp_mirror_cluster_members{status="alive"}`], got[`amqp_mirror_cluster_members{status="failed"}`])
			}
		}
		return nil
	})
}
