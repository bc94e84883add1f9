package localbroker

import (
	"context"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestWaitStopped(t *testing.T) {
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sleeper.Process.Kill()
		sleeper.Wait()
	})
	pid := sleeper.Process.Pid

	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := WaitStopped(short, pid); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitStopped on a running process: %v; want the context's deadline", err)
	}

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancelStopped := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelStopped()
	if err := WaitStopped(ctx, pid); err != nil {
		t.Fatalf("WaitStopped after SIGSTOP: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}
