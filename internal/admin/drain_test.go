package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/engine"
)

// fakeDrainer stands in for the engine's Drainer: it answers a fixed
// report for rabbit1, an empty one for rabbit2, and ErrUnknownBackend for
// the rest, as the engine does.
type fakeDrainer struct {
	mu       sync.Mutex
	report   engine.DrainReport
	drains   []string
	undrains []string
}

func newFakeDrainer() *fakeDrainer {
	q := func(vhost, name string) mirror.QueueID { return mirror.QueueID{VHost: vhost, Name: name} }
	return &fakeDrainer{report: engine.DrainReport{Backend: "rabbit1", Queues: []engine.DrainedQueue{
		// Out of order on purpose: the API sorts by vhost and name.
		{ID: q("/", "orders"), Role: engine.RoleMaster, To: "rabbit2", Synchronised: true, Epoch: 3},
		{ID: q("/", "audit"), Role: engine.RoleSlave, Epoch: 1},
		{ID: q("/", "lonely"), Role: engine.RoleMaster, Reason: "master rabbit1 lost (shutdown): no synchronised slave and ha-promote-on-shutdown is when-synced; the queue waits for its master"},
		{ID: q("/", "best-effort"), Role: engine.RoleMaster, To: "rabbit3", Epoch: 1},
	}}}
}

func (f *fakeDrainer) Drain(_ context.Context, backend string) (engine.DrainReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drains = append(f.drains, backend)
	switch backend {
	case "rabbit1":
		r := f.report
		r.Queues = slices.Clone(r.Queues)
		return r, nil
	case "rabbit2":
		return engine.DrainReport{Backend: backend, Queues: []engine.DrainedQueue{}}, nil
	}
	return engine.DrainReport{}, fmt.Errorf("backend '%s' (configured: rabbit1, rabbit2, rabbit3): %w", backend, engine.ErrUnknownBackend)
}

func (f *fakeDrainer) Undrain(_ context.Context, backend string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.undrains = append(f.undrains, backend)
	if backend != "rabbit1" && backend != "rabbit2" {
		return fmt.Errorf("backend '%s' (configured: rabbit1, rabbit2, rabbit3): %w", backend, engine.ErrUnknownBackend)
	}
	return nil
}

func (f *fakeDrainer) calls() (drains, undrains []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.drains), slices.Clone(f.undrains)
}

// engineLike is a Queues that is also a Drainer, as the engine is.
type engineLike struct {
	*fakeQueues
	*fakeDrainer
}

func TestCtlDrain(t *testing.T) {
	fake := newFakeDrainer()
	on := newFixture(t, WithQueues(engineLike{newFakeQueues(), fake}))
	off := newFixture(t)
	tests := []ctlCase{
		{"drain", on.client, []string{"drain", "rabbit1"}, ExitOK,
			"Draining backend rabbit1 ...\n" +
				"queue 'audit' in vhost '/': slave on rabbit1 dropped\n" +
				"queue 'best-effort' in vhost '/': master rabbit1 -> rabbit3 (unsynchronised: messages only rabbit1 held are lost)\n" +
				"queue 'lonely' in vhost '/': master stays on rabbit1: master rabbit1 lost (shutdown): no synchronised slave and ha-promote-on-shutdown is when-synced; the queue waits for its master\n" +
				"queue 'orders' in vhost '/': master rabbit1 -> rabbit2\n" +
				"Backend rabbit1 drained: 2 master(s) moved, 1 master(s) kept, 1 slave(s) dropped. Nothing new is placed on it until `ctl undrain rabbit1`.\n" +
				"The queues whose master stayed have no synchronised slave: stopping rabbit1 now leaves them without a master until it returns. Synchronise them (sync_queue) and drain again.\n", ""},
		{"drain, quiet", on.client, []string{"drain", "-q", "rabbit1"}, ExitOK,
			"queue 'audit' in vhost '/': slave on rabbit1 dropped\n" +
				"queue 'best-effort' in vhost '/': master rabbit1 -> rabbit3 (unsynchronised: messages only rabbit1 held are lost)\n" +
				"queue 'lonely' in vhost '/': master stays on rabbit1: master rabbit1 lost (shutdown): no synchronised slave and ha-promote-on-shutdown is when-synced; the queue waits for its master\n" +
				"queue 'orders' in vhost '/': master rabbit1 -> rabbit2\n", ""},
		{"drain, nothing there", on.client, []string{"drain", "rabbit2"}, ExitOK,
			"Draining backend rabbit2 ...\n" +
				"Backend rabbit2 drained: 0 master(s) moved, 0 master(s) kept, 0 slave(s) dropped. Nothing new is placed on it until `ctl undrain rabbit2`.\n", ""},
		{"drain, json", on.client, []string{"drain", "--formatter", "json", "rabbit2"}, ExitOK,
			`{"backend":"rabbit2","queues":[]}` + "\n", ""},
		{"unknown backend", on.client, []string{"drain", "rabbit9"}, ExitDataErr, "Draining backend rabbit9 ...\n",
			"Error: drain: backend 'rabbit9' (configured: rabbit1, rabbit2, rabbit3): unknown backend (HTTP 404)"},
		{"undrain", on.client, []string{"undrain", "rabbit1"}, ExitOK, "Undraining backend rabbit1 ...\n", ""},
		{"undrain, unknown backend", on.client, []string{"undrain", "-q", "rabbit9"}, ExitDataErr, "",
			"Error: undrain: backend 'rabbit9' (configured: rabbit1, rabbit2, rabbit3): unknown backend (HTTP 404)"},
		{"no backend", on.client, []string{"drain"}, ExitUsage, "", "Error: expected 1 argument(s), found 0\nUsage: amqp-mirror ctl drain"},
		{"mirroring off: drain", off.client, []string{"drain", "-q", "rabbit1"}, ExitDataErr, "", "Error: mirroring is off: the proxy has one backend"},
		{"mirroring off: undrain", off.client, []string{"undrain", "-q", "rabbit1"}, ExitDataErr, "", "Error: mirroring is off: the proxy has one backend"},
	}
	runCtlCases(t, tests)
	drains, undrains := fake.calls()
	if want := []string{"rabbit1", "rabbit1", "rabbit2", "rabbit2", "rabbit9"}; !slices.Equal(drains, want) {
		t.Errorf("engine drains: got %q, want %q (the usage error and mirroring off reach no engine)", drains, want)
	}
	if want := []string{"rabbit1", "rabbit9"}; !slices.Equal(undrains, want) {
		t.Errorf("engine undrains: got %q, want %q", undrains, want)
	}
}

// failingDrainer reports one queue whose change the log did not take.
type failingDrainer struct{ fakeDrainer }

func (f *failingDrainer) Drain(_ context.Context, backend string) (engine.DrainReport, error) {
	return engine.DrainReport{Backend: backend, Queues: []engine.DrainedQueue{
		{ID: mirror.QueueID{VHost: "/", Name: "orders"}, Role: engine.RoleMaster, Error: "metadata log has no leader"},
	}}, nil
}

func TestCtlDrainIncomplete(t *testing.T) {
	f := newFixture(t, WithDrainer(&failingDrainer{}))
	code, out, errOut := ctl(t, f.client, "drain", "rabbit1")
	if code != ExitSoftware {
		t.Errorf("exit code: got %d, want %d", code, ExitSoftware)
	}
	if want := "queue 'orders' in vhost '/': not drained: metadata log has no leader\n"; !strings.Contains(out, want) {
		t.Errorf("stdout lacks %q:\n%s", want, out)
	}
	if want := "Error: 1 queue(s) could not be drained"; !strings.Contains(errOut, want) {
		t.Errorf("stderr lacks %q:\n%s", want, errOut)
	}
}

func TestClientDrain(t *testing.T) {
	fake := newFakeDrainer()
	f := newFixture(t, WithDrainer(fake))
	ctx := context.Background()
	report, err := f.client.Drain(ctx, "rabbit1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range report.Queues {
		got = append(got, q.ID.Name)
	}
	if want := []string{"audit", "best-effort", "lonely", "orders"}; report.Backend != "rabbit1" || !slices.Equal(got, want) {
		t.Errorf("report for %s with queues %q, want rabbit1 with %q (sorted)", report.Backend, got, want)
	}
	if q := report.Queues[3]; !q.Moved() || q.To != "rabbit2" || q.Epoch != 3 {
		t.Errorf("orders: %+v, want moved to rabbit2 at epoch 3", q)
	}
	var api *APIError
	if _, err := f.client.Drain(ctx, "rabbit9"); !errors.As(err, &api) || api.Status != http.StatusNotFound {
		t.Errorf("Drain(rabbit9) = %v, want a 404 APIError", err)
	}
	if err := f.client.Undrain(ctx, "rabbit1"); err != nil {
		t.Errorf("Undrain(rabbit1) = %v", err)
	}
}

func TestBackendActionBadRequests(t *testing.T) {
	fake := newFakeDrainer()
	f := newFixture(t, WithDrainer(fake))
	tests := []struct {
		name, body string
		wantStatus int
		wantText   string
	}{
		{"unknown action", `{"action":"stop"}`, http.StatusBadRequest, `action: expected "drain" or "undrain", found "stop"`},
		{"unknown field", `{"action":"drain","force":true}`, http.StatusBadRequest, "request body"},
		{"no body", ``, http.StatusBadRequest, "request body"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, f.url+"/api/backends/rabbit1/actions", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+testToken)
			resp, err := f.client.HTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body errorBody
			_ = json.NewDecoder(resp.Body).Decode(&body)
			if resp.StatusCode != tc.wantStatus || !strings.Contains(body.Error, tc.wantText) {
				t.Errorf("got %d %q, want %d with %q", resp.StatusCode, body.Error, tc.wantStatus, tc.wantText)
			}
		})
	}
	if drains, undrains := fake.calls(); len(drains)+len(undrains) != 0 {
		t.Errorf("engine calls %q %q, want none (refused bodies reach no engine)", drains, undrains)
	}
}

func TestCtlHelpDrain(t *testing.T) {
	f := newFixture(t)
	for _, args := range [][]string{{"help", "drain"}, {"drain", "--help"}} {
		code, out, _ := ctl(t, f.client, args...)
		if code != ExitOK || !strings.Contains(out, "Usage: amqp-mirror ctl drain [--formatter table|json] BACKEND") ||
			!strings.Contains(out, "ha-promote-on-shutdown") {
			t.Errorf("%q: exit %d, output lacks the usage or summary:\n%s", args, code, out)
		}
	}
	_, out, _ := ctl(t, f.client, "help")
	for _, want := range []string{"drain ", "undrain "} {
		if !strings.Contains(out, "  "+want) {
			t.Errorf("help lacks the %q command:\n%s", want, out)
		}
	}
}
