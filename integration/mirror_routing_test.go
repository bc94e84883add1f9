package integration

// Acceptance tests of publishes to named exchanges through a proxy in front of the three
// shared nodes. Exchanges and exchange-to-exchange bindings exist on every broker, a queue's
// bindings only where it has a copy; what a publish reaches is asked of each broker directly.
// TestExchangeRoutingAlternateExchangeCopiesStayEqual is the case where routing differs
// between brokers and an alternate exchange catches what a broker routed nowhere;
// TestExchangeRoutingReachesEveryKindOfDestination covers the destinations a publish must go
// on reaching however the proxy chooses the brokers it sends it to.
//
// Placement is by the end of a queue's name (routingPoliciesYAML): "-everywhere" is a copy on
// every backend, "-on-NAME" one copy on backend NAME; any other name, one copy where the
// proxy's master locator puts it.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// TestExchangeRoutingAlternateExchangeCopiesStayEqual: a direct exchange whose one bound queue
// has a single copy, with an alternate exchange feeding a queue mirrored on every backend.
// Every copy of the mirrored queue holds exactly the messages the exchange routed nowhere, and
// the single copy exactly those it routed: a broker without a copy of the bound queue must not
// hand the routed messages to the alternate exchange.
func TestExchangeRoutingAlternateExchangeCopiesStayEqual(t *testing.T) {
	t.Parallel()
	const routed, unrouted = 200, 50
	prefix := queueName(t)
	alternate, exchange := prefix+"-alternate", prefix+"-exchange"
	caught, bound := prefix+"-caught-everywhere", prefix+"-bound"
	backends := mirrorBackends()
	p := startMirrorProxy(t, routingPoliciesYAML())
	conn := dialURL(t, p.url("guest", "guest"))
	ch := openChannel(t, conn)
	defer ch.Close()

	declareExchange(t, p, ch, alternate, amqp.ExchangeFanout, nil)
	declareMirrored(t, p, conn, caught, false, nil)
	bindQueue(t, ch, caught, "", alternate, nil)
	declareExchange(t, p, ch, exchange, amqp.ExchangeDirect, amqp.Table{"alternate-exchange": alternate})
	declareMirrored(t, p, conn, bound, false, nil)
	bindQueue(t, ch, bound, "k", exchange, nil)
	row, err := queueStatus(t, p, bound)
	if err != nil {
		t.Fatal(err)
	}
	if row.Master == "" || len(row.Slaves) != 0 {
		t.Fatalf("ctl list_queues: %v; want one copy of %s (no policy matches it)", row, bound)
	}

	publishToExchange(t, conn, exchange, "k", routed, func(i int) amqp.Publishing {
		return amqp.Publishing{Body: fmt.Appendf(nil, "routed %d", i)}
	})
	publishToExchange(t, conn, exchange, "nomatch", unrouted, func(i int) amqp.Publishing {
		return amqp.Publishing{Body: fmt.Appendf(nil, "unrouted %d", i)}
	})
	awaitHeld(t, 30*time.Second, map[string]map[string]int{
		caught: onEvery(unrouted, backends...),
		bound:  onEvery(routed, row.Master),
	})

	// The master of the mirrored queue delivers what the alternate exchange caught, each once.
	seen := map[int]int{}
	for _, d := range consumeAcked(t, conn, caught, unrouted) {
		if !strings.HasPrefix(string(d.Body), "unrouted ") {
			t.Errorf("%s delivered %q, which the exchange routed to %s, not to its alternate exchange", caught, d.Body, bound)
			continue
		}
		seen[bodyIndex(t, d.Body)]++
	}
	for i := range unrouted {
		if seen[i] != 1 {
			t.Errorf("%s delivered \"unrouted %d\" %d times, want once", caught, i, seen[i])
		}
	}
	awaitHeld(t, 30*time.Second, map[string]map[string]int{
		caught: onEvery(0, backends...),
		bound:  onEvery(routed, row.Master),
	})
}

// TestExchangeRoutingReachesEveryKindOfDestination: publishes through the proxy reach exactly
// the queues RabbitMQ routes them to, wherever their copies are, through every kind of
// exchange and binding a client can make; and what routes nowhere, or where the proxy cannot
// know the routing, still behaves as on a broker.
func TestExchangeRoutingReachesEveryKindOfDestination(t *testing.T) {
	t.Parallel()
	backends := mirrorBackends()
	p := startMirrorProxy(t, routingPoliciesYAML())
	conn := dialURL(t, p.url("guest", "guest"))

	// Subtests run one after another: each asks the brokers with rabbitmqctl, three Erlang
	// VMs at a time, and more at once starve the brokers on a two-core machine.
	t.Run("topic exchange to queues on different backends", func(t *testing.T) {
		prefix := queueName(t)
		exchange := prefix + "-topic"
		ch := openChannel(t, conn)
		defer ch.Close()
		declareExchange(t, p, ch, exchange, amqp.ExchangeTopic, nil)
		star := declareOn(t, p, conn, prefix, "a-star", backends[0])
		endsZ := declareOn(t, p, conn, prefix, "hash-z", backends[1])
		hash := declareOn(t, p, conn, prefix, "a-hash", backends[2])
		bindQueue(t, ch, star, "a.*", exchange, nil)
		bindQueue(t, ch, endsZ, "#.z", exchange, nil)
		bindQueue(t, ch, hash, "a.#", exchange, nil)
		publishAndCheck(t, conn, exchange, []routedPublish{
			{name: "a.b", key: "a.b", count: 3, to: []string{star, hash}},
			{name: "a.b.z", key: "a.b.z", count: 2, to: []string{endsZ, hash}},
			{name: "x.z", key: "x.z", count: 2, to: []string{endsZ}},
			{name: "a", key: "a", count: 1, to: []string{hash}},
			{name: "a.z", key: "a.z", count: 2, to: []string{star, endsZ, hash}},
			{name: "b.c", key: "b.c", count: 2},
		})
	})

	t.Run("exchange to exchange", func(t *testing.T) {
		prefix := queueName(t)
		source, destination := prefix+"-direct", prefix+"-topic"
		ch := openChannel(t, conn)
		defer ch.Close()
		declareExchange(t, p, ch, source, amqp.ExchangeDirect, nil)
		declareExchange(t, p, ch, destination, amqp.ExchangeTopic, nil)
		if err := ch.ExchangeBind(destination, "orders.eu", source, false, nil); err != nil {
			t.Fatalf("exchange.bind %s to %s: %v", destination, source, err)
		}
		throughTopic := declareOn(t, p, conn, prefix, "through-topic", backends[1])
		onSource := declareOn(t, p, conn, prefix, "bound-to-source", backends[2])
		bindQueue(t, ch, throughTopic, "orders.*", destination, nil)
		bindQueue(t, ch, onSource, "orders.eu", source, nil)
		publishAndCheck(t, conn, source, []routedPublish{
			{name: "orders.eu", key: "orders.eu", count: 3, to: []string{throughTopic, onSource}},
			// The topic pattern would match, but the direct exchange binds only orders.eu.
			{name: "orders.us", key: "orders.us", count: 2},
		})
	})

	t.Run("headers exchange", func(t *testing.T) {
		prefix := queueName(t)
		exchange := prefix + "-headers"
		ch := openChannel(t, conn)
		defer ch.Close()
		declareExchange(t, p, ch, exchange, amqp.ExchangeHeaders, nil)
		all := declareOn(t, p, conn, prefix, "match-all", backends[0])
		anyOf := declareOn(t, p, conn, prefix, "match-any", backends[2])
		bindQueue(t, ch, all, "", exchange, amqp.Table{"x-match": "all", "color": "red", "size": "big"})
		bindQueue(t, ch, anyOf, "", exchange, amqp.Table{"x-match": "any", "color": "red", "size": "big"})
		publishAndCheck(t, conn, exchange, []routedPublish{
			{name: "red-big", headers: amqp.Table{"color": "red", "size": "big"}, count: 2, to: []string{all, anyOf}},
			{name: "red-big-round", headers: amqp.Table{"color": "red", "size": "big", "shape": "round"}, count: 1, to: []string{all, anyOf}},
			{name: "red-small", headers: amqp.Table{"color": "red", "size": "small"}, count: 2, to: []string{anyOf}},
			{name: "blue-big", headers: amqp.Table{"color": "blue", "size": "big"}, count: 1, to: []string{anyOf}},
			{name: "blue-small", headers: amqp.Table{"color": "blue", "size": "small"}, count: 1},
			{name: "no-headers", count: 2},
		})
	})

	t.Run("CC and BCC headers", func(t *testing.T) {
		prefix := queueName(t)
		exchange := prefix + "-direct"
		ch := openChannel(t, conn)
		defer ch.Close()
		declareExchange(t, p, ch, exchange, amqp.ExchangeDirect, nil)
		one := declareOn(t, p, conn, prefix, "one", backends[0])
		two := declareOn(t, p, conn, prefix, "two", backends[1])
		three := declareOn(t, p, conn, prefix, "three", backends[2])
		bindQueue(t, ch, one, "one", exchange, nil)
		bindQueue(t, ch, two, "two", exchange, nil)
		bindQueue(t, ch, three, "three", exchange, nil)
		// publishAndCheck also checks that no delivery carries BCC.
		publishAndCheck(t, conn, exchange, []routedPublish{
			{name: "cc-and-bcc", key: "one", headers: amqp.Table{"CC": []any{"two"}, "BCC": []any{"three"}}, count: 2, to: []string{one, two, three}},
			{name: "cc-only", key: "none", headers: amqp.Table{"CC": []any{"two"}}, count: 1, to: []string{two}},
			{name: "bcc-only", key: "none", headers: amqp.Table{"BCC": []any{"three"}}, count: 1, to: []string{three}},
			{name: "key-only", key: "one", count: 1, to: []string{one}},
		})
	})

	t.Run("exclusive server-named reply queue", func(t *testing.T) {
		const replies = 5
		prefix := queueName(t)
		exchange := prefix + "-replies"
		client := dialURL(t, p.url("guest", "guest"))
		ch := openChannel(t, client)
		defer ch.Close()
		declareExchange(t, p, ch, exchange, amqp.ExchangeDirect, nil)
		replyQueue, err := ch.QueueDeclare("", false, false, true, false, nil)
		if err != nil {
			t.Fatalf("queue.declare of a server-named exclusive queue through the proxy: %v", err)
		}
		bindQueue(t, ch, replyQueue.Name, replyQueue.Name, exchange, nil)
		// The server answers on a connection of its own, which does not know the queue.
		publishToExchange(t, conn, exchange, replyQueue.Name, replies, func(i int) amqp.Publishing {
			return amqp.Publishing{CorrelationId: fmt.Sprint(i), Body: fmt.Appendf(nil, "reply %d", i)}
		})
		got := bodies(getAll(t, client, replyQueue.Name))
		if want := numbered("reply", replies); !slices.Equal(got, want) {
			t.Errorf("%s holds %q, want %q", replyQueue.Name, got, want)
		}
	})

	t.Run("exchange and binding made on one broker first", func(t *testing.T) {
		const messages = 4
		prefix := queueName(t)
		exchange, queue := prefix+"-direct", prefix+"-made-on-the-broker"
		owner := node(t, backends[2])
		direct := dial(t, owner)
		directChannel := openChannel(t, direct)
		defer directChannel.Close()
		if err := directChannel.ExchangeDeclare(exchange, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
			t.Fatalf("exchange.declare on %s directly: %v", owner.Name, err)
		}
		if _, err := directChannel.QueueDeclare(queue, false, false, false, false, nil); err != nil {
			t.Fatalf("queue.declare on %s directly: %v", owner.Name, err)
		}
		t.Cleanup(func() { deleteDirectly(t, owner, queue) })
		bindQueue(t, directChannel, queue, "f", exchange, nil)

		ch := openChannel(t, conn)
		defer ch.Close()
		declareExchange(t, p, ch, exchange, amqp.ExchangeDirect, nil)
		publishToExchange(t, conn, exchange, "f", messages, func(i int) amqp.Publishing {
			return amqp.Publishing{Body: fmt.Appendf(nil, "made first %d", i)}
		})
		awaitHeld(t, 30*time.Second, map[string]map[string]int{queue: onEvery(messages, owner.Name)})
	})

	t.Run("mandatory publish routed nowhere returns once", func(t *testing.T) {
		const each = 5
		prefix := queueName(t)
		exchange := prefix + "-direct"
		ch := openChannel(t, conn)
		defer ch.Close()
		declareExchange(t, p, ch, exchange, amqp.ExchangeDirect, nil)
		// A routed publish reaches a broker that routes it and two that would return it.
		routed := declareOn(t, p, conn, prefix, "routed", backends[2])
		bindQueue(t, ch, routed, "somewhere", exchange, nil)

		returns := ch.NotifyReturn(make(chan amqp.Return, 4*each))
		if err := ch.Confirm(false); err != nil {
			t.Fatalf("confirm.select: %v", err)
		}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 2*each))
		for i := range each {
			for _, publish := range []struct{ key, body string }{{"nowhere", "unrouted"}, {"somewhere", "routed"}} {
				message := amqp.Publishing{Body: fmt.Appendf(nil, "%s %d", publish.body, i)}
				if err := ch.PublishWithContext(t.Context(), exchange, publish.key, true, false, message); err != nil {
					t.Fatalf("basic.publish: %v", err)
				}
			}
		}
		for range 2 * each {
			select {
			case c := <-confirms:
				if !c.Ack {
					t.Fatalf("publish %d nacked", c.DeliveryTag)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("not every publish confirmed within 30s")
			}
		}

		var got []string
		await := time.After(30 * time.Second)
		for len(got) < each {
			select {
			case r := <-returns:
				got = append(got, describeReturn(r))
			case <-await:
				t.Fatalf("%d basic.return within 30s, want %d: %q", len(got), each, got)
			}
		}
		// A second return of a message would come from another broker, soon after the first.
		select {
		case r := <-returns:
			got = append(got, describeReturn(r))
		case <-time.After(2 * time.Second):
		}
		slices.Sort(got)
		var want []string
		for _, body := range numbered("unrouted", each) {
			want = append(want, fmt.Sprintf("312 NO_ROUTE %s nowhere %q", exchange, body))
		}
		if !slices.Equal(got, want) {
			t.Errorf("basic.return (code, text, exchange, key, body):\n got %q\nwant %q", got, want)
		}
		if got := bodies(getAll(t, conn, routed)); !slices.Equal(got, numbered("routed", each)) {
			t.Errorf("%s holds %q, want %q", routed, got, numbered("routed", each))
		}
	})
}

// ---- Helpers of the routing tests.

// routingPoliciesYAML is a policies: section that places queues by the end of their names:
// "-everywhere" a copy on every backend (ha-mode all), "-on-NAME" one copy on backend NAME
// (ha-mode nodes).
func routingPoliciesYAML() string {
	var yaml strings.Builder
	yaml.WriteString(mirrorPolicyYAML("everywhere", "-everywhere$", map[string]any{"ha-mode": "all", "ha-sync-mode": "automatic"}))
	for _, backend := range mirrorBackends() {
		entry := mirrorPolicyYAML("on-"+backend, "-on-"+regexp.QuoteMeta(backend)+"$", map[string]any{"ha-mode": "nodes", "ha-params": []string{backend}})
		yaml.WriteString(strings.TrimPrefix(entry, "policies:\n"))
	}
	return yaml.String()
}

// declareOn declares, through the proxy, a queue named for routingPoliciesYAML to have its one
// copy on backend, and deletes it when the test ends.
func declareOn(t testing.TB, p *cliProxy, conn *amqp.Connection, prefix, label, backend string) string {
	t.Helper()
	queue := fmt.Sprintf("%s-%s-on-%s", prefix, label, backend)
	declareMirrored(t, p, conn, queue, false, nil)
	return queue
}

// declareExchange declares an exchange through the proxy and deletes it when the test ends,
// through the proxy and then from every broker where it is left (removeExchangeLeftovers).
func declareExchange(t testing.TB, p *cliProxy, ch *amqp.Channel, exchange, kind string, args amqp.Table) {
	t.Helper()
	if err := ch.ExchangeDeclare(exchange, kind, false, false, false, false, args); err != nil {
		t.Fatalf("exchange.declare %s (%s) through the proxy: %v", exchange, kind, err)
	}
	t.Cleanup(func() {
		if !p.exited() {
			if conn, err := amqp.Dial(p.url("guest", "guest")); err != nil {
				t.Errorf("cleanup: dial the proxy: %v", err)
			} else {
				if err := deleteExchange(conn, exchange); err != nil {
					t.Errorf("cleanup: exchange.delete %s through the proxy: %v", exchange, err)
				}
				conn.Close()
			}
		}
		removeExchangeLeftovers(t, exchange)
	})
}

// deleteExchange deletes an exchange on a channel of its own.
func deleteExchange(conn *amqp.Connection, exchange string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return ch.ExchangeDelete(exchange, false, false)
}

// removeExchangeLeftovers is removeLeftovers for an exchange: exchanges live on every broker,
// and one still on a broker after exchange.delete through the proxy is reported, then deleted
// directly.
func removeExchangeLeftovers(t testing.TB, exchange string) {
	var left []*localbroker.Node
	poll(context.Background(), 10*time.Second, func() error {
		left = nil
		for _, n := range cluster.Nodes() {
			if exists, err := exchangeExists(n, exchange); err != nil || exists {
				left = append(left, n)
			}
		}
		if len(left) > 0 {
			return errors.New("exchanges left")
		}
		return nil
	})
	for _, n := range left {
		t.Errorf("cleanup: exchange %s still on %s after exchange.delete through the proxy; deleting directly", exchange, n.Name)
		if conn, err := amqp.Dial(n.URL()); err == nil {
			deleteExchange(conn, exchange)
			conn.Close()
		}
	}
}

// exchangeExists asks n directly, with a passive exchange.declare.
func exchangeExists(n *localbroker.Node, exchange string) (bool, error) {
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
	if err := ch.ExchangeDeclarePassive(exchange, amqp.ExchangeDirect, false, false, false, false, nil); err != nil {
		if code, _ := amqpReply(err); code == amqp.NotFound {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// deleteDirectly deletes a queue made on n past the proxy; it runs in a cleanup.
func deleteDirectly(t testing.TB, n *localbroker.Node, queue string) {
	conn, err := amqp.Dial(n.URL())
	if err != nil {
		t.Errorf("cleanup: dial %s: %v", n.Name, err)
		return
	}
	defer conn.Close()
	if err := deleteQueue(conn, queue); err != nil {
		t.Errorf("cleanup: queue.delete %s on %s: %v", queue, n.Name, err)
	}
}

// bindQueue binds queue to exchange with key and arguments, and fails the test if it cannot.
func bindQueue(t testing.TB, ch *amqp.Channel, queue, key, exchange string, args amqp.Table) {
	t.Helper()
	if err := ch.QueueBind(queue, key, exchange, false, args); err != nil {
		t.Fatalf("queue.bind %s to %s with key %q and %v: %v", queue, exchange, key, args, err)
	}
}

// publishToExchange publishes count messages to the exchange with the routing key, with
// confirms, on a channel of its own, and fails the test unless every one is acked.
func publishToExchange(t testing.TB, conn *amqp.Connection, exchange, key string, count int, message func(i int) amqp.Publishing) {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	if err := publishWindow(testContext(t, time.Minute), ch, exchange, key, count, 1000, message, nil); err != nil {
		t.Fatalf("publishing %d messages to %s with key %q: %v", count, exchange, key, err)
	}
}

// routedPublish is a row of a routing case: count messages published with the key and
// headers, with bodies "NAME 0", "NAME 1"..., that RabbitMQ routes to the queues in to, once
// each (none: routed nowhere).
type routedPublish struct {
	name    string
	key     string
	headers amqp.Table
	count   int
	to      []string
}

// publishAndCheck publishes the rows to the exchange through the proxy, then checks that
// every queue the rows name holds exactly the messages routed to it, on the broker of its
// one copy and on no other (asked directly), and that taking them through the proxy gives
// each routed body once, with the headers it was published with but BCC (RabbitMQ removes
// it). Every queue must have been declared with declareOn.
func publishAndCheck(t *testing.T, conn *amqp.Connection, exchange string, rows []routedPublish) {
	t.Helper()
	wantBodies := map[string][]string{}
	wantHeaders := map[string]amqp.Table{} // body → headers delivered
	var queues []string
	for _, r := range rows {
		publishToExchange(t, conn, exchange, r.key, r.count, func(i int) amqp.Publishing {
			return amqp.Publishing{Headers: r.headers, Body: fmt.Appendf(nil, "%s %d", r.name, i)}
		})
		delivered := amqp.Table{}
		for k, v := range r.headers {
			if k != "BCC" {
				delivered[k] = v
			}
		}
		for _, body := range numbered(r.name, r.count) {
			wantHeaders[body] = delivered
		}
		for _, q := range r.to {
			if _, ok := wantBodies[q]; !ok {
				queues = append(queues, q)
			}
			wantBodies[q] = append(wantBodies[q], numbered(r.name, r.count)...)
		}
	}
	held := map[string]map[string]int{}
	for _, q := range queues {
		at := strings.LastIndex(q, "-on-")
		if at < 0 {
			t.Fatalf("queue %s was not declared with declareOn", q)
		}
		held[q] = onEvery(len(wantBodies[q]), q[at+len("-on-"):])
	}
	awaitHeld(t, 30*time.Second, held)

	for _, q := range queues {
		deliveries := getAll(t, conn, q)
		want := slices.Sorted(slices.Values(wantBodies[q]))
		if got := bodies(deliveries); !slices.Equal(got, want) {
			t.Errorf("%s holds %q, want %q", q, got, want)
		}
		for _, d := range deliveries {
			if want := wantHeaders[string(d.Body)]; !(len(d.Headers) == 0 && len(want) == 0) && !reflect.DeepEqual(d.Headers, want) {
				t.Errorf("%s delivered %q with headers %v, want %v", q, d.Body, d.Headers, want)
			}
		}
	}
}

// getAll takes every message of the queue through the proxy, with basic.get and no ack, until
// the queue answers empty.
func getAll(t testing.TB, conn *amqp.Connection, queue string) []amqp.Delivery {
	t.Helper()
	ch := openChannel(t, conn)
	defer ch.Close()
	var got []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("basic.get %s through the proxy: %v", queue, err)
		}
		if !ok {
			return got
		}
		got = append(got, d)
	}
}

// bodies are the deliveries' bodies, sorted.
func bodies(deliveries []amqp.Delivery) []string {
	out := make([]string, len(deliveries))
	for i, d := range deliveries {
		out[i] = string(d.Body)
	}
	slices.Sort(out)
	return out
}

// numbered is "NAME 0" to "NAME count-1", sorted.
func numbered(name string, count int) []string {
	out := make([]string, count)
	for i := range out {
		out[i] = fmt.Sprintf("%s %d", name, i)
	}
	slices.Sort(out)
	return out
}

// describeReturn is what the tests compare of a basic.return.
func describeReturn(r amqp.Return) string {
	return fmt.Sprintf("%d %s %s %s %q", r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey, r.Body)
}
