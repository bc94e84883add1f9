package localbroker

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcessesOf lists the pids of live processes belonging to the node with the given Erlang
// name: those whose command line mentions it (the wrapper) or whose environment sets
// RABBITMQ_NODENAME to it (rabbitmq-server, beam.smp, erl_child_setup, inet_gethost...).
// Zombies are not counted: they hold no resources, and where PID 1 does not reap orphans
// (some containers and micro-VMs) the node's killed children stay zombies for good.
// Processes whose environment cannot be read (other users', when not root) are skipped.
func ProcessesOf(erlangName string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	nameArgument := []byte(erlangName)
	nameVariable := []byte("RABBITMQ_NODENAME=" + erlangName + "\x00")
	var pids []int
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		status, ok := readStat(pid)
		if !ok || status.state == 'Z' || status.state == 'X' {
			continue
		}
		commandLine, _ := os.ReadFile("/proc/" + entry.Name() + "/cmdline")
		environment, _ := os.ReadFile("/proc/" + entry.Name() + "/environ")
		if bytes.Contains(commandLine, nameArgument) || bytes.Contains(environment, nameVariable) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// processStatus holds the fields of /proc/<pid>/stat that this package uses.
type processStatus struct {
	command      string
	state        byte
	processGroup int
}

func readStat(pid int) (processStatus, bool) {
	return readStatFile("/proc/" + strconv.Itoa(pid) + "/stat")
}

func readStatFile(path string) (processStatus, bool) {
	content, err := os.ReadFile(path)
	if err != nil {
		return processStatus{}, false
	}
	// pid (comm) state ppid pgrp ...; comm may itself contain spaces and parentheses.
	open, closing := bytes.IndexByte(content, '('), bytes.LastIndexByte(content, ')')
	if open < 0 || closing < open {
		return processStatus{}, false
	}
	fields := strings.Fields(string(content[closing+1:]))
	if len(fields) < 3 || len(fields[0]) != 1 {
		return processStatus{}, false
	}
	group, err := strconv.Atoi(fields[2])
	if err != nil {
		return processStatus{}, false
	}
	return processStatus{command: string(content[open+1 : closing]), state: fields[0][0], processGroup: group}, true
}

// findBeam returns the pid of the Erlang VM in the process group, or 0.
func findBeam(processGroup int) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		if status, ok := readStat(pid); ok && status.processGroup == processGroup && status.command == "beam.smp" && status.state != 'Z' {
			return pid
		}
	}
	return 0
}

// WaitStopped waits until every thread of the process is stopped. kill(2)
// returns once SIGSTOP is queued, and one thread starts the group stop when
// it next runs: on a busy machine the process's other threads can go on
// working (reading a socket, answering a request) for milliseconds after
// the signal was sent.
func WaitStopped(ctx context.Context, pid int) error {
	taskDir := "/proc/" + strconv.Itoa(pid) + "/task"
	for {
		tasks, err := os.ReadDir(taskDir)
		if err != nil {
			return fmt.Errorf("wait for pid %d to stop: %w", pid, err)
		}
		running := 0
		for _, task := range tasks {
			status, ok := readStatFile(taskDir + "/" + task.Name() + "/stat")
			if ok && status.state != 'T' && status.state != 't' && status.state != 'Z' && status.state != 'X' {
				running++
			}
		}
		if running == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pid %d: %d of %d threads still running: %w", pid, running, len(tasks), ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}
