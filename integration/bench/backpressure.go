package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// rssSampleInterval is how often the proxy's resident set is read.
const rssSampleInterval = 100 * time.Millisecond

// drainTimeout bounds reading the whole queue after the stall.
const drainTimeout = 2 * time.Minute

// runBackpressure fills a transient queue directly at the broker, then consumes it
// through a fresh proxy process with a client that stops reading, and samples the proxy's
// resident set throughout. A proxy that respects TCP backpressure stops reading the
// broker once the client's socket is full, and its memory stays flat; one that queues
// between its sockets grows towards the queue's size.
func runBackpressure(ctx context.Context, cfg config, b broker) (backpressureResult, error) {
	result := backpressureResult{Messages: cfg.rssMessages, MessageBytes: cfg.rssSize}
	queue := "bench-rss-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := declareQueues(b.url, []string{queue}, false, nil); err != nil {
		return result, err
	}
	defer func() {
		if err := deleteQueues(b.url, []string{queue}); err != nil {
			progress("  could not delete queue %s: %v", queue, err)
		}
	}()

	progress("rss: queueing %d x %s directly at the broker", cfg.rssMessages, bytesString(int64(cfg.rssSize)))
	began := time.Now()
	if err := fillQueue(ctx, b.url, queue, cfg.rssMessages, cfg.rssSize); err != nil {
		return result, fmt.Errorf("fill %s: %w", queue, err)
	}
	result.FillSeconds = time.Since(began).Seconds()

	p, err := startProxy(ctx, cfg, b.addr, "")
	if err != nil {
		return result, err
	}
	defer func() {
		if err := p.stop(); err != nil {
			progress("  %v", err)
		}
	}()
	uri, err := amqp.ParseURI(proxyURL(b.url, p.addr))
	if err != nil {
		return result, err
	}
	client, err := dialRaw(p.addr, uri.Username, uri.Password, uri.Vhost)
	if err != nil {
		return result, err
	}
	defer client.close()

	base, err := readMemory(p.pid())
	if err != nil {
		return result, fmt.Errorf("proxy memory: %w", err)
	}
	result.BaselineRSS = base.RSS
	sampler := sampleRSS(p.pid())

	progress("rss: consuming through the proxy without reading for %v", cfg.rssStall)
	if err := client.consume(queue); err != nil {
		sampler.stop()
		return result, fmt.Errorf("basic.consume through the proxy: %w", err)
	}
	stallBegan := time.Now()
	if !sleepUntil(ctx, stallBegan.Add(cfg.rssStall)) {
		sampler.stop()
		return result, ctx.Err()
	}
	result.InFlight = queuesOf(client.conn, p.pid(), b.addr)
	drainBegan := time.Now()
	result.StallSeconds = drainBegan.Sub(stallBegan).Seconds()
	result.StallEndRSS = sampler.latest()

	progress("rss: draining")
	result.Delivered, err = client.drain(cfg.rssMessages, cfg.rssSize, time.Now().Add(drainTimeout))
	result.DrainSeconds = time.Since(drainBegan).Seconds()
	samples := sampler.stop()
	if m, err := readMemory(p.pid()); err == nil {
		// A drain shorter than the sampling interval would otherwise go unsampled.
		samples = append(samples, rssSample{at: time.Now(), rss: m.RSS})
		result.KernelPeakRSS = m.Peak
	}
	if err != nil {
		return result, fmt.Errorf("drain through the proxy: %w", err)
	}
	result.Samples = len(samples)
	for _, s := range samples {
		if s.at.Before(drainBegan) {
			result.StallPeakRSS = max(result.StallPeakRSS, s.rss)
		} else {
			result.DrainPeakRSS = max(result.DrainPeakRSS, s.rss)
		}
	}
	return result, nil
}

// fillQueue publishes messages transient messages of size bytes to queue, with
// confirms, a few outstanding at a time.
func fillQueue(ctx context.Context, brokerURL, queue string, messages, size int) error {
	const window = 8
	conn, err := dial(brokerURL, "bench rss fill", nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, messages+1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 1))
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i)
	}
	awaitOne := func() error {
		for {
			select {
			case c, ok := <-confirms:
				if !ok {
					return fmt.Errorf("channel closed while waiting for confirms")
				}
				if !c.Ack {
					return fmt.Errorf("broker nacked message %d", c.DeliveryTag)
				}
				return nil
			case b := <-blocked:
				if b.Active {
					return fmt.Errorf("the broker blocked publishing (%s): a memory or disk alarm; lower -rss-messages or -rss-size", b.Reason)
				}
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(30 * time.Second):
				return fmt.Errorf("no confirm for 30s")
			}
		}
	}
	outstanding := 0
	for range messages {
		if outstanding == window {
			if err := awaitOne(); err != nil {
				return err
			}
			outstanding--
		}
		err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{DeliveryMode: amqp.Transient, Body: body})
		if err != nil {
			return err
		}
		outstanding++
	}
	for ; outstanding > 0; outstanding-- {
		if err := awaitOne(); err != nil {
			return err
		}
	}
	return nil
}

type rssSample struct {
	at  time.Time
	rss int64
}

// rssSampler reads a process's VmRSS every rssSampleInterval until stopped.
type rssSampler struct {
	done    chan struct{}
	stopped chan struct{}
	mu      sync.Mutex
	samples []rssSample
}

func sampleRSS(pid int) *rssSampler {
	s := &rssSampler{done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(s.stopped)
		tick := time.NewTicker(rssSampleInterval)
		defer tick.Stop()
		for {
			if m, err := readMemory(pid); err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, rssSample{at: time.Now(), rss: m.RSS})
				s.mu.Unlock()
			}
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) latest() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) == 0 {
		return 0
	}
	return s.samples[len(s.samples)-1].rss
}

// stop ends sampling and returns the samples.
func (s *rssSampler) stop() []rssSample {
	close(s.done)
	<-s.stopped
	return s.samples
}

// socketQueues are bytes waiting in kernel socket queues between broker and client.
type socketQueues struct {
	ClientReceive int64 `json:"client_receive_bytes"`
	ProxySend     int64 `json:"proxy_send_bytes"`
	ProxyReceive  int64 `json:"proxy_receive_bytes"`
	BrokerSend    int64 `json:"broker_send_bytes"`
}

// tcpSocket is one line of /proc/net/tcp{,6}.
type tcpSocket struct {
	localPort, remotePort int
	send, receive         int64
	inode                 string
}

// queuesOf finds the four sockets on the path broker → proxy → client and reads their
// queues. The proxy's backend socket is the one of its sockets connected to the broker's
// port; sockets it cannot identify count as 0.
func queuesOf(client net.Conn, proxyPID int, brokerAddr string) socketQueues {
	var q socketQueues
	sockets, err := readTCPSockets()
	if err != nil {
		return q
	}
	clientPort := client.LocalAddr().(*net.TCPAddr).Port
	proxyPort := client.RemoteAddr().(*net.TCPAddr).Port
	_, port, _ := net.SplitHostPort(brokerAddr)
	brokerPort, _ := strconv.Atoi(port)
	owned := socketInodes(proxyPID)
	backendPort := 0
	for _, s := range sockets {
		switch {
		case s.localPort == clientPort && s.remotePort == proxyPort:
			q.ClientReceive = s.receive
		case s.localPort == proxyPort && s.remotePort == clientPort:
			q.ProxySend = s.send
		case owned[s.inode] && s.remotePort == brokerPort:
			q.ProxyReceive = s.receive
			backendPort = s.localPort
		}
	}
	for _, s := range sockets {
		if backendPort != 0 && s.localPort == brokerPort && s.remotePort == backendPort {
			q.BrokerSend = s.send
		}
	}
	return q
}

func readTCPSockets() ([]tcpSocket, error) {
	var sockets []tcpSocket
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		lines := bufio.NewScanner(f)
		lines.Scan() // header
		for lines.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(lines.Text())
			if len(fields) < 10 {
				continue
			}
			tx, rx, _ := strings.Cut(fields[4], ":")
			sockets = append(sockets, tcpSocket{
				localPort:  hexPort(fields[1]),
				remotePort: hexPort(fields[2]),
				send:       hexInt(tx),
				receive:    hexInt(rx),
				inode:      fields[9],
			})
		}
		f.Close()
	}
	return sockets, nil
}

func hexPort(address string) int {
	_, port, _ := strings.Cut(address, ":")
	return int(hexInt(port))
}

func hexInt(s string) int64 {
	n, _ := strconv.ParseInt(s, 16, 64)
	return n
}

// socketInodes are the inodes of pid's sockets.
func socketInodes(pid int) map[string]bool {
	inodes := map[string]bool{}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return inodes
	}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if inode, ok := strings.CutPrefix(target, "socket:["); ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	return inodes
}
