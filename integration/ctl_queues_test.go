package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// The ctl queue commands end to end: `amqp-mirror serve` answers them from its engine when it
// has several backends, and says mirroring is off when it has one.

// TestCtlQueuesWithoutMirroring checks that a proxy with one backend, which runs no engine,
// answers list_queues, sync_queue and cancel_sync_queue with a clear refusal, and that a bad
// column is a usage error before the proxy is asked.
func TestCtlQueuesWithoutMirroring(t *testing.T) {
	cli := newCLI(t)
	p := cli.serveConfig(t, newCLIConfig(t, cluster.Nodes()[0]))
	const off = "Error: mirroring is off: the proxy has one backend"
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr []string
	}{
		{"list_queues", []string{"list_queues"}, 65, []string{off}},
		{"list_queues json", []string{"list_queues", "--formatter", "json", "name", "master"}, 65, []string{off}},
		{"sync_queue", []string{"sync_queue", "-p", "/", "orders"}, 65, []string{off}},
		{"cancel_sync_queue", []string{"cancel_sync_queue", "orders"}, 65, []string{off}},
		{"unknown column", []string{"list_queues", "name", "pids"}, 64,
			[]string{`unknown column(s) "pids": valid columns are name, messages, messages_ready, messages_unacknowledged, master, slaves, synchronised_slaves, syncing_slaves, refused, consumers, policy, exclusive`}},
		{"no queue name", []string{"sync_queue"}, 64, []string{"expected 1 argument(s), found 0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := p.ctl(t, tc.args...)
			r.check(t, tc.code, nil, tc.wantErr, nil)
			if strings.Contains(strings.Join(tc.args, " "), "json") && r.stdout != "" {
				t.Errorf("--formatter json printed %q on a refusal, want nothing", r.stdout)
			}
		})
	}
	r := cli.run(t, nil, "help", "ctl")
	for _, line := range []string{"  list_queues ", "  sync_queue ", "  cancel_sync_queue "} {
		if !strings.Contains(r.stdout, line) {
			t.Errorf("help ctl lacks %q:\n%s", line, r.stdout)
		}
	}
}

// TestCtlQueuesMirrored checks list_queues and sync_queue against the engine of a proxy in
// front of the three nodes: a queue declared under an ha-all policy is listed with its master
// and both other backends as synchronised slaves, in ring order after the master, in the
// table and in JSON; sync_queue of it succeeds and of an unknown queue is refused.
func TestCtlQueuesMirrored(t *testing.T) {
	var backends []string
	var yaml strings.Builder
	fmt.Fprintf(&yaml, "listen:\n  amqp: %s\n  admin: %s\nstate_dir: %s\nshutdown_timeout: 5s\nlog:\n  format: text\nbackends:\n",
		cliFreeAddr(t), cliFreeAddr(t), filepath.Join(t.TempDir(), "state"))
	for _, n := range cluster.Nodes() {
		backends = append(backends, n.Name)
		fmt.Fprintf(&yaml, "  - name: %s\n    url: %q\n", n.Name, n.URL())
	}
	queue := queueName(t)
	fmt.Fprintf(&yaml, "policies:\n  - name: ctl-all\n    pattern: %q\n    apply-to: queues\n    definition: {ha-mode: all}\n", "^"+queue+"$")
	path := filepath.Join(t.TempDir(), "amqp-mirror.yaml")
	cliWriteFile(t, path, yaml.String())
	p := newCLI(t).serve(t, path, nil)

	conn, err := amqp.Dial(p.url("guest", "guest"))
	if err != nil {
		t.Fatalf("dial through the proxy: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch := openChannel(t, conn)
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatalf("queue.declare %s through the proxy: %v", queue, err)
	}
	t.Cleanup(func() { ctlDeleteEverywhere(t, conn, queue) })
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		confirmation, err := ch.PublishWithDeferredConfirmWithContext(testContext(t, 10*time.Second), "", queue, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)})
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		if ok, err := confirmation.WaitContext(testContext(t, 10*time.Second)); !ok || err != nil {
			t.Fatalf("publish %d: confirmed %v, %v", i, ok, err)
		}
	}

	// The table: the row's master is whichever backend placement chose; the slaves are the
	// two others in ring order after it, all synchronised (the queue was placed empty).
	var master string
	testutil.Eventually(t, 10*time.Second, func() error {
		r := p.ctl(t, "list_queues")
		if r.code != 0 {
			return fmt.Errorf("ctl list_queues: exit code %d, stderr %s", r.code, r.stderr)
		}
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if len(lines) < 2 || lines[0] != "Listing queues for vhost / ..." || lines[1] != "name\tmessages\tmaster\tslaves\tsynchronised_slaves" {
			return fmt.Errorf("ctl list_queues: no banner and header:\n%s", r.stdout)
		}
		for _, line := range lines[2:] {
			cells := strings.Split(line, "\t")
			if cells[0] != queue {
				continue
			}
			if len(cells) != 5 {
				return fmt.Errorf("row %q: %d cells, want 5", line, len(cells))
			}
			master = cells[2]
			slaves := "[" + strings.Join(ringAfter(backends, master), ", ") + "]"
			if want := strings.Join([]string{queue, "2", master, slaves, slaves}, "\t"); line != want {
				return fmt.Errorf("row:\n got %q\nwant %q", line, want)
			}
			return nil
		}
		return fmt.Errorf("ctl list_queues does not list %s:\n%s", queue, r.stdout)
	})

	// JSON, with rabbitmqctl's column names: keyed as asked, lists as arrays.
	r := p.ctl(t, "list_queues", "--formatter", "json", "name", "pid", "slave_pids", "consumers", "policy")
	r.check(t, 0, nil, nil, nil)
	var rows []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("list_queues --formatter json: %v\n%s", err, r.stdout)
	}
	i := slices.IndexFunc(rows, func(row map[string]any) bool { return row["name"] == queue })
	if i < 0 {
		t.Fatalf("list_queues --formatter json does not list %s:\n%s", queue, r.stdout)
	}
	var wantSlaves []any
	for _, b := range ringAfter(backends, master) {
		wantSlaves = append(wantSlaves, b)
	}
	want := map[string]any{"name": queue, "pid": master, "slave_pids": wantSlaves, "consumers": 0.0, "policy": "ctl-all"}
	if got := rows[i]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("list_queues --formatter json row:\n got %v\nwant %v", got, want)
	}

	// A message a client holds unacknowledged counts in messages, as rabbitmqctl counts it.
	counts := func(step string, messages, ready, unacked float64) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() error {
			r := p.ctl(t, "list_queues", "--formatter", "json", "name", "messages", "messages_ready", "messages_unacknowledged")
			if r.code != 0 {
				return fmt.Errorf("ctl list_queues: exit code %d, stderr %s", r.code, r.stderr)
			}
			var rows []map[string]any
			if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
				return fmt.Errorf("list_queues --formatter json: %v\n%s", err, r.stdout)
			}
			i := slices.IndexFunc(rows, func(row map[string]any) bool { return row["name"] == queue })
			if i < 0 {
				return fmt.Errorf("list_queues does not list %s:\n%s", queue, r.stdout)
			}
			want := map[string]any{"name": queue, "messages": messages, "messages_ready": ready, "messages_unacknowledged": unacked}
			if got := rows[i]; fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("%s: row\n got %v\nwant %v", step, got, want)
			}
			return nil
		})
	}
	counts("nothing delivered", 2, 2, 0)
	held := openChannel(t, conn)
	delivery, ok, err := held.Get(queue, false)
	if err != nil || !ok {
		t.Fatalf("basic.get through the proxy: %v, %v", ok, err)
	}
	counts("one delivered, not acknowledged", 2, 1, 1)
	if err := delivery.Ack(false); err != nil {
		t.Fatal(err)
	}
	counts("acknowledged", 1, 1, 0)

	p.ctl(t, "sync_queue", queue).check(t, 0, []string{"Synchronising queue '" + queue + "' in vhost '/' ...\n"}, nil, nil)
	p.ctl(t, "sync_queue", "--wait", "--timeout", "20s", queue).check(t, 0, nil, nil, nil)
	missing := queue + "-missing"
	p.ctl(t, "sync_queue", missing).check(t, 65, nil, []string{"Error: queue '" + missing + "' in vhost '/' not found"}, nil)
	p.ctl(t, "cancel_sync_queue", missing).check(t, 65, nil, []string{"Error: queue '" + missing + "' in vhost '/' not found"}, nil)
}

// ringAfter is the backends after master in config order, wrapping round: where placement
// puts the slaves of ha-mode all.
func ringAfter(backends []string, master string) []string {
	i := slices.Index(backends, master)
	if i < 0 {
		return nil
	}
	return append(slices.Clone(backends[i+1:]), backends[:i]...)
}

// ctlDeleteEverywhere deletes queue through the proxy, then on every node directly, so that
// a copy the proxy left cannot disturb another test.
func ctlDeleteEverywhere(t testing.TB, conn *amqp.Connection, queue string) {
	t.Helper()
	if ch, err := conn.Channel(); err == nil {
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			t.Errorf("queue.delete %s through the proxy: %v", queue, err)
		}
		ch.Close()
	}
	for _, n := range cluster.Nodes() {
		direct, err := amqp.Dial(n.URL())
		if err != nil {
			t.Errorf("dial %s: %v", n.Name, err)
			continue
		}
		if ch, err := direct.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
		}
		direct.Close()
	}
}
