package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The read-only views end to end: ctl cluster_status, list_connections and list_consumers
// against `amqp-mirror serve`, and the admin status page rendered by a real browser after a
// real failover.

// TestCtlViewsOfAProxy checks the three view commands against a proxy in front of the three
// nodes, with a client that consumes through it: cluster_status shows the proxy alone, leader
// and voter of its own log, and every backend up; list_connections shows the client's
// connection and list_consumers its consumer with rabbitmqctl's columns and the backend it
// consumes on. A proxy with one backend shows itself too, without mirroring.
func TestCtlViewsOfAProxy(t *testing.T) {
	queue := queueName(t)
	p := startMirrorProxy(t, mirrorPolicyYAML("views-all", exactly(queue), map[string]any{"ha-mode": "all"}))
	conn := dialURL(t, p.url("guest", "guest"))
	ch := openChannel(t, conn)
	declareMirrored(t, p, conn, queue, false, nil)
	if err := ch.Qos(7, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume(queue, "views-consumer", false, false, false, false, amqp.Table{"x-priority": int32(3)}); err != nil {
		t.Fatalf("consume through the proxy: %v", err)
	}
	row, err := queueStatus(t, p, queue)
	if err != nil {
		t.Fatal(err)
	}

	// cluster_status: the proxy alone, in the table and as one JSON object. A backend is
	// up once the proxy's own probe of it answered, which a loaded host may delay.
	var r cliResult
	awaitCondition(t, 20*time.Second, func() error {
		r = p.ctl(t, "cluster_status")
		for _, b := range mirrorBackends() {
			if !strings.Contains(r.stdout, "\n"+b+"\tup\tfalse\t") {
				return fmt.Errorf("cluster_status does not show backend %s up:\n%s%s", b, r.stdout, r.stderr)
			}
		}
		return nil
	})
	r.check(t, 0, []string{"Cluster status of proxy proxy ...\n", "Sidecar cluster: no\n", "Mirroring: yes\n",
		"Metadata leader: proxy\n", "Voters: [proxy]\n", "Paused: no\n", "\nproxy\talive\ttrue\ttrue\t"}, nil, nil)
	r = p.ctl(t, "cluster_status", "--formatter", "json")
	r.check(t, 0, nil, nil, nil)
	var status struct {
		Node, Leader string
		Sidecar      bool
		Mirroring    bool
		Voters       []string
		Nodes        []struct {
			Name, State   string
			Voter, Leader bool
		}
		Backends []struct {
			Name, State string
			Home        bool
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &status); err != nil {
		t.Fatalf("cluster_status --formatter json: %v\n%s", err, r.stdout)
	}
	if status.Node != "proxy" || status.Leader != "proxy" || status.Sidecar || !status.Mirroring || len(status.Nodes) != 1 ||
		!status.Nodes[0].Leader || len(status.Backends) != 3 || !status.Backends[0].Home || status.Backends[0].State != "up" {
		t.Errorf("cluster_status --formatter json: %+v", status)
	}

	// list_connections: the client's connection, as this process sees it.
	r = p.ctl(t, "list_connections", "--formatter", "json", "user", "vhost", "peer_host", "peer_port", "state", "channels", "port", "protocol", "backend", "timeout")
	r.check(t, 0, nil, nil, nil)
	var connections []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &connections); err != nil {
		t.Fatalf("list_connections --formatter json: %v\n%s", err, r.stdout)
	}
	local := conn.LocalAddr().String()
	i := slices.IndexFunc(connections, func(c map[string]any) bool {
		return fmt.Sprintf("%v:%v", c["peer_host"], c["peer_port"]) == local
	})
	if i < 0 {
		t.Fatalf("list_connections does not list the client at %s:\n%s", local, r.stdout)
	}
	want := map[string]any{"user": "guest", "vhost": "/", "peer_host": "127.0.0.1", "peer_port": connections[i]["peer_port"], "state": "running",
		"channels": 1.0, "port": connections[i]["port"], "protocol": "AMQP 0-9-1", "backend": mirrorBackends()[0], "timeout": 10.0}
	if fmt.Sprint(connections[i]) != fmt.Sprint(want) {
		t.Errorf("list_connections row:\n got %v\nwant %v", connections[i], want)
	}
	p.ctl(t, "list_connections").check(t, 0, []string{"Listing connections ...\nuser\tpeer_host\tpeer_port\tstate\tbackend\n", "guest\t127.0.0.1\t"}, nil, nil)

	// list_consumers: the consumer, on the queue's master.
	r = p.ctl(t, "list_consumers", "-q")
	r.check(t, 0, []string{"queue_name\tchannel_pid\tconsumer_tag\tack_required\tprefetch_count\tactive\targuments\tbackend\n",
		queue + "\t" + local + " -> "}, nil, nil)
	if !strings.Contains(r.stdout, " (1)\tviews-consumer\ttrue\t7\ttrue\t{\"x-priority\":3}\t"+row.Master+"\n") {
		t.Errorf("list_consumers: no row for the consumer on channel 1 with prefetch 7, its arguments and master %s:\n%s", row.Master, r.stdout)
	}
	p.ctl(t, "list_consumers", "-p", "no-such-vhost", "--formatter", "json").check(t, 0, []string{"[]\n"}, nil, nil)

	// One backend: no mirroring, the proxy still shows itself and its backend.
	single := newCLI(t).serveConfig(t, newCLIConfig(t, cluster.Nodes()[0]))
	awaitCondition(t, 20*time.Second, func() error {
		r = single.ctl(t, "cluster_status", "--formatter", "json")
		for _, want := range []string{`"node":"proxy"`, `"mirroring":false`, `"leader":""`, `"nodes":[{"name":"proxy","state":"alive"`,
			`"backends":[{"name":"` + cluster.Nodes()[0].Name + `","state":"up","drained":false,"home":true}]`} {
			if !strings.Contains(r.stdout, want) {
				return fmt.Errorf("cluster_status --formatter json of a proxy with one backend lacks %s:\n%s%s", want, r.stdout, r.stderr)
			}
		}
		return nil
	})
	single.ctl(t, "list_connections", "-q").check(t, 0, []string{"user\tpeer_host\tpeer_port\tstate\tbackend\n"}, nil, nil)
}

// TestStatusPageInABrowser checks the admin status page as a person sees it: after the
// master's broker of a mirrored queue is killed and its slave promoted, headless Chromium
// loads the page from the proxy's admin listener; the DOM it built shows the queue with its
// new master and slaves and the failover with its duration, and its screenshot is a real
// image. Chromium comes from Debian (scripts/install-deps.sh); without it the test fails.
func TestStatusPageInABrowser(t *testing.T) {
	browser := chromiumPath(t)
	queue := queueName(t)
	p := startMirrorProxy(t, mirrorPolicyYAML("page-all", exactly(queue), map[string]any{"ha-mode": "all", "ha-sync-mode": "automatic"}))
	conn := dialURL(t, p.url("guest", "guest"))
	declareMirrored(t, p, conn, queue, true, nil)
	publishConfirmed(t, conn, queue, 20, func(i int) amqp.Publishing { return amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)} })
	before := awaitSynchronised(t, p, queue, 2, 30*time.Second)

	lost := node(t, before.Master)
	if err := lost.Kill(); err != nil {
		t.Fatalf("kill %s: %v", lost.Name, err)
	}
	t.Cleanup(func() { restartNode(t, lost) })
	var after queueRow
	awaitCondition(t, 30*time.Second, func() error {
		row, err := queueStatus(t, p, queue)
		if err != nil {
			return err
		}
		if row.Master == before.Master {
			return fmt.Errorf("%v; want a master other than %s", row, before.Master)
		}
		after = row
		return nil
	})
	if after.Master != before.Slaves[0] {
		t.Errorf("the new master is %s, want the oldest slave %s", after.Master, before.Slaves[0])
	}

	page := "http://" + p.adminAddr + "/status"
	dir := t.TempDir()
	var dom string
	awaitCondition(t, 30*time.Second, func() error {
		out, err := runChromium(t, browser, dir, "--dump-dom", page)
		if err != nil {
			return err
		}
		dom = string(out)
		for _, want := range []string{
			`<tr class="queue" data-vhost="/" data-queue="` + queue + `">`,
			`<td class="name">` + queue + `</td><td class="master">` + after.Master + `</td>`,
			`<td class="slaves">` + strings.Join(after.Slaves, ", ") + `</td>`,
			`<tr class="failover" data-queue="` + queue + `">`,
			`<td class="from">` + before.Master + `</td><td class="to">` + after.Master + `</td><td class="cause">failure</td>`,
		} {
			if !strings.Contains(dom, want) {
				return fmt.Errorf("the page's DOM lacks %q", want)
			}
		}
		return nil
	})
	row := dom[strings.Index(dom, `<tr class="failover" data-queue="`+queue+`">`):]
	row = row[:strings.Index(row, "</tr>")]
	var ns int64
	if _, err := fmt.Sscanf(row[strings.Index(row, `data-ns="`):], `data-ns="%d"`, &ns); err != nil {
		t.Fatalf("the failover row has no duration: %v\n%s", err, row)
	}
	if took := time.Duration(ns); took <= 0 || took > 30*time.Second {
		t.Errorf("the failover took %v by the page, want a positive duration under 30s\n%s", took, row)
	}
	for _, want := range []string{`<span id="node">proxy</span>`, `<span id="leader">proxy</span>`,
		`data-backend="` + before.Master + `">`, `<td class="state bad">down</td>`} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page's DOM lacks %q", want)
		}
	}
	if strings.Contains(dom, "guest:guest") || strings.Contains(dom, p.token) {
		t.Error("the page shows a credential")
	}

	screenshot := filepath.Join(dir, "status.png")
	if _, err := runChromium(t, browser, dir, "--screenshot="+screenshot, "--window-size=1280,900", "--hide-scrollbars", page); err != nil {
		t.Fatal(err)
	}
	checkScreenshot(t, screenshot, 1280, 900)
}

// chromiumPath finds Debian's Chromium, and fails the test when it is missing: the page
// must be seen by a browser, not skipped.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"/usr/bin/chromium", "chromium"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Fatal("chromium is not installed: run scripts/install-deps.sh (as root) to install the tests' packages")
	return ""
}

// chromiumTimeout bounds one run of the browser, so that it can never hang the suite.
const chromiumTimeout = time.Minute

// runChromium runs headless Chromium with args, its profile under dir, and returns its
// standard output. The whole process group is killed when the run times out: Chromium
// starts helper processes of its own.
func runChromium(t *testing.T, browser, dir string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), chromiumTimeout)
	defer cancel()
	profile, err := os.MkdirTemp(dir, "profile-")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, browser, append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + profile,
	}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+profile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("chromium %s: no result within %v\n%s", strings.Join(args, " "), chromiumTimeout, stderr.String())
	}
	if err != nil {
		return nil, fmt.Errorf("chromium %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// checkScreenshot requires a PNG of the window's size that is not a single colour.
func checkScreenshot(t *testing.T, path string, width, height int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("chromium wrote no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("the screenshot is no PNG: %v", err)
	}
	bounds := img.Bounds()
	if bounds.Dx() != width || bounds.Dy() != height {
		t.Errorf("the screenshot is %dx%d, want %dx%d", bounds.Dx(), bounds.Dy(), width, height)
	}
	colours := map[[4]uint32]bool{}
	for y := bounds.Min.Y; y < bounds.Max.Y && len(colours) < 16; y += 3 {
		for x := bounds.Min.X; x < bounds.Max.X && len(colours) < 16; x += 3 {
			r, g, b, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, b, a}] = true
		}
	}
	if len(colours) < 3 {
		t.Errorf("the screenshot has %d colour(s): the page was not drawn", len(colours))
	}
	if info, err := os.Stat(path); err == nil && info.Size() < 10<<10 {
		t.Errorf("the screenshot is %d bytes, too small for a page of tables", info.Size())
	}
}
