package localbroker

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/internal/leaktest"
)

// TestRestartWhenTheDistributionPortIsTaken: a node whose distribution port another
// process took while it was down starts again on its AMQP port with another
// distribution port, and rabbitmqctl still reaches it.
func TestRestartWhenTheDistributionPortIsTaken(t *testing.T) {
	defer leaktest.VerifyNone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Names: []string{"restart1"}})
	if err != nil {
		t.Fatalf("starting the node: %v", err)
	}
	defer c.Close()
	node := c.Nodes()[0]
	port, distPort := node.Port, node.DistPort
	if err := node.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", distPort))
	if err != nil {
		t.Fatalf("taking the distribution port: %v", err)
	}
	defer taken.Close()
	if err := node.Restart(ctx); err != nil {
		t.Fatalf("restarting with the distribution port taken: %v", err)
	}
	if node.Port != port || node.DistPort == distPort {
		t.Errorf("ports after the restart: AMQP %d, distribution %d; want AMQP %d and a distribution port other than %d", node.Port, node.DistPort, port, distPort)
	}
	if _, err := node.Ctl(ctx, "status"); err != nil {
		t.Errorf("rabbitmqctl after the restart: %v", err)
	}
}
