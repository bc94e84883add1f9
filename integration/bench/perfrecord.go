package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// perfRecording is a `perf record` of one amqp-mirror server, or nothing (nil).
// amqp-mirror serve has no profiling endpoint of its own; perf reads a Go binary's
// symbols and frame pointers as they are, and sees the kernel's share (system calls,
// scheduling), which is much of a forwarder's cost.
type perfRecording struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startPerf starts recording the process tree of pid (the server's wrapper and the
// server) into pattern with the row and server number inserted; an empty pattern
// records nothing.
func startPerf(pattern, target string, server, pid int) (*perfRecording, error) {
	if pattern == "" {
		return nil, nil
	}
	ext := filepath.Ext(pattern)
	path := fmt.Sprintf("%s.%s.%d%s", strings.TrimSuffix(pattern, ext), target, server, ext)
	var pids []string
	for _, p := range processTree(pid) {
		pids = append(pids, strconv.Itoa(p))
	}
	cmd := exec.Command("perf", "record", "--quiet", "-F", "999", "-g", "-o", path, "-p", strings.Join(pids, ","))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf record (apt-get install linux-perf): %w", err)
	}
	r := &perfRecording{cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(r.done)
	}()
	progress("  recording amqp-mirror with perf into %s", path)
	return r, nil
}

// stop ends the recording: perf writes its file on SIGINT.
func (r *perfRecording) stop() {
	if r == nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
	}
}
