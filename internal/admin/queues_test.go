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
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// fakeQueues stands in for the engine: the admin API only passes calls
// through, so what matters is what it is asked and what it answers.
type fakeQueues struct {
	mu     sync.Mutex
	queues map[string][]mirror.QueueStatus // by vhost
	err    error                           // returned by every call when set
	// syncPolls, when set, is how many listings after a SyncQueue the
	// queue's slaves become synchronised; 0 leaves them as they are.
	syncPolls int
	pending   map[mirror.QueueID]int
	syncs     []mirror.QueueID
	cancels   []mirror.QueueID
	listings  []string // vhosts asked for
	unacked   []bool   // whether each listing asked for the unacknowledged counts
}

func newFakeQueues() *fakeQueues {
	return &fakeQueues{queues: map[string][]mirror.QueueStatus{
		// Out of order on purpose: the API sorts by name.
		"/": {
			{
				Meta: mirror.QueueMeta{ID: mirror.QueueID{VHost: "/", Name: "orders"}, Master: "rabbit1",
					Slaves: []mirror.Slave{{Backend: "rabbit3", Synchronised: true}, {Backend: "rabbit2"}}},
				Messages: 12, Consumers: 2, Policy: "ha-all", Syncing: []string{"rabbit2"},
			},
			{
				Meta:     mirror.QueueMeta{ID: mirror.QueueID{VHost: "/", Name: "audit/log"}, Master: "rabbit2"},
				Messages: -1, Consumers: -1,
			},
		},
		"prod": {
			{Meta: mirror.QueueMeta{ID: mirror.QueueID{VHost: "prod", Name: "jobs & tasks"}, Master: "rabbit3",
				Slaves: []mirror.Slave{{Backend: "rabbit1", Synchronised: true}}}, Messages: 0, Consumers: 1, Policy: "two"},
		},
	}}
}

func (f *fakeQueues) ListQueues(_ context.Context, vhost string, unacked bool) ([]mirror.QueueStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listings = append(f.listings, vhost)
	f.unacked = append(f.unacked, unacked)
	if f.err != nil {
		return nil, f.err
	}
	for id, n := range f.pending {
		if n--; n > 0 {
			f.pending[id] = n
			continue
		}
		delete(f.pending, id)
		for i, q := range f.queues[id.VHost] {
			if q.Meta.ID == id {
				q.Meta = q.Meta.Clone()
				for j := range q.Meta.Slaves {
					q.Meta.Slaves[j].Synchronised = true
				}
				q.Syncing = nil
				f.queues[id.VHost][i] = q
			}
		}
	}
	return slices.Clone(f.queues[vhost]), nil
}

func (f *fakeQueues) SyncQueue(_ context.Context, id mirror.QueueID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncs = append(f.syncs, id)
	if err := f.check(id); err != nil {
		return err
	}
	if f.syncPolls > 0 {
		if f.pending == nil {
			f.pending = map[mirror.QueueID]int{}
		}
		f.pending[id] = f.syncPolls
	}
	return nil
}

func (f *fakeQueues) CancelSyncQueue(_ context.Context, id mirror.QueueID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancels = append(f.cancels, id)
	return f.check(id)
}

// check answers as the engine does: the injected error, or not found.
func (f *fakeQueues) check(id mirror.QueueID) error {
	if f.err != nil {
		return f.err
	}
	for _, q := range f.queues[id.VHost] {
		if q.Meta.ID == id {
			return nil
		}
	}
	return fmt.Errorf("engine: %v: %w", id, mirror.ErrQueueNotFound)
}

func (f *fakeQueues) calls() (syncs, cancels []mirror.QueueID, listings []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.syncs), slices.Clone(f.cancels), slices.Clone(f.listings)
}

func (f *fakeQueues) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func TestClientQueues(t *testing.T) {
	fake := newFakeQueues()
	f := newFixture(t, WithQueues(fake))
	ctx := context.Background()

	list, err := f.client.ListQueues(ctx, "", true)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, q := range list {
		names = append(names, q.Meta.ID.Name)
	}
	if want := []string{"audit/log", "orders"}; !slices.Equal(names, want) {
		t.Errorf("ListQueues(\"\"): got %q, want %q (vhost /, sorted by name)", names, want)
	}
	if len(list) == 2 {
		got := list[1]
		if got.Meta.Master != "rabbit1" || !slices.Equal(got.Meta.Backends(), []string{"rabbit1", "rabbit3", "rabbit2"}) ||
			!slices.Equal(got.Meta.SynchronisedSlaves(), []string{"rabbit3"}) || got.Messages != 12 || got.Consumers != 2 ||
			got.Policy != "ha-all" || !slices.Equal(got.Syncing, []string{"rabbit2"}) {
			t.Errorf("ListQueues: orders came back as %+v", got)
		}
		if list[0].Messages != -1 {
			t.Errorf("ListQueues: audit/log messages %d, want -1 (master not asked)", list[0].Messages)
		}
	}
	if list, err := f.client.ListQueues(ctx, "empty", true); err != nil || list == nil || len(list) != 0 {
		t.Errorf("ListQueues(empty): got %v, %v, want an empty list", list, err)
	}

	// A vhost and a name with a slash survive the path.
	for _, id := range []mirror.QueueID{{VHost: "/", Name: "audit/log"}, {VHost: "prod", Name: "jobs & tasks"}} {
		if err := f.client.SyncQueue(ctx, id); err != nil {
			t.Errorf("SyncQueue(%v): %v", id, err)
		}
	}
	if err := f.client.CancelSyncQueue(ctx, mirror.QueueID{VHost: "/", Name: "orders"}); err != nil {
		t.Errorf("CancelSyncQueue: %v", err)
	}
	syncs, cancels, listings := fake.calls()
	if want := []mirror.QueueID{{VHost: "/", Name: "audit/log"}, {VHost: "prod", Name: "jobs & tasks"}}; !slices.Equal(syncs, want) {
		t.Errorf("engine's SyncQueue calls: got %v, want %v", syncs, want)
	}
	if want := []mirror.QueueID{{VHost: "/", Name: "orders"}}; !slices.Equal(cancels, want) {
		t.Errorf("engine's CancelSyncQueue calls: got %v, want %v", cancels, want)
	}
	if want := []string{"/", "empty"}; !slices.Equal(listings, want) {
		t.Errorf("engine's ListQueues vhosts: got %q, want %q", listings, want)
	}
}

func TestQueueAPIErrors(t *testing.T) {
	fake := newFakeQueues()
	on := newFixture(t, WithQueues(fake))
	off := newFixture(t)
	missing := mirror.QueueID{VHost: "/", Name: "nope"}
	orders := mirror.QueueID{VHost: "/", Name: "orders"}

	tests := []struct {
		name       string
		call       func() error
		engineErr  error
		wantStatus int
		wantText   string
	}{
		{"list without mirroring", func() error { _, err := off.client.ListQueues(context.Background(), "/", true); return err }, nil,
			http.StatusConflict, "mirroring is off: the proxy has one backend"},
		{"sync without mirroring", func() error { return off.client.SyncQueue(context.Background(), orders) }, nil,
			http.StatusConflict, "mirroring is off: the proxy has one backend"},
		{"cancel without mirroring", func() error { return off.client.CancelSyncQueue(context.Background(), orders) }, nil,
			http.StatusConflict, "mirroring is off: the proxy has one backend"},
		{"sync of an unknown queue", func() error { return on.client.SyncQueue(context.Background(), missing) }, nil,
			http.StatusNotFound, "queue 'nope' in vhost '/' not found"},
		{"cancel of an unknown queue", func() error { return on.client.CancelSyncQueue(context.Background(), missing) }, nil,
			http.StatusNotFound, "queue 'nope' in vhost '/' not found"},
		{"engine failure", func() error { return on.client.SyncQueue(context.Background(), orders) }, errors.New("no synchronised copy to read from"),
			http.StatusInternalServerError, "sync queue 'orders' in vhost '/': no synchronised copy to read from"},
		{"no leader", func() error { _, err := on.client.ListQueues(context.Background(), "/", true); return err }, fmt.Errorf("listing: %w", store.ErrNotLeader),
			http.StatusServiceUnavailable, "listing queues of vhost '/': listing: metadata log has no reachable leader here"},
		{"wrong token", func() error {
			bad := *on.client
			bad.Token = "nope"
			return bad.SyncQueue(context.Background(), orders)
		}, nil, http.StatusUnauthorized, "admin token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake.fail(tc.engineErr)
			defer fake.fail(nil)
			err := tc.call()
			var api *APIError
			if !errors.As(err, &api) {
				t.Fatalf("got %v, want an APIError", err)
			}
			if api.Status != tc.wantStatus || !strings.Contains(api.Message, tc.wantText) {
				t.Errorf("got %d %q, want %d with %q", api.Status, api.Message, tc.wantStatus, tc.wantText)
			}
		})
	}
	// The server without an engine and the wrong token reach no engine.
	if syncs, _, _ := fake.calls(); !slices.Equal(syncs, []mirror.QueueID{missing, orders}) {
		t.Errorf("engine's SyncQueue calls: got %v, want %v", syncs, []mirror.QueueID{missing, orders})
	}
}

// TestQueueActionBody checks the raw endpoint: the action is required and
// named, as in RabbitMQ's management API.
func TestQueueActionBody(t *testing.T) {
	fake := newFakeQueues()
	f := newFixture(t, WithQueues(fake))
	tests := []struct {
		name       string
		body       string
		wantStatus int
		wantText   string
	}{
		{"sync", `{"action":"sync"}`, http.StatusNoContent, ""},
		{"cancel_sync", `{"action":"cancel_sync"}`, http.StatusNoContent, ""},
		{"unknown action", `{"action":"resync"}`, http.StatusBadRequest, `action: expected "sync" or "cancel_sync", found "resync"`},
		{"unknown field", `{"action":"sync","mode":"fast"}`, http.StatusBadRequest, `unknown field "mode"`},
		{"no body", ``, http.StatusBadRequest, "request body"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, f.url+"/api/queues/%2F/orders/actions", strings.NewReader(tc.body))
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
	syncs, cancels, _ := fake.calls()
	if len(syncs) != 1 || len(cancels) != 1 {
		t.Errorf("engine calls: %d syncs, %d cancels; want 1 and 1 (refused bodies reach no engine)", len(syncs), len(cancels))
	}
}

// TestCtlListQueuesAsksUnackedForItsColumns: list_queues asks the engine for
// the unacknowledged counts, which take a round trip to every other proxy
// of a cluster, only when a column shows them; sync_queue --wait never does.
func TestCtlListQueuesAsksUnackedForItsColumns(t *testing.T) {
	tests := []struct {
		args []string
		want bool
	}{
		{[]string{"list_queues"}, true}, // the default columns have messages
		{[]string{"list_queues", "name", "messages"}, true},
		{[]string{"list_queues", "name", "messages_unacknowledged"}, true},
		{[]string{"list_queues", "name", "messages_ready", "master", "consumers"}, false},
	}
	for _, tc := range tests {
		fake := newFakeQueues()
		f := newFixture(t, WithQueues(fake))
		if code, _, errOut := ctl(t, f.client, tc.args...); code != 0 {
			t.Fatalf("%v: exit code %d, stderr %q", tc.args, code, errOut)
		}
		fake.mu.Lock()
		got := slices.Clone(fake.unacked)
		fake.mu.Unlock()
		if want := []bool{tc.want}; !slices.Equal(got, want) {
			t.Errorf("%v: the engine was asked for unacknowledged counts %v, want %v", tc.args, got, want)
		}
	}
}

func TestCtlListQueues(t *testing.T) {
	fake := newFakeQueues()
	f := newFixture(t, WithQueues(fake))
	tests := []struct {
		name       string
		args       []string
		code       int
		wantStdout string // the whole output
		wantStderr string
	}{
		{"default columns", []string{"list_queues"}, 0,
			"Listing queues for vhost / ...\n" +
				"name\tmessages\tmaster\tslaves\tsynchronised_slaves\n" +
				"audit/log\t\trabbit2\t[]\t[]\n" +
				"orders\t12\trabbit1\t[rabbit3, rabbit2]\t[rabbit3]\n", ""},
		{"chosen columns in the order asked", []string{"list_queues", "-q", "policy", "consumers", "name", "syncing_slaves"}, 0,
			"policy\tconsumers\tname\tsyncing_slaves\n" +
				"\t\taudit/log\t[]\n" +
				"ha-all\t2\torders\t[rabbit2]\n", ""},
		{"rabbitmqctl's column names", []string{"list_queues", "-q", "name", "pid", "slave_pids", "synchronised_slave_pids"}, 0,
			"name\tpid\tslave_pids\tsynchronised_slave_pids\n" +
				"audit/log\trabbit2\t[]\t[]\n" +
				"orders\trabbit1\t[rabbit3, rabbit2]\t[rabbit3]\n", ""},
		{"another vhost", []string{"list_queues", "-p", "prod", "name", "messages", "slaves"}, 0,
			"Listing queues for vhost prod ...\nname\tmessages\tslaves\njobs & tasks\t0\t[rabbit1]\n", ""},
		{"no queues", []string{"list_queues", "-p", "empty"}, 0,
			"Listing queues for vhost empty ...\nname\tmessages\tmaster\tslaves\tsynchronised_slaves\n", ""},
		{"json, default columns", []string{"list_queues", "--formatter", "json"}, 0,
			`[{"name":"audit/log","messages":null,"master":"rabbit2","slaves":[],"synchronised_slaves":[]},` +
				`{"name":"orders","messages":12,"master":"rabbit1","slaves":["rabbit3","rabbit2"],"synchronised_slaves":["rabbit3"]}]` + "\n", ""},
		{"json, chosen columns", []string{"list_queues", "-p", "prod", "--formatter=json", "name", "consumers", "policy", "pid"}, 0,
			`[{"name":"jobs & tasks","consumers":1,"policy":"two","pid":"rabbit3"}]` + "\n", ""},
		{"json, no queues", []string{"--formatter", "json", "list_queues", "-p", "empty"}, 0, "[]\n", ""},
		{"unknown column", []string{"list_queues", "name", "pids", "state"}, ExitUsage, "",
			`Error: unknown column(s) "pids", "state": valid columns are name, messages, messages_ready, messages_unacknowledged, master, slaves, synchronised_slaves, syncing_slaves, refused, consumers, policy, exclusive`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := ctl(t, f.client, tc.args...)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if out != tc.wantStdout {
				t.Errorf("stdout:\ngot  %q\nwant %q", out, tc.wantStdout)
			}
			if !strings.Contains(errOut, tc.wantStderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.wantStderr, errOut)
			}
		})
	}
	// The usage error was found before the proxy was asked.
	if _, _, listings := fake.calls(); len(listings) != len(tests)-1 {
		t.Errorf("engine listed %d times (%q), want %d: once per run but the refused one", len(listings), listings, len(tests)-1)
	}
}

func TestCtlSyncQueue(t *testing.T) {
	fake := newFakeQueues()
	on := newFixture(t, WithQueues(fake))
	off := newFixture(t)
	tests := []ctlCase{
		{"sync_queue", on.client, []string{"sync_queue", "orders"}, 0, "Synchronising queue 'orders' in vhost '/' ...\n", ""},
		{"sync_queue in a vhost", on.client, []string{"sync_queue", "-p", "prod", "jobs & tasks"}, 0, "Synchronising queue 'jobs & tasks' in vhost 'prod' ...\n", ""},
		{"cancel_sync_queue", on.client, []string{"cancel_sync_queue", "orders"}, 0, "Stopping synchronising queue 'orders' in vhost '/' ...\n", ""},
		{"quiet", on.client, []string{"sync_queue", "-q", "orders"}, 0, "", ""},
		{"unknown queue", on.client, []string{"sync_queue", "nope"}, ExitDataErr, "Synchronising queue 'nope' in vhost '/' ...\n",
			"Error: queue 'nope' in vhost '/' not found"},
		{"unknown queue, cancel", on.client, []string{"cancel_sync_queue", "-p", "prod", "orders"}, ExitDataErr, "Stopping synchronising queue 'orders' in vhost 'prod' ...\n",
			"Error: queue 'orders' in vhost 'prod' not found"},
		{"no name", on.client, []string{"sync_queue"}, ExitUsage, "", "expected 1 argument(s), found 0"},
		{"two names", on.client, []string{"cancel_sync_queue", "a", "b"}, ExitUsage, "", "expected 1 argument(s), found 2"},
		{"mirroring off: sync", off.client, []string{"sync_queue", "-q", "orders"}, ExitDataErr, "", "Error: mirroring is off: the proxy has one backend"},
		{"mirroring off: cancel", off.client, []string{"cancel_sync_queue", "-q", "orders"}, ExitDataErr, "", "Error: mirroring is off: the proxy has one backend"},
		{"mirroring off: list", off.client, []string{"list_queues", "-q"}, ExitDataErr, "", "Error: mirroring is off: the proxy has one backend"},
	}
	runCtlCases(t, tests)
	syncs, cancels, _ := fake.calls()
	wantSyncs := []mirror.QueueID{{VHost: "/", Name: "orders"}, {VHost: "prod", Name: "jobs & tasks"}, {VHost: "/", Name: "orders"}, {VHost: "/", Name: "nope"}}
	if !slices.Equal(syncs, wantSyncs) {
		t.Errorf("engine's SyncQueue calls: got %v, want %v", syncs, wantSyncs)
	}
	wantCancels := []mirror.QueueID{{VHost: "/", Name: "orders"}, {VHost: "prod", Name: "orders"}}
	if !slices.Equal(cancels, wantCancels) {
		t.Errorf("engine's CancelSyncQueue calls: got %v, want %v", cancels, wantCancels)
	}
}

// TestCtlQueueHelp checks that help lists the queue commands and that
// list_queues' help names every column and the default.
func TestCtlQueueHelp(t *testing.T) {
	f := newFixture(t)
	_, out, _ := ctl(t, f.client, "help")
	for _, want := range []string{
		"  list_queues             lists queues with their master, slaves and synchronised slaves\n",
		"  sync_queue              synchronises a mirrored queue's unsynchronised slaves\n",
		"  cancel_sync_queue       stops a synchronisation in progress\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
	_, out, _ = ctl(t, f.client, "list_queues", "--help")
	for _, c := range queueColumns.columns {
		if !strings.Contains(out, "\n  "+c.name+" ") {
			t.Errorf("list_queues --help does not describe column %s:\n%s", c.name, out)
		}
	}
	if want := "Default: name messages master slaves synchronised_slaves."; !strings.Contains(out, want) {
		t.Errorf("list_queues --help lacks %q:\n%s", want, out)
	}
}

// TestCtlSyncQueueWait checks sync_queue --wait: it returns once every
// slave is synchronised, and says how far the sync got when --timeout runs
// out first.
func TestCtlSyncQueueWait(t *testing.T) {
	tests := []struct {
		name       string
		syncPolls  int // 0: never synchronised
		args       []string
		code       int
		wantStderr string
		wantPolls  int // listings at least
	}{
		{"synchronised after three polls", 3, []string{"sync_queue", "--wait", "orders"}, 0, "", 3},
		{"already synchronised", 1, []string{"sync_queue", "--wait", "-p", "prod", "jobs & tasks"}, 0, "", 1},
		{"timeout", 0, []string{"sync_queue", "--wait", "--timeout", "500ms", "orders"}, ExitTempFail,
			"Error: queue 'orders' in vhost '/': 1 of 2 slaves synchronised [rabbit3] when ctl stopped waiting (context deadline exceeded)", 1},
		{"unknown queue", 1, []string{"sync_queue", "--wait", "nope"}, ExitDataErr, "Error: queue 'nope' in vhost '/' not found", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFakeQueues()
			fake.syncPolls = tc.syncPolls
			f := newFixture(t, WithQueues(fake))
			code, out, errOut := ctl(t, f.client, tc.args...)
			if code != tc.code {
				t.Errorf("exit code: got %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if !strings.HasPrefix(out, "Synchronising queue '") {
				t.Errorf("stdout: got %q, want the banner", out)
			}
			if !strings.Contains(errOut, tc.wantStderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.wantStderr, errOut)
			}
			if _, _, listings := fake.calls(); len(listings) < tc.wantPolls || (tc.code == 0 && len(listings) != tc.wantPolls) {
				t.Errorf("listings: got %d, want %d (polls until synchronised, none after)", len(listings), tc.wantPolls)
			}
			fake.mu.Lock()
			asked := slices.Contains(fake.unacked, true)
			fake.mu.Unlock()
			if asked {
				t.Errorf("a poll of --wait asked for the unacknowledged counts, which it never shows")
			}
		})
	}
}

// TestCtlSyncQueueWaitQueueGone checks that --wait stops when the queue is
// deleted during the sync, instead of waiting for a timeout.
func TestCtlSyncQueueWaitQueueGone(t *testing.T) {
	fake := newFakeQueues()
	f := newFixture(t, WithQueues(fake))
	if err := f.client.SyncQueue(context.Background(), mirror.QueueID{VHost: "/", Name: "orders"}); err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	fake.queues["/"] = fake.queues["/"][1:] // orders is first
	fake.mu.Unlock()
	err := waitSynchronised(context.Background(), f.client, mirror.QueueID{VHost: "/", Name: "orders"}, time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "queue 'orders' in vhost '/': the queue is gone") {
		t.Errorf("got %v, want the queue is gone", err)
	}
}
