package localbroker

import (
	"context"
	"fmt"
)

// JoinRabbitMQCluster makes the nodes one RabbitMQ cluster (Erlang
// clustering: every node joins the first), which amqp-mirror's backends
// never are. It exists for comparison: the benchmark measures RabbitMQ's own
// classic mirroring and quorum queues on such a cluster, on the same
// machine, beside amqp-mirror in front of independent nodes. The nodes share
// the Erlang cookie of $HOME (see ensureErlangCookie) and run with short
// names on loopback, which is all clustering needs. Joining wipes a node's
// own data, as rabbitmqctl join_cluster does.
func (c *Cluster) JoinRabbitMQCluster(ctx context.Context) error {
	if len(c.nodes) < 2 {
		return nil
	}
	first := c.nodes[0].ErlangName
	for _, n := range c.nodes[1:] {
		for _, step := range [][]string{{"stop_app"}, {"reset"}, {"join_cluster", first}, {"start_app"}} {
			if _, err := n.Ctl(ctx, step...); err != nil {
				return fmt.Errorf("joining %s to %s: %w", n.Name, c.nodes[0].Name, err)
			}
		}
	}
	for _, n := range c.nodes {
		if _, err := n.Ctl(ctx, "await_startup"); err != nil {
			return fmt.Errorf("%s after clustering: %w", n.Name, err)
		}
	}
	return nil
}
