// Package integration runs amqp-mirror's integration tests against real RabbitMQ nodes
// started by package localbroker, once for the whole package.
package integration

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// cluster is the package's three nodes, set once by TestMain before any test runs.
// Tests that kill or restart a node say which one, so that parallel tests use others.
var cluster *localbroker.Cluster

// helperVariable, when set, turns the test binary into the helper process of
// TestNodesDieWithTheHarnessProcess; its value is the helper's base directory.
const helperVariable = "AMQP_MIRROR_HARNESS_HELPER_DIR"

func TestMain(m *testing.M) {
	if directory := os.Getenv(helperVariable); directory != "" {
		os.Exit(runHelper(directory))
	}
	if err := selectPart(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		os.Exit(2)
	}
	code := testutil.Main(m, localbroker.Options{Nodes: 3}, func(c *localbroker.Cluster) { cluster = c })
	removeCLIBuild()
	os.Exit(code)
}

// selectPart narrows the run to the part of the tests partVariable names, if set (see
// integrationParts), by setting -test.run before the tests start. A -run of the caller's
// own as well would be silently replaced, so that is refused.
func selectPart() error {
	part := os.Getenv(partVariable)
	if part == "" {
		return nil
	}
	pattern, err := partPattern(part)
	if err != nil {
		return err
	}
	flag.Parse()
	if run := flag.Lookup("test.run").Value.String(); run != "" {
		return fmt.Errorf("-run %q and %s=%s both select tests; use one", run, partVariable, part)
	}
	return flag.Set("test.run", pattern)
}

// runHelper starts one node, prints its Erlang name, and waits for stdin to close, so that
// the test can end it by signal or by kill -9 and look for what is left behind.
func runHelper(directory string) int {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.StartTimeout)
	defer cancel()
	helperCluster, err := localbroker.Start(ctx, localbroker.Options{Names: []string{"helper"}, BaseDir: directory})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop := testutil.CloseOnSignal(helperCluster)
	fmt.Println(helperCluster.Nodes()[0].ErlangName)
	bufio.NewReader(os.Stdin).ReadString('\n')
	stop()
	helperCluster.Close()
	return 0
}

// node returns the shared cluster's node with the logical name.
func node(t testing.TB, name string) *localbroker.Node {
	t.Helper()
	n := cluster.Node(name)
	if n == nil {
		t.Fatalf("no node %q in the test cluster", name)
	}
	return n
}

// testContext is a context that ends with the test, bounded by timeout.
func testContext(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}
