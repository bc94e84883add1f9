package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// memory is a process's resident set as /proc/PID/status reports it.
type memory struct {
	RSS  int64 // VmRSS, bytes
	Peak int64 // VmHWM, the kernel's own high-water mark of VmRSS, bytes
}

func readMemory(pid int) (memory, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	lines := bufio.NewScanner(bytes.NewReader(data))
	for lines.Scan() {
		key, value, ok := strings.Cut(lines.Text(), ":")
		if !ok || key != "VmRSS" && key != "VmHWM" {
			continue
		}
		kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("/proc/%d/status %s: %w", pid, key, err)
		}
		if key == "VmRSS" {
			m.RSS = kib << 10
		} else {
			m.Peak = kib << 10
		}
	}
	if m.RSS == 0 {
		return memory{}, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
	}
	return m, nil
}

// cpuTime is the user plus system CPU time pid has used.
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, may hold spaces; the fields after it are fixed.
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(data[end+1:]))
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// ioCalls are the read and write system calls a process made, from /proc/PID/io
// (syscr and syscw: read, readv, recvfrom... and write, writev, sendto...).
type ioCalls struct{ reads, writes int64 }

func readIOCalls(pid int) (ioCalls, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return ioCalls{}, err
	}
	var c ioCalls
	lines := bufio.NewScanner(bytes.NewReader(data))
	for lines.Scan() {
		key, value, _ := strings.Cut(lines.Text(), ":")
		n, _ := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		switch key {
		case "syscr":
			c.reads = n
		case "syscw":
			c.writes = n
		}
	}
	return c, nil
}

// machineBusy is the CPU time every CPU of the machine spent neither idle nor waiting
// for I/O, from the first line of /proc/stat.
func machineBusy() (time.Duration, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy int64
	for i, f := range fields[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		// user nice system idle iowait irq softirq steal guest guest_nice; guest time
		// is already counted in user.
		if i != 3 && i != 4 && i < 8 {
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / clockTicks, nil
}

// watched are the processes whose CPU use a run reports; 0 means not known or none.
type watched struct {
	// brokers are the broker VMs of the run: one node, or every node of a cluster.
	brokers []int
	proxy   int
}

// cpuSnapshot is the CPU time used so far by each watched process and by the bench.
type cpuSnapshot struct {
	at                          time.Time
	broker, proxy, own, machine time.Duration
	// each is each watched broker's CPU time, in the order of watched.brokers.
	each       []time.Duration
	proxyCalls ioCalls
}

func (w watched) snapshot() cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), each: make([]time.Duration, len(w.brokers))}
	for i, pid := range w.brokers {
		if pid != 0 {
			cpu, _ := cpuTime(pid)
			s.broker += cpu
			s.each[i] = cpu
		}
	}
	if w.proxy != 0 {
		for _, pid := range processTree(w.proxy) {
			cpu, _ := cpuTime(pid)
			calls, _ := readIOCalls(pid)
			s.proxy += cpu
			s.proxyCalls.reads += calls.reads
			s.proxyCalls.writes += calls.writes
		}
	}
	s.own, _ = cpuTime(os.Getpid())
	s.machine, _ = machineBusy()
	return s
}

// cpuUse is the CPU each process used between two snapshots, in cores (1.0 = one core
// busy the whole time).
type cpuUse struct {
	Broker float64 `json:"broker_cores"`
	Proxy  float64 `json:"proxy_cores"`
	Load   float64 `json:"load_generator_cores"`
	// Other is what the rest of the machine used: other tenants' work competes for the
	// same cores and makes a run unrepresentative.
	Other float64 `json:"other_cores"`
}

func (w watched) between(from, to cpuSnapshot) cpuUse {
	wall := to.at.Sub(from.at).Seconds()
	if wall <= 0 {
		return cpuUse{}
	}
	use := cpuUse{Load: (to.own - from.own).Seconds() / wall}
	if len(w.brokers) > 0 {
		use.Broker = (to.broker - from.broker).Seconds() / wall
	}
	if w.proxy != 0 {
		use.Proxy = (to.proxy - from.proxy).Seconds() / wall
	}
	if to.machine > 0 {
		use.Other = max(0, (to.machine-from.machine).Seconds()/wall-use.Broker-use.Proxy-use.Load)
	}
	return use
}

// eachBroker is the CPU time each watched broker used between two snapshots, in the
// order of watched.brokers.
func eachBroker(from, to cpuSnapshot) []time.Duration {
	used := make([]time.Duration, min(len(from.each), len(to.each)))
	for i := range used {
		used[i] = to.each[i] - from.each[i]
	}
	return used
}

// processTree is pid and its live descendants: socat serves each connection in a child.
func processTree(pid int) []int {
	tree := []int{pid}
	for i := 0; i < len(tree); i++ {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", tree[i]))
		for _, task := range tasks {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", tree[i], task.Name()))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(data)) {
				if child, err := strconv.Atoi(f); err == nil {
					tree = append(tree, child)
				}
			}
		}
	}
	return tree
}
