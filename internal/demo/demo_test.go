package demo

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheckAddressesNamesTheFlagToChange(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	tests := []struct {
		name    string
		address string
		wantErr string // "" for none
	}{
		{name: "a free port", address: freeAddr},
		{name: "a port in use", address: busy.Addr().String(), wantErr: "is not available; choose another with --listen"},
		{name: "port 0", address: "127.0.0.1:0", wantErr: "has no port from 1 to 65535; set one with --listen"},
		{name: "no port", address: "127.0.0.1", wantErr: "has no port from 1 to 65535"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			held, err := holdAddresses([]address{{"the proxy's AMQP address", tt.address, "--listen"}})
			if err == nil {
				held.release()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("holdAddresses(%s) = %v, want nil", tt.address, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("holdAddresses(%s) = %v, want an error with %q", tt.address, err, tt.wantErr)
			}
		})
	}
}

func TestSidecarAddressesFollowTheFlagsPorts(t *testing.T) {
	got, err := sidecarAddressesFor(3, "127.0.0.1:5672", "127.0.0.1:15680")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, p := range got {
		wantAMQP := net.JoinHostPort("127.0.0.1", []string{"5672", "5673", "5674"}[i])
		wantAdmin := net.JoinHostPort("127.0.0.1", []string{"15680", "15681", "15682"}[i])
		if p.AMQP != wantAMQP || p.Admin != wantAdmin {
			t.Errorf("proxy %d: amqp %s admin %s, want %s and %s", i+1, p.AMQP, p.Admin, wantAMQP, wantAdmin)
		}
		for _, a := range []string{p.Gossip, p.Raft} {
			if seen[a] {
				t.Errorf("proxy %d: cluster port %s given twice", i+1, a)
			}
			seen[a] = true
		}
	}
	if _, err := sidecarAddressesFor(3, "127.0.0.1:65534", "127.0.0.1:15680"); err == nil || !strings.Contains(err.Error(), "--listen") {
		t.Errorf("ports past 65535: err = %v, want one naming --listen", err)
	}
}

// The supervisor stops a proxy that runs, and reports one that exits
// before it listens, with its log.
func TestProxyProcessStopsAndReportsAnEarlyExit(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	running, err := startProxy("rabbit1", filepath.Join(dir, "running.log"), "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		running.stop(logger)
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("stop did not end a running process within 10s")
	}

	logPath := filepath.Join(dir, "exits.log")
	exits, err := startProxy("rabbit2", logPath, "sh", "-c", "exit 3")
	if err != nil {
		t.Fatal(err)
	}
	defer exits.stop(logger)
	err = exits.awaitListening(context.Background(), closedAddress(t), 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "the proxy beside rabbit2 exited") || !strings.Contains(err.Error(), logPath) {
		t.Errorf("awaitListening on a process that exited = %v, want it to say so with its log", err)
	}
}

// closedAddress is a loopback address nothing listens on.
func closedAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestHeldAddressesStayTakenUntilReleased: while the brokers start, nothing else may be
// given the proxies' ports, and the proxies can bind them once released.
func TestHeldAddressesStayTakenUntilReleased(t *testing.T) {
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	held, err := holdAddresses([]address{{"the proxy's AMQP address", addr, "--listen"}})
	if err != nil {
		t.Fatalf("holdAddresses(%s): %v", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("%s could be listened on while held", addr)
	}
	held.release()
	held.release()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("%s after release: %v", addr, err)
	}
	ln.Close()
}
