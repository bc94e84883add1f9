// Package testutil holds what test binaries share: Eventually, which waits for a condition
// instead of sleeping, and Main, which runs a test package against RabbitMQ nodes started
// once for the whole package and stopped however the binary ends.
//
// It is kept apart from package localbroker so that the CLI, which also starts nodes through
// localbroker, links neither package testing nor a signal handler of ours.
package testutil

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
	"go.uber.org/goleak"
)

// Eventually calls f until it returns nil, and fails the test with f's last error if that
// has not happened within timeout. It waits between calls, growing from 10 ms to 250 ms,
// and never less than the last call took.
func Eventually(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := 10 * time.Millisecond
	for {
		began := time.Now()
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v: %v", timeout, err)
		}
		// Never check more often than the check's own length: one that runs rabbitmqctl
		// (an Erlang VM booted, most of a second of CPU) would otherwise keep a core
		// busy, starving the brokers and the other tests on a two-core machine.
		time.Sleep(max(wait, time.Since(began)))
		wait = min(wait*2, 250*time.Millisecond)
	}
}

// StartTimeout bounds starting the package's nodes.
const StartTimeout = 2 * time.Minute

// Main starts the nodes described by options, hands the cluster to use, runs the tests,
// closes the cluster and checks for leaked goroutines. Use it from TestMain:
//
//	func TestMain(m *testing.M) {
//		os.Exit(testutil.Main(m, localbroker.Options{Nodes: 3}, func(c *localbroker.Cluster) { cluster = c }))
//	}
//
// A node that cannot start (rabbitmq-server missing included) fails the package: nothing
// is skipped. The nodes are also stopped on SIGINT and SIGTERM (see CloseOnSignal); if the
// binary dies any other way (a panicking test, the -timeout alarm, kill -9) the nodes'
// wrappers notice and kill them.
func Main(m *testing.M, options localbroker.Options, use func(*localbroker.Cluster)) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if options.Logger == nil {
		level := slog.LevelWarn
		if testing.Verbose() {
			level = slog.LevelInfo
		}
		options.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}

	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	interrupted, stopSignals := ctx, func() {}
	if watched := terminationSignals(); len(watched) > 0 { // none would mean all
		interrupted, stopSignals = signal.NotifyContext(ctx, watched...)
	}
	cluster, err := localbroker.Start(interrupted, options)
	stopSignals()
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: starting RabbitMQ for the tests: %v\n", err)
		return 1
	}
	stopWatching := CloseOnSignal(cluster)

	code := func() int {
		defer func() {
			stopWatching()
			if err := cluster.Close(); err != nil {
				fmt.Fprintf(os.Stderr, "closing RabbitMQ nodes: %v\n", err)
			}
		}()
		use(cluster)
		return m.Run()
	}()

	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: goroutines leaked: %v\n", err)
			return 1
		}
	}
	return code
}

// CloseOnSignal closes the cluster when the process receives SIGINT or SIGTERM and then
// lets the signal take its default course, so the process still ends the way the sender
// meant. A signal the process started with ignored (SIGINT for a background job of a
// non-interactive shell) stays ignored. The returned function stops watching.
func CloseOnSignal(cluster *localbroker.Cluster) (stop func()) {
	signals := make(chan os.Signal, 1)
	if watched := terminationSignals(); len(watched) > 0 { // none would mean all
		signal.Notify(signals, watched...)
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case received := <-signals:
			fmt.Fprintf(os.Stderr, "%v: stopping RabbitMQ nodes\n", received)
			cluster.Close()
			signal.Reset(received)
			syscall.Kill(os.Getpid(), received.(syscall.Signal))
			// The default action ends the process; this goroutine blocks until it does.
			select {}
		case <-done:
		}
	}()
	return func() {
		signal.Stop(signals)
		close(done)
		<-finished
	}
}

// terminationSignals are SIGINT and SIGTERM, less any the process inherited as ignored:
// watching one would turn it back on, and re-raising it after cleanup would do nothing.
func terminationSignals() []os.Signal {
	var watched []os.Signal
	for _, candidate := range []os.Signal{syscall.SIGINT, syscall.SIGTERM} {
		if !signal.Ignored(candidate) {
			watched = append(watched, candidate)
		}
	}
	return watched
}
