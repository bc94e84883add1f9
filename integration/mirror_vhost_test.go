package integration

// Mirroring outside vhost /: the proxy's own work (copies, trimming, syncs, adoption,
// inspection) happens in the vhost of the queue concerned, and a vhost that a backend lacks
// is named, not silent.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// TestMirrorInOtherVHosts: two vhosts besides /, one of them on two of the three brokers
// only. In the vhost every broker has, a queue is mirrored, trimmed, adopted and synchronised
// as in /, apart from a queue of the same name in /. In the vhost one broker lacks, the
// queue has a copy on each broker that has it, every publish is confirmed from those, and
// `ctl list_queues`, a metric and a log line name the broker that refuses; once the vhost
// exists there too, the policy places a copy there and synchronises it. A failover in a
// vhost other than / hands the consumer what the master held.
func TestMirrorInOtherVHosts(t *testing.T) {
	nodes := cluster.Nodes()
	const prod, partial = "prod", "partial"
	for _, n := range nodes {
		addVHost(t, n, prod)
	}
	for _, n := range nodes[:2] {
		addVHost(t, n, partial)
	}
	queue, rootQueue := "orders", queueName(t)
	policies := fmt.Sprintf("policies:\n"+
		"  - {name: ha-prod, vhost: %q, pattern: '^orders', apply-to: queues, definition: {ha-mode: all, ha-sync-mode: automatic}}\n"+
		"  - {name: ha-partial, vhost: %q, pattern: '^orders', apply-to: queues, definition: {ha-mode: all, ha-sync-mode: automatic}}\n"+
		"  - {name: ha-root, vhost: /, pattern: %q, apply-to: queues, definition: {ha-mode: all}}\n",
		prod, partial, exactly(rootQueue))
	p := startMirrorProxy(t, policies)
	backends := mirrorBackends()

	// The same name in / holds other messages and is left alone.
	root := dialURL(t, p.url("guest", "guest"))
	declareMirrored(t, p, root, rootQueue, true, nil)
	publishConfirmed(t, root, rootQueue, 300, persistent)

	conn := dialURL(t, p.vhostURL(prod))
	declareIn(t, p, conn, prod, queue)
	publishConfirmed(t, conn, queue, 1000, persistent)
	awaitHeldIn(t, 2*time.Minute, prod, map[string]map[string]int{queue: onEvery(1000, backends...)})
	consumeAcked(t, conn, queue, 600)
	awaitHeldIn(t, 2*time.Minute, prod, map[string]map[string]int{queue: onEvery(400, backends...)})
	awaitHeldIn(t, 2*time.Minute, "/", map[string]map[string]int{rootQueue: onEvery(300, backends...)})
	row := vhostQueue(t, p, prod, queue)
	if !sameSet(append([]string{row.Master}, row.Slaves...), backends) || !sameSet(row.SynchronisedSlaves, row.Slaves) || len(row.Refused) > 0 {
		t.Errorf("ctl list_queues -p %s: %+v, want copies on %v, every slave synchronised, none refused", prod, row, backends)
	}

	// Adoption: a queue found on one broker in the vhost becomes mirrored, its messages
	// copied to the new slaves.
	adopted := "orders-adopted"
	direct := dialURL(t, vhostURLOf(nodes[0], prod))
	publishDirect(t, direct, adopted, 5)
	ch := openChannel(t, conn)
	if _, err := ch.QueueDeclarePassive(adopted, true, false, false, false, nil); err != nil {
		t.Fatalf("passive queue.declare %s through the proxy in %s: %v", adopted, prod, err)
	}
	ch.Close()
	deleteInOnCleanup(t, p, prod, adopted)
	awaitHeldIn(t, 2*time.Minute, prod, map[string]map[string]int{adopted: onEvery(5, backends...)})

	// The vhost the third broker lacks: copies on the two that have it, confirms from them.
	missing := nodes[2].Name
	pconn := dialURL(t, p.vhostURL(partial))
	declareIn(t, p, pconn, partial, queue)
	publishConfirmed(t, pconn, queue, 100, persistent)
	awaitHeldIn(t, 2*time.Minute, partial, map[string]map[string]int{queue: onEvery(100, backends[:2]...)})
	awaitCondition(t, time.Minute, func() error {
		row := vhostQueue(t, p, partial, queue)
		if !slices.Equal(row.Refused, []string{missing}) || slices.Contains(row.Slaves, missing) {
			return fmt.Errorf("ctl list_queues -p %s: %+v, want %s refused and no copy there", partial, row, missing)
		}
		return nil
	})
	p.awaitRecord(t, "the refused vhost", map[string]string{"backend": missing, "vhost": partial, "level": "ERROR"})
	want := fmt.Sprintf("amqp_mirror_backend_vhosts_refused{backend=%q} 1\n", missing)
	if body := scrapeMetrics(t, p); !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %q; got:\n%s", want, body)
	}

	addVHost(t, nodes[2], partial)
	awaitHeldIn(t, 2*time.Minute, partial, map[string]map[string]int{queue: onEvery(100, backends...)})
	awaitCondition(t, time.Minute, func() error {
		if row := vhostQueue(t, p, partial, queue); len(row.Refused) > 0 || !sameSet(append([]string{row.Master}, row.SynchronisedSlaves...), backends) {
			return fmt.Errorf("ctl list_queues -p %s: %+v, want every broker synchronised, none refused", partial, row)
		}
		return nil
	})

	// Failover in the vhost: the master's broker is killed, the oldest slave takes over,
	// and the consumer, on the connection it had, gets the rest.
	master := node(t, vhostQueue(t, p, prod, queue).Master)
	if err := master.Kill(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			restartNode(t, master)
		}
	}()
	awaitCondition(t, time.Minute, func() error {
		row := vhostQueue(t, p, prod, queue)
		if row.Master == master.Name {
			return fmt.Errorf("ctl list_queues -p %s: %+v, want a master other than the killed %s", prod, row, master.Name)
		}
		t.Logf("%s killed, %s promoted", master.Name, row.Master)
		return nil
	})
	consumeAcked(t, conn, queue, 400)
	restartNode(t, master)
	restarted = true
	awaitHeldIn(t, 2*time.Minute, prod, map[string]map[string]int{queue: onEvery(0, backends...)})
}

func persistent(i int) amqp.Publishing {
	return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: fmt.Appendf(nil, "message %d", i)}
}

// addVHost adds vhost on n with every permission for guest, and deletes it (and what it
// holds) when the test ends.
func addVHost(t testing.TB, n *localbroker.Node, vhost string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	name := erlangBinary(vhost)
	if _, err := n.Eval(ctx, fmt.Sprintf(`ok = rabbit_vhost:add(%s, <<"amqp-mirror-tests">>), `+
		`ok = rabbit_auth_backend_internal:set_permissions(<<"guest">>, %s, <<".*">>, <<".*">>, <<".*">>, <<"amqp-mirror-tests">>), "ok"`, name, name)); err != nil {
		t.Fatalf("adding vhost %s on %s: %v", vhost, n.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := n.Eval(ctx, fmt.Sprintf(`rabbit_vhost:delete(%s, <<"amqp-mirror-tests">>), "ok"`, name)); err != nil {
			t.Errorf("cleanup: deleting vhost %s on %s: %v", vhost, n.Name, err)
		}
	})
}

// erlangBinary is s as an Erlang binary literal.
func erlangBinary(s string) string {
	var b strings.Builder
	b.WriteString("<<")
	for i, c := range []byte(s) {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d", c)
	}
	b.WriteString(">>")
	return b.String()
}

// vhostURL is the proxy's URL for guest in vhost.
func (p *cliProxy) vhostURL(vhost string) string {
	return fmt.Sprintf("amqp://guest:guest@%s/%s", p.amqpAddr, url.PathEscape(vhost))
}

// vhostURLOf is n's URL in vhost.
func vhostURLOf(n *localbroker.Node, vhost string) string {
	return strings.TrimSuffix(n.URL(), "/") + "/" + url.PathEscape(vhost)
}

// declareIn declares a durable queue through the proxy's connection conn to vhost, and
// deletes it through the proxy when the test ends.
func declareIn(t testing.TB, p *cliProxy, conn *amqp.Connection, vhost, queue string) {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("queue.declare %s in %s through the proxy: %v", queue, vhost, err)
	}
	deleteInOnCleanup(t, p, vhost, queue)
}

// deleteInOnCleanup deletes queue in vhost through the proxy when the test ends.
func deleteInOnCleanup(t testing.TB, p *cliProxy, vhost, queue string) {
	t.Cleanup(func() {
		if c, err := amqp.Dial(p.vhostURL(vhost)); err == nil {
			if err := deleteQueue(c, queue); err != nil {
				t.Errorf("cleanup: queue.delete %s in %s through the proxy: %v", queue, vhost, err)
			}
			c.Close()
		}
	})
}

// publishDirect publishes count persistent messages with confirms to queue, declared
// durable first, on a connection to a broker directly.
func publishDirect(t testing.TB, conn *amqp.Connection, queue string, count int) {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("queue.declare %s on a broker directly: %v", queue, err)
	}
	if err := publishWindow(testContext(t, time.Minute), ch, "", queue, count, 100, persistent, nil); err != nil {
		t.Fatalf("publishing to %s on a broker directly: %v", queue, err)
	}
}

// vhostRow is a row of `ctl list_queues -p VHOST --formatter json`.
type vhostRow struct {
	Master             string   `json:"master"`
	Slaves             []string `json:"slaves"`
	SynchronisedSlaves []string `json:"synchronised_slaves"`
	Refused            []string `json:"refused"`
}

// vhostQueue is queue's row in `ctl list_queues -p vhost`; it fails the test when the
// proxy does not list it.
func vhostQueue(t testing.TB, p *cliProxy, vhost, queue string) vhostRow {
	t.Helper()
	result := p.ctl(t, "list_queues", "-p", vhost, "--formatter", "json", "name", "master", "slaves", "synchronised_slaves", "refused")
	if result.code != 0 {
		t.Fatalf("ctl list_queues -p %s: exit code %d\n%s%s", vhost, result.code, result.stdout, result.stderr)
	}
	var rows []struct {
		Name string `json:"name"`
		vhostRow
	}
	if err := json.Unmarshal([]byte(result.stdout), &rows); err != nil {
		t.Fatalf("ctl list_queues -p %s --formatter json: %v\n%s", vhost, err, result.stdout)
	}
	for _, r := range rows {
		if r.Name == queue {
			return r.vhostRow
		}
	}
	t.Fatalf("ctl list_queues -p %s does not list %s:\n%s", vhost, queue, result.stdout)
	return vhostRow{}
}

// scrapeMetrics is the proxy's /metrics.
func scrapeMetrics(t testing.TB, p *cliProxy) string {
	t.Helper()
	resp, err := http.Get("http://" + p.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s %v", resp.Status, err)
	}
	return string(body)
}

// awaitHeldIn is awaitHeld for the queues of vhost.
func awaitHeldIn(t testing.TB, timeout time.Duration, vhost string, want map[string]map[string]int) {
	t.Helper()
	awaitCondition(t, timeout, func() error {
		var errs []error
		for q, wantQ := range want {
			got := map[string]int{}
			for _, n := range cluster.Nodes() {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				queues, err := n.Queues(ctx, vhost)
				cancel()
				if err != nil && !strings.Contains(err.Error(), "no_such_vhost") {
					return err
				}
				if c, ok := queues[q]; ok {
					got[n.Name] = c.Messages
				}
			}
			if !mapsEqual(got, wantQ) {
				errs = append(errs, fmt.Errorf("%s in %s: brokers hold %v (node: messages), want %v", q, vhost, got, wantQ))
			}
		}
		return errors.Join(errs...)
	})
}
