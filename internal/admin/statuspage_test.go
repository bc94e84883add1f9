package admin

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// getStatusPage fetches the page of f and returns its body.
func getStatusPage(t *testing.T, f *fixture) (string, http.Header) {
	t.Helper()
	resp, err := http.Get(f.url + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /status: %d\n%s", resp.StatusCode, body)
	}
	return string(body), resp.Header
}

func mirroredQueue(vhost, name, master string, slaves ...mirror.Slave) mirror.QueueStatus {
	return mirror.QueueStatus{Meta: mirror.QueueMeta{ID: mirror.QueueID{VHost: vhost, Name: name}, Master: master, Slaves: slaves}, Policy: "ha-all"}
}

func TestStatusPageShows(t *testing.T) {
	views := newFakeViews()
	views.queues = []mirror.QueueStatus{
		mirroredQueue("/", "orders", "rabbit2", mirror.Slave{Backend: "rabbit3", Synchronised: true}, mirror.Slave{Backend: "rabbit1"}),
		mirroredQueue("/", "<script>alert(1)</script>", "rabbit1"),
	}
	views.queues[0].Syncing = []string{"rabbit1"}
	views.queues[0].SyncCopied = 1500
	views.failovers = []mirror.Failover{
		{Queue: mirror.QueueID{VHost: "/", Name: "older"}, From: "rabbit3", To: "rabbit1", Cause: "shutdown", Epoch: 1, Synchronised: true,
			PromotedAt: connectedAt, Duration: 40 * time.Millisecond, Node: "rabbit2"},
		{Queue: mirror.QueueID{VHost: "/", Name: "orders"}, From: "rabbit1", To: "rabbit2", Cause: "failure", Epoch: 3, Synchronised: true,
			PromotedAt: connectedAt.Add(time.Minute), Duration: 1234567 * time.Microsecond, Node: "rabbit1"},
	}
	f := newFixture(t, WithViews(views), WithReadiness(func() error { return errors.New("backend rabbit1 is down") }))
	body, header := getStatusPage(t, f)
	tests := []struct {
		name string
		want string
	}{
		{"this node", `<span id="node">rabbit1</span>`},
		{"the leader", `<span id="leader">rabbit2</span>`},
		{"a failed node", `<td class="state bad">failed</td>`},
		{"a backend drained", `data-backend="rabbit2">`},
		{"a backend down", `<td class="state bad">down</td>`},
		{"not ready", `Not ready: backend rabbit1 is down`},
		{"a queue with its copies", `<td class="name">orders</td><td class="master">rabbit2</td>` + "\n" +
			`<td class="slaves">rabbit3, rabbit1</td><td class="synchronised good">rabbit3</td>` + "\n" +
			`<td class="syncing warn">rabbit1 <span class="sync-progress">(1500 copied)</span></td><td class="unsynchronised bad"></td>`},
		{"a queue name escaped", `<td class="name">&lt;script&gt;alert(1)&lt;/script&gt;</td>`},
		{"a failover with its duration", `<td class="from">rabbit1</td><td class="to">rabbit2</td><td class="cause">failure</td>` + "\n" +
			`<td class="duration" data-ns="1234567000">1.235s</td>`},
		{"the refresh", `<meta http-equiv="refresh" content="5">`},
	}
	for _, tc := range tests {
		if !strings.Contains(body, tc.want) {
			t.Errorf("%s: the page lacks %q", tc.name, tc.want)
		}
	}
	if strings.Contains(body, "<script") {
		t.Error("the page holds a script element: a queue name went unescaped")
	}
	if newer, older := strings.Index(body, `class="failover" data-queue="orders"`), strings.Index(body, `class="failover" data-queue="older"`); newer < 0 || older < newer {
		t.Errorf("the failovers are not newest first (orders at %d, older at %d)", newer, older)
	}
	if csp := header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q does not forbid loading anything", csp)
	}
}

// TestStatusPageBoundsTheQueues: a large install gets the first queues by
// vhost and name, and the page says how many there are.
func TestStatusPageBoundsTheQueues(t *testing.T) {
	tests := []struct {
		name       string
		queues     int
		wantRows   int
		wantNotice string
	}{
		{"none", 0, 0, "0 queue(s) recorded."},
		{"under the bound", 3, 3, "3 queue(s) recorded."},
		{"over the bound", statusPageQueues + 20, statusPageQueues, fmt.Sprintf("Showing the first %d of %d queues", statusPageQueues, statusPageQueues+20)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			views := newFakeViews()
			for i := range tc.queues {
				views.queues = append(views.queues, mirroredQueue("/", fmt.Sprintf("q%05d", tc.queues-i), "rabbit1"))
			}
			body, _ := getStatusPage(t, newFixture(t, WithViews(views)))
			if got := strings.Count(body, `<tr class="queue"`); got != tc.wantRows {
				t.Errorf("got %d queue rows, want %d", got, tc.wantRows)
			}
			if !strings.Contains(body, tc.wantNotice) {
				t.Errorf("the page lacks %q", tc.wantNotice)
			}
			if tc.queues > 0 && !strings.Contains(body, `data-queue="q00001"`) {
				t.Error("the first queue by name is not listed")
			}
		})
	}
}

// TestStatusPageWithoutMirroring: one backend, no queues, no failovers;
// a proxy that did not answer is said, not a failed page.
func TestStatusPageWithoutMirroring(t *testing.T) {
	views := newFakeViews()
	views.cluster.Mirroring, views.cluster.Sidecar = false, false
	views.partial = errors.New("no answer from rabbit3")
	body, _ := getStatusPage(t, newFixture(t, WithViews(views)))
	for _, want := range []string{"Mirroring is off: the proxy has one backend.", `id="no-failovers"`, "failovers: no answer from rabbit3", "one proxy"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
