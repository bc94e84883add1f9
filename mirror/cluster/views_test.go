package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// TestViewsAskEveryOtherProxy: Connections, Consumers and Failovers gather
// the rows every other proxy lists, a vhost reaching the consumers'
// handler; a proxy that cannot answer makes an error naming it, with the
// others' rows still returned.
func TestViewsAskEveryOtherProxy(t *testing.T) {
	nodes := startCluster(t, 3)
	for i := 1; i < 3; i++ {
		node := fmt.Sprintf("rabbit%d", i+1)
		nodes[i].Peers().HandleConnections(func() []mirror.Connection {
			return []mirror.Connection{{Node: node, Name: "client of " + node}}
		})
		nodes[i].Peers().HandleConsumers(func(vhost string) []mirror.Consumer {
			return []mirror.Consumer{{Node: node, VHost: vhost, Tag: "ctag"}}
		})
		nodes[i].Peers().HandleFailovers(func() []mirror.Failover {
			return []mirror.Failover{{Node: node, Duration: time.Duration(i) * time.Second}}
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	testutil.Eventually(t, 10*time.Second, func() error {
		got, err := nodes[0].Peers().Connections(ctx)
		if err != nil {
			return err
		}
		slices.SortFunc(got, func(a, b mirror.Connection) int { return strings.Compare(a.Node, b.Node) })
		if len(got) != 2 || got[0].Name != "client of rabbit2" || got[1].Name != "client of rabbit3" {
			return fmt.Errorf("Connections: got %+v, want one of rabbit2's and one of rabbit3's", got)
		}
		return nil
	})
	consumers, err := nodes[0].Peers().Consumers(ctx, "prod")
	if err != nil || len(consumers) != 2 || consumers[0].VHost != "prod" || consumers[1].VHost != "prod" {
		t.Errorf("Consumers: got %+v, %v; want two in vhost prod", consumers, err)
	}
	failovers, err := nodes[0].Peers().Failovers(ctx)
	if err != nil || len(failovers) != 2 {
		t.Errorf("Failovers: got %+v, %v; want two", failovers, err)
	}

	nodes[2].peers.calls.Delete(connectionsCall)
	got, err := nodes[0].Peers().Connections(ctx)
	if err == nil || !strings.Contains(err.Error(), "rabbit3") {
		t.Errorf("Connections with rabbit3 not answering: got error %v, want one naming rabbit3", err)
	}
	if len(got) != 1 || got[0].Node != "rabbit2" {
		t.Errorf("Connections with rabbit3 not answering: got %+v, want rabbit2's", got)
	}
}
