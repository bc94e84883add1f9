package integration

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/integration/testutil"
)

// TestCtlQueuesListsUnmirroredQueues: list_queues lists the queues clients
// declared through the proxy whether they are mirrored or not, as
// rabbitmqctl lists every queue. Exclusive queues (one named under an
// ha-all policy, one server-named) are listed on the broker that holds
// them, the connection's home, with no slaves, no policy and exclusive
// true; a server-named queue that is not exclusive and a queue no policy
// matches are listed with no slaves either. A deleted exclusive queue, and
// the exclusive queues of a closed connection, are no longer listed.
func TestCtlQueuesListsUnmirroredQueues(t *testing.T) {
	base := queueName(t)
	named, plain := base+"-exclusive", base+"-plain"
	p := startMirrorProxy(t, mirrorPolicyYAML("ctl-all", exactly(named), map[string]any{"ha-mode": "all"}))
	home := cluster.Nodes()[0].Name // every backend is up: the first is every connection's home

	owner, err := amqp.Dial(p.url("guest", "guest"))
	if err != nil {
		t.Fatalf("dial through the proxy: %v", err)
	}
	t.Cleanup(func() { owner.Close() })
	ch := openChannel(t, owner)
	if _, err := ch.QueueDeclare(named, false, false, true, false, nil); err != nil {
		t.Fatalf("declare the exclusive queue %s: %v", named, err)
	}
	serverNamed, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatalf("declare a server-named exclusive queue: %v", err)
	}
	shared, err := ch.QueueDeclare("", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("declare a server-named queue: %v", err)
	}
	other := dialURL(t, p.url("guest", "guest"))
	t.Cleanup(func() { ctlDeleteEverywhere(t, other, shared.Name) })
	if _, err := ch.QueueDeclare(plain, false, false, false, false, nil); err != nil {
		t.Fatalf("declare %s: %v", plain, err)
	}
	t.Cleanup(func() { ctlDeleteEverywhere(t, other, plain) })
	publishConfirmed(t, owner, plain, 1, persistentBody("one"))

	// With the default columns, which say nothing of exclusivity: listed, on
	// one backend.
	rows := ctlQueueRows(t, p)
	for _, queue := range []string{named, serverNamed.Name, shared.Name} {
		want := map[string]any{"name": queue, "messages": nil, "master": home, "slaves": []any{}, "synchronised_slaves": []any{}}
		if queue == shared.Name {
			want["messages"] = 0.0
		}
		if got, ok := rows[queue]; !ok || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("list_queues row of %s:\n got %v\nwant %v", queue, got, want)
		}
	}
	if row, ok := rows[plain]; !ok || fmt.Sprint(row["slaves"]) != "[]" || row["messages"] != 1.0 {
		t.Errorf("list_queues row of the unmirrored %s: got %v, want it with 1 message and no slaves", plain, row)
	}
	held, err := brokerMessages(testContext(t, time.Minute), named, serverNamed.Name)
	if err != nil {
		t.Fatalf("rabbitmqctl list_queues: %v", err)
	}
	for _, queue := range []string{named, serverNamed.Name} {
		if got := slices.Sorted(maps.Keys(held[queue])); !slices.Equal(got, []string{home}) {
			t.Errorf("rabbitmqctl list_queues finds %s on %v, want %s alone", queue, got, home)
		}
	}

	// Every column: the exclusive ones say so, and match no ha policy.
	columns := []string{"name", "master", "slaves", "consumers", "policy", "exclusive"}
	rows = ctlQueueRows(t, p, columns...)
	wantRows := map[string]map[string]any{
		named:            {"name": named, "master": home, "slaves": []any{}, "consumers": nil, "policy": "", "exclusive": true},
		serverNamed.Name: {"name": serverNamed.Name, "master": home, "slaves": []any{}, "consumers": nil, "policy": "", "exclusive": true},
		shared.Name:      {"name": shared.Name, "master": home, "slaves": []any{}, "consumers": 0.0, "policy": "", "exclusive": false},
	}
	for queue, want := range wantRows {
		if got := rows[queue]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("list_queues %v row of %s:\n got %v\nwant %v", columns, queue, got, want)
		}
	}
	if got := rows[plain]["exclusive"]; got != false {
		t.Errorf("list_queues says %s is exclusive: %v", plain, got)
	}

	if _, err := ch.QueueDelete(named, false, false, false); err != nil {
		t.Fatalf("delete %s: %v", named, err)
	}
	if _, listed := ctlQueueRows(t, p)[named]; listed {
		t.Errorf("list_queues lists %s after its deletion", named)
	}
	if err := owner.Close(); err != nil {
		t.Fatalf("close the owner's connection: %v", err)
	}
	// The proxy ends the connection, and the broker deletes the queue, a
	// moment after the client's close-ok.
	testutil.Eventually(t, 10*time.Second, func() error {
		if _, listed := ctlQueueRows(t, p)[serverNamed.Name]; listed {
			return fmt.Errorf("list_queues lists %s after its connection closed", serverNamed.Name)
		}
		return nil
	})
}

// ctlQueueRows runs `ctl list_queues --formatter json` with the columns
// (the default without) and returns the rows by queue name.
func ctlQueueRows(t *testing.T, p *cliProxy, columns ...string) map[string]map[string]any {
	t.Helper()
	r := p.ctl(t, append([]string{"list_queues", "--formatter", "json"}, columns...)...)
	r.check(t, 0, nil, nil, nil)
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("list_queues --formatter json: %v\n%s", err, r.stdout)
	}
	rows := make(map[string]map[string]any, len(list))
	for _, row := range list {
		name, _ := row["name"].(string)
		rows[name] = row
	}
	return rows
}
