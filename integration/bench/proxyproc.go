package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // the proxy role's -pprof
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/amqp-mirror/amqp-mirror/proxy"
)

// runProxyRole is the proxy process: it serves on cfg.listen in front of cfg.backend,
// prints the address it listens on as its first stdout line, and shuts down gracefully
// when stdin closes or on SIGTERM/SIGINT. Stdin is the lifeline: the bench holds the
// write end, so when the bench ends, however it ends, the proxy follows.
func runProxyRole(cfg config) error {
	level, err := parseLevel(cfg.proxyLogLevel)
	if err != nil {
		return err
	}
	opts := proxy.DefaultOptions(proxy.Backend{Name: "broker", Addr: cfg.backend})
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("process", "proxy")
	srv, err := proxy.New(opts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			ln.Close()
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			ln.Close()
			f.Close()
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "bench proxy: writing CPU profile:", err)
			}
		}()
	}
	if cfg.pprofAddr != "" {
		// For looking inside the proxy during a run: go tool pprof http://ADDR/debug/pprof/heap
		go http.ListenAndServe(cfg.pprofAddr, nil)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if _, err := fmt.Println(ln.Addr()); err != nil {
		srv.Close()
		<-served
		return err
	}

	lifeline := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(lifeline)
	}()
	signals, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	select {
	case err := <-served:
		return err
	case <-lifeline:
	case <-signals.Done():
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shutdownErr := srv.Shutdown(ctx)
	if err := <-served; !errors.Is(err, proxy.ErrServerClosed) {
		return errors.Join(err, shutdownErr)
	}
	return shutdownErr
}

// proxyProcess is a running forwarder: our proxy, -proxy-cmd's, or socat.
type proxyProcess struct {
	cmd *exec.Cmd
	// group is set for a forwarder that ignores its stdin (socat): stop ends its
	// process group with SIGTERM instead.
	group    bool
	addr     string // host:port clients dial
	lifeline io.WriteCloser
	exited   chan struct{} // closed when the process was reaped
	waitErr  error         // valid once exited is closed
}

// startProxy starts a proxy in front of backend and waits for its listen address.
// profile, when set, asks the bench's own proxy role for a CPU profile.
func startProxy(ctx context.Context, cfg config, backend, profile string) (*proxyProcess, error) {
	if cfg.proxyCmd != "" {
		if profile != "" {
			progress("  -proxy-cpuprofile is ignored with -proxy-cmd")
		}
		return startProxyCommand(ctx, cfg, cfg.proxyCmd, backend)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the bench binary to run the proxy: %w", err)
	}
	argv := []string{self, "-role=proxy", "-backend=" + backend, "-listen=127.0.0.1:0",
		"-proxy-log-level=" + cfg.proxyLogLevel}
	if profile != "" {
		argv = append(argv, "-cpuprofile="+profile)
	}
	return startProxyArgv(ctx, cfg, argv)
}

// startProxyCommand starts command (-proxy-cmd's contract) with {backend} replaced.
func startProxyCommand(ctx context.Context, cfg config, command, backend string) (*proxyProcess, error) {
	argv := strings.Fields(strings.ReplaceAll(command, "{backend}", backend))
	if len(argv) == 0 {
		return nil, errors.New("proxy command is empty")
	}
	return startProxyArgv(ctx, cfg, argv)
}

func startProxyArgv(ctx context.Context, cfg config, argv []string) (*proxyProcess, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	if cfg.proxyGOMAXPROCS > 0 {
		cmd.Env = append(os.Environ(), fmt.Sprintf("GOMAXPROCS=%d", cfg.proxyGOMAXPROCS))
	}
	lifeline, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start proxy %q: %w", argv[0], err)
	}
	p := &proxyProcess{cmd: cmd, lifeline: lifeline, exited: make(chan struct{})}

	// The first line is the address; the rest of stdout goes to our stderr. The pipe
	// must be read to its end before Wait, so one goroutine does both, in order.
	firstLine := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		if lines.Scan() {
			firstLine <- strings.TrimSpace(lines.Text())
		}
		close(firstLine)
		for lines.Scan() {
			fmt.Fprintln(os.Stderr, "proxy:", lines.Text())
		}
		io.Copy(io.Discard, stdout)
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	select {
	case line, ok := <-firstLine:
		if !ok {
			<-p.exited
			return nil, fmt.Errorf("proxy %q exited before printing its address: %v", argv[0], p.waitErr)
		}
		if _, _, err := net.SplitHostPort(line); err != nil {
			p.stop()
			return nil, fmt.Errorf("proxy %q printed %q, want its listen host:port", argv[0], line)
		}
		p.addr = line
		return p, nil
	case <-timeout.C:
		p.stop()
		return nil, fmt.Errorf("proxy %q printed no address within 10s", argv[0])
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	}
}

func (p *proxyProcess) pid() int { return p.cmd.Process.Pid }

// stop closes the lifeline, waits for a graceful exit, and kills the proxy if it has not
// gone within 10 seconds. An exit status other than success is an error.
func (p *proxyProcess) stop() error {
	p.lifeline.Close()
	if p.group {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		if attr := p.cmd.SysProcAttr; attr != nil && attr.Setpgid {
			// A wrapper's group: its children too (amqp-mirror serve under its wrapper).
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		} else {
			p.cmd.Process.Kill()
		}
		<-p.exited
		return errors.New("proxy did not exit within 10s of its stdin closing; killed")
	}
	if p.group {
		return nil // socat's exit status after SIGTERM says nothing
	}
	if p.waitErr != nil {
		return fmt.Errorf("proxy exited: %w", p.waitErr)
	}
	return nil
}

// startSocat starts a plain TCP forwarder to backend: socat, forking one process per
// connection, as people put in front of a broker. It prints no address, so the bench
// picks a free port and waits until socat accepts on it.
func startSocat(ctx context.Context, backend string) (*proxyProcess, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command("socat", fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,fork,reuseaddr", port), "TCP:"+backend)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	lifeline, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start socat (apt-get install socat): %w", err)
	}
	p := &proxyProcess{cmd: cmd, addr: addr, group: true, lifeline: lifeline, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("socat exited: %v", p.waitErr)
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("socat does not accept on %s: %w", addr, err)
		}
	}
}
