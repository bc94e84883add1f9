package integration

// The helpers of the mirrored-queue acceptance tests (mirror_*_test.go): a proxy served by
// the real binary in front of all three nodes of the shared cluster, what `ctl list_queues`
// says, what each broker holds (asked directly with rabbitmqctl, never through the proxy),
// and publishers and consumers that count what they did.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// mirrorBackends are the logical names of the shared cluster's nodes, which are also the
// backend names in every mirror test's config, in the order the config lists them.
func mirrorBackends() []string {
	var names []string
	for _, n := range cluster.Nodes() {
		names = append(names, n.Name)
	}
	return names
}

// mirrorFailoverGrace is failover_grace in mirrorConfigYAML, above its 2 s default: these
// tests are about the steady state, and on two cores shared by three brokers, rabbitmqctl
// and parallel tests a probe answered late made the proxy count a live backend down (seen:
// "no answer to a probe within 2s").
const mirrorFailoverGrace = 10 * time.Second

// mirrorConfigYAML is a config for a proxy in front of every node of the shared cluster,
// named as the nodes are, with its state in stateDir; extra is appended (policies:...).
func mirrorConfigYAML(t testing.TB, stateDir, extra string) string {
	var yaml strings.Builder
	fmt.Fprintf(&yaml, "listen:\n  amqp: %s\n  admin: %s\nstate_dir: %s\nshutdown_timeout: 5s\nfailover_grace: %v\nlog:\n  format: text\nbackends:\n",
		cliFreeAddr(t), cliFreeAddr(t), stateDir, mirrorFailoverGrace)
	for _, n := range cluster.Nodes() {
		fmt.Fprintf(&yaml, "  - name: %s\n    url: %q\n", n.Name, n.URL())
	}
	yaml.WriteString(extra)
	return yaml.String()
}

// startMirrorProxy writes a config for the three nodes (plus extra YAML) and runs `amqp-mirror
// serve` with it; the process is killed when the test ends.
func startMirrorProxy(t testing.TB, extra string) *cliProxy {
	t.Helper()
	path := filepath.Join(t.TempDir(), "amqp-mirror.yaml")
	cliWriteFile(t, path, mirrorConfigYAML(t, filepath.Join(t.TempDir(), "state"), extra))
	return newCLI(t).serve(t, path, nil)
}

// mirrorPolicyYAML is a policies: section with one policy for the queues matching pattern.
func mirrorPolicyYAML(name, pattern string, definition map[string]any) string {
	encoded, err := json.Marshal(definition) // JSON is YAML
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf("policies:\n  - name: %s\n    pattern: %q\n    apply-to: queues\n    definition: %s\n", name, pattern, encoded)
}

// exactly is a pattern that matches the named queues and no other.
func exactly(queues ...string) string {
	quoted := make([]string, len(queues))
	for i, q := range queues {
		quoted[i] = regexp.QuoteMeta(q)
	}
	return "^(" + strings.Join(quoted, "|") + ")$"
}

// setPolicy runs `ctl set_policy --apply-to queues NAME PATTERN DEFINITION` and requires it
// to succeed.
func setPolicy(t testing.TB, p *cliProxy, name, pattern, definition string) {
	t.Helper()
	p.ctl(t, "set_policy", "--apply-to", "queues", name, pattern, definition).check(t, 0, nil, nil, nil)
}

// ---- ctl list_queues.

// mirrorColumns are every column of `ctl list_queues`.
var mirrorColumns = []string{"name", "master", "slaves", "synchronised_slaves", "messages_ready", "consumers", "policy"}

// queueRow is one row of `ctl list_queues --formatter json`, every column asked for.
type queueRow struct {
	Name               string
	Master             string
	Slaves             []string // join order
	SynchronisedSlaves []string
	Messages           int
	Consumers          int
	Policy             string
}

func (r queueRow) String() string {
	return fmt.Sprintf("%s: master %s, slaves %v, synchronised %v, %d messages, %d consumers, policy %q",
		r.Name, r.Master, r.Slaves, r.SynchronisedSlaves, r.Messages, r.Consumers, r.Policy)
}

// copies is the master followed by the slaves.
func (r queueRow) copies() []string { return append([]string{r.Master}, r.Slaves...) }

// listQueues runs `ctl list_queues --formatter json` with every column and returns the rows
// by queue name. A failed run is an error, so that it can be awaited.
func listQueues(t testing.TB, p *cliProxy) (map[string]queueRow, error) {
	t.Helper()
	result := p.ctl(t, append([]string{"list_queues", "--formatter", "json"}, mirrorColumns...)...)
	if result.code != 0 {
		return nil, fmt.Errorf("ctl list_queues: exit code %d\nstdout:\n%s\nstderr:\n%s", result.code, result.stdout, result.stderr)
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(result.stdout), &raw); err != nil {
		return nil, fmt.Errorf("ctl list_queues --formatter json printed no JSON array of objects: %v\n%s", err, result.stdout)
	}
	rows := map[string]queueRow{}
	for _, object := range raw {
		var row queueRow
		var errs []error
		for _, column := range mirrorColumns {
			if _, ok := object[column]; !ok {
				errs = append(errs, fmt.Errorf("no column %q", column))
			}
		}
		errs = append(errs,
			json.Unmarshal(object["name"], &row.Name),
			json.Unmarshal(object["master"], &row.Master),
			decodeNames(object["slaves"], &row.Slaves),
			decodeNames(object["synchronised_slaves"], &row.SynchronisedSlaves),
			decodeCount(object["messages_ready"], &row.Messages),
			decodeCount(object["consumers"], &row.Consumers),
			decodePolicy(object["policy"], &row.Policy))
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("ctl list_queues: row %s: %w", mustJSON(object), err)
		}
		rows[row.Name] = row
	}
	return rows, nil
}

// queueStatus is listQueues' row of one queue; an error when the run failed or the proxy
// does not list the queue.
func queueStatus(t testing.TB, p *cliProxy, queue string) (queueRow, error) {
	t.Helper()
	rows, err := listQueues(t, p)
	if err != nil {
		return queueRow{}, err
	}
	row, ok := rows[queue]
	if !ok {
		return queueRow{}, fmt.Errorf("ctl list_queues does not list %s; it lists %v", queue, slices.Sorted(mapKeys(rows)))
	}
	return row, nil
}

// decodeNames reads a list of backend names: a JSON array, or a string as rabbitmqctl
// prints a list ("[rabbit1, rabbit2]", or the names separated by commas or spaces).
// awaitSynchronised waits up to timeout until queue has slaves synchronised
// slaves, as ctl list_queues shows it, and returns that row.
func awaitSynchronised(t testing.TB, p *cliProxy, queue string, slaves int, timeout time.Duration) queueRow {
	t.Helper()
	var synchronised queueRow
	awaitCondition(t, timeout, func() error {
		row, err := queueStatus(t, p, queue)
		if err != nil {
			return err
		}
		if len(row.SynchronisedSlaves) != slaves {
			return fmt.Errorf("%v; want %d synchronised slaves", row, slaves)
		}
		synchronised = row
		return nil
	})
	return synchronised
}

func decodeNames(raw json.RawMessage, names *[]string) error {
	if len(raw) == 0 || string(raw) == "null" {
		*names = nil
		return nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil {
		*names = list
		return nil
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return fmt.Errorf("a list of backends: %s", raw)
	}
	*names = strings.FieldsFunc(strings.Trim(text, "[]"), func(r rune) bool { return r == ',' || r == ' ' })
	return nil
}

// decodeCount reads a count printed as a JSON number or a numeric string; null (the master's
// broker could not be asked) is -1.
func decodeCount(raw json.RawMessage, count *int) error {
	if string(raw) == "null" {
		*count = -1
		return nil
	}
	if err := json.Unmarshal(raw, count); err == nil {
		return nil
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return fmt.Errorf("a count: %s", raw)
	}
	n, err := strconv.Atoi(text)
	if err != nil {
		return fmt.Errorf("a count: %s", raw)
	}
	*count = n
	return nil
}

// decodePolicy reads a policy name; null and a missing value mean none.
func decodePolicy(raw json.RawMessage, policy *string) error {
	if len(raw) == 0 || string(raw) == "null" {
		*policy = ""
		return nil
	}
	return json.Unmarshal(raw, policy)
}

func mustJSON(v any) string {
	encoded, _ := json.Marshal(v)
	return string(encoded)
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// ---- What each broker holds, asked directly.

// brokerMessages asks every node of the shared cluster, with rabbitmqctl list_queues (three
// runs at once), how many messages each queue holds there: ready plus unacknowledged, so
// that slave messages a trimmer holds count. The result maps queue → node → messages; a node
// without a copy of a queue is absent from its map.
func brokerMessages(ctx context.Context, queues ...string) (map[string]map[string]int, error) {
	nodes := cluster.Nodes()
	results := make([]map[string]int, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { results[i], errs[i] = nodeMessages(ctx, n) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	held := map[string]map[string]int{}
	for _, q := range queues {
		held[q] = map[string]int{}
		for i, n := range nodes {
			if count, ok := results[i][q]; ok {
				held[q][n.Name] = count
			}
		}
	}
	return held, nil
}

// nodeMessages is every queue of vhost / on n with its messages (ready + unacknowledged).
func nodeMessages(ctx context.Context, n *localbroker.Node) (map[string]int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	queues, err := n.Queues(ctx, "/")
	if err != nil {
		return nil, err
	}
	messages := make(map[string]int, len(queues))
	for name, counts := range queues {
		messages[name] = counts.Messages
	}
	return messages, nil
}

// onEvery is the wanted placement "count messages on each of these nodes and on no other".
func onEvery(count int, nodes ...string) map[string]int {
	want := map[string]int{}
	for _, n := range nodes {
		want[n] = count
	}
	return want
}

// awaitHeld waits until the brokers hold exactly want (queue → node → messages): the copies
// on the nodes named and on no other, each with its count.
func awaitHeld(t testing.TB, timeout time.Duration, want map[string]map[string]int) {
	t.Helper()
	queues := slices.Sorted(mapKeys(want))
	awaitCondition(t, timeout, func() error {
		held, err := brokerMessages(t.Context(), queues...)
		if err != nil {
			return err
		}
		var errs []error
		for _, q := range queues {
			if got := held[q]; !mapsEqual(got, want[q]) {
				errs = append(errs, fmt.Errorf("%s: brokers hold %v (node: messages), want %v", q, got, want[q]))
			}
		}
		return errors.Join(errs...)
	})
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// awaitCondition is testutil.Eventually for conditions that take seconds to ask
// (rabbitmqctl): it fails the test with f's last error if f has not returned nil within
// timeout, and makes no further call once the deadline has passed.
func awaitCondition(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	if err := poll(t.Context(), timeout, f); err != nil {
		t.Fatalf("not so within %v: %v", timeout, err)
	}
}

// poll calls f every 100 ms, or after as long as f took if that is longer, until it returns
// nil, and returns f's last error once timeout has passed or ctx has ended.
func poll(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		began := time.Now()
		err := f()
		if err == nil {
			return nil
		}
		// A check that runs rabbitmqctl boots an Erlang VM, most of a second of CPU; polled
		// every 100 ms it would keep a core busy, and starve the brokers and the other
		// tests on a two-core machine.
		select {
		case <-time.After(max(100*time.Millisecond, time.Since(began))):
		case <-deadline.C:
			return err
		case <-ctx.Done():
			return fmt.Errorf("%w (%v)", err, ctx.Err())
		}
	}
}

// ---- Queues through the proxy.

// declareMirrored declares a queue through the proxy on a channel of its own and deletes
// it through the proxy when the test ends (see deleteThroughProxy).
func declareMirrored(t testing.TB, p *cliProxy, conn *amqp.Connection, queue string, durable bool, args amqp.Table) amqp.Queue {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	declared, err := ch.QueueDeclare(queue, durable, false, false, false, args)
	if err != nil {
		t.Fatalf("queue.declare %s through the proxy: %v", queue, err)
	}
	deleteThroughProxy(t, p, queue)
	return declared
}

// deleteThroughProxy deletes the queues through the proxy when the test ends, before the
// proxy is stopped (cleanups run last registered first), then makes sure no copy is left on
// any broker: a copy left is an error of the proxy, reported and then deleted directly so
// that it cannot disturb another test.
func deleteThroughProxy(t testing.TB, p *cliProxy, queues ...string) {
	t.Helper()
	t.Cleanup(func() {
		if !p.exited() {
			if conn, err := amqp.Dial(p.url("guest", "guest")); err != nil {
				t.Errorf("cleanup: dial the proxy: %v", err)
			} else {
				for _, q := range queues {
					if err := deleteQueue(conn, q); err != nil {
						t.Errorf("cleanup: queue.delete %s through the proxy: %v", q, err)
					}
				}
				conn.Close()
			}
		}
		removeLeftovers(t, queues...)
	})
}

// deleteQueue deletes a queue on a channel of its own (a failure closes only that channel).
func deleteQueue(conn *amqp.Connection, queue string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDelete(queue, false, false, false)
	return err
}

// removeLeftovers waits a little for the queues to be gone from every node, then deletes
// what is left directly and reports it. It runs in a cleanup, after t.Context() has ended.
func removeLeftovers(t testing.TB, queues ...string) {
	var left map[*localbroker.Node][]string
	poll(context.Background(), 10*time.Second, func() error {
		left = map[*localbroker.Node][]string{}
		for _, n := range cluster.Nodes() {
			for _, q := range queues {
				if exists, err := queueExists(n, q); err != nil || exists {
					left[n] = append(left[n], q)
				}
			}
		}
		if len(left) > 0 {
			return errors.New("copies left")
		}
		return nil
	})
	for n, names := range left {
		t.Errorf("cleanup: %v still on %s after queue.delete through the proxy; deleting directly", names, n.Name)
		if conn, err := amqp.Dial(n.URL()); err == nil {
			for _, q := range names {
				deleteQueue(conn, q)
			}
			conn.Close()
		}
	}
}

// queueExists asks n directly, with a passive queue.declare.
func queueExists(n *localbroker.Node, queue string) (bool, error) {
	conn, err := amqp.Dial(n.URL())
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil); err != nil {
		if code, _ := amqpReply(err); code == amqp.NotFound {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// ---- Publishing and consuming.

// publishConfirmed publishes count messages to the queue on a channel of its own in confirm
// mode, at most window unconfirmed at a time, and fails the test unless every one is acked.
func publishConfirmed(t testing.TB, conn *amqp.Connection, queue string, count int, message func(i int) amqp.Publishing) {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	if err := publishWindow(testContext(t, 3*time.Minute), ch, "", queue, count, 1000, message, nil); err != nil {
		t.Fatalf("publishing %d messages to %s: %v", count, queue, err)
	}
}

// publishWindow puts ch in confirm mode and publishes count messages (count < 0: until ctx
// ends), at most window unconfirmed at a time. confirmed, when not nil, counts the acks as
// they come. It returns once every publish is confirmed, or the first nack or error.
func publishWindow(ctx context.Context, ch *amqp.Channel, exchange, key string, count, window int, message func(i int) amqp.Publishing, confirmed *counter) error {
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm.select: %w", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
	outstanding := 0
	awaitOne := func(ctx context.Context) error {
		select {
		case c, ok := <-confirms:
			if !ok {
				return fmt.Errorf("channel closed with %d publishes unconfirmed", outstanding)
			}
			if !c.Ack {
				return fmt.Errorf("publish %d nacked", c.DeliveryTag)
			}
			outstanding--
			if confirmed != nil {
				confirmed.add(1)
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%d publishes unconfirmed: %w", outstanding, ctx.Err())
		}
	}
	for i := 0; count < 0 || i < count; i++ {
		if ctx.Err() != nil {
			if count < 0 {
				break
			}
			return ctx.Err()
		}
		if outstanding == window {
			if err := awaitOne(ctx); err != nil {
				if count < 0 && ctx.Err() != nil {
					break
				}
				return err
			}
		}
		// A publish is asynchronous; the context only bounds its write.
		if err := ch.PublishWithContext(context.WithoutCancel(ctx), exchange, key, false, false, message(i)); err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
		outstanding++
	}
	// What was published is waited for even after ctx ended: its confirms are counted.
	drain, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for outstanding > 0 {
		if err := awaitOne(drain); err != nil {
			return err
		}
	}
	return nil
}

// consumeAcked consumes count messages from the queue on a channel of its own with manual
// acks (prefetch 200), acks each, and returns them in delivery order. The consumer is
// cancelled and the channel closed before it returns, so deliveries beyond count go back to
// the queue.
func consumeAcked(t testing.TB, conn *amqp.Connection, queue string, count int) []amqp.Delivery {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	if err := ch.Qos(200, 0, false); err != nil {
		t.Fatalf("basic.qos: %v", err)
	}
	deliveries, err := ch.Consume(queue, "consume-acked", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume %s: %v", queue, err)
	}
	got := make([]amqp.Delivery, 0, count)
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for len(got) < count {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("consuming %s: the channel closed after %d of %d deliveries", queue, len(got), count)
			}
			if err := d.Ack(false); err != nil {
				t.Fatalf("ack: %v", err)
			}
			got = append(got, d)
		case <-timeout.C:
			t.Fatalf("consuming %s: %d of %d deliveries within a minute", queue, len(got), count)
		}
	}
	if err := ch.Cancel("consume-acked", false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	return got
}

// counter is a count shared by a load goroutine and the test.
type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) add(n int) {
	c.mu.Lock()
	c.n += n
	c.mu.Unlock()
}

func (c *counter) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// bodyIndex reads the number at the end of a body such as "message 17".
func bodyIndex(t testing.TB, body []byte) int {
	t.Helper()
	fields := strings.Fields(string(body))
	if len(fields) == 0 {
		t.Fatalf("body %q has no index", body)
	}
	i, err := strconv.Atoi(fields[len(fields)-1])
	if err != nil {
		t.Fatalf("body %q has no index: %v", body, err)
	}
	return i
}
