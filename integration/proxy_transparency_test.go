package integration

// With one backend, no client may be able to tell the proxy from the broker. Each case below
// is one client session, run twice against the same node: directly, then through a proxy in
// front of it. The session writes what its client observed into a journal; the proxied
// journal must equal the direct one, line for line. Sessions also check what they can of
// the broker's own behaviour, so that two equally wrong journals cannot pass.

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/internal/localbroker"
)

// transparencyCase is one client session. run gets the URL to dial, the node's own or the
// proxy's, and records what the client observed in j.
type transparencyCase struct {
	name string
	node string // the broker; "" means rabbit1
	// setup, when set, prepares the broker once for both sessions.
	setup func(t *testing.T, n *localbroker.Node)
	run   func(t *testing.T, url string, j *journal)
}

// journal is what a client observed, one line per observation, in order.
type journal []string

func (j *journal) add(format string, args ...any) { *j = append(*j, fmt.Sprintf(format, args...)) }

// runTransparently runs every case directly and through a fresh proxy, and compares.
func runTransparently(t *testing.T, cases []transparencyCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := node(t, cmp.Or(c.node, "rabbit1"))
			if c.setup != nil {
				c.setup(t, n)
			}
			proxyURL, _ := startProxy(t, n)
			var direct, proxied journal
			start := time.Now()
			if !t.Run("direct", func(t *testing.T) { c.run(t, n.URL(), &direct) }) {
				return // a broken scenario says nothing about the proxy
			}
			directTook := time.Since(start)
			start = time.Now()
			t.Run("proxy", func(t *testing.T) { c.run(t, proxyURL, &proxied) })
			t.Logf("direct %v, through the proxy %v", directTook.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
			compareJournals(t, proxied, direct)
			// The same through a proxy mirroring every queue on the
			// three nodes (ha-mode all), with this node as home.
			mirroredURL, _ := startMirroredProxy(t, n, slog.LevelWarn)
			var mirrored journal
			t.Run("mirrored", func(t *testing.T) { c.run(t, mirroredURL, &mirrored) })
			compareJournals(t, mirrored, direct)
		})
	}
}

// compareJournals reports the first line where the proxied session differs from the direct one.
func compareJournals(t *testing.T, got, want journal) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	line := func(j journal) string {
		if i < len(j) {
			return j[i]
		}
		return "(journal ends)"
	}
	t.Errorf("through the proxy the client saw something else at line %d:\n got (proxy):  %s\nwant (direct): %s\n\nproxy journal:\n  %s\ndirect journal:\n  %s",
		i+1, line(got), line(want), strings.Join(got, "\n  "), strings.Join(want, "\n  "))
}

func TestTransparency(t *testing.T) {
	runTransparently(t, []transparencyCase{
		{name: "handshake PLAIN", run: observeHandshakePlain},
		{name: "handshake AMQPLAIN", run: observeHandshakeAMQPlain},
		{name: "tune limits asked by the client", run: observeTuneLimitsAskedByClient},
		{name: "tune limits set on the broker", node: "rabbit2", setup: lowerBrokerTuneLimits, run: observeBrokerTuneLimits},
		{name: "handshake refusals", run: observeHandshakeRefusals},
		{name: "channel and connection errors", run: observeChannelAndConnectionErrors},
		{name: "mandatory return comes before the confirm", run: observeReturnBeforeConfirm},
		{name: "server-sent basic.cancel", run: observeServerSentCancel},
		{name: "connection.blocked and unblocked", node: "rabbit2", run: observeBlockedAndUnblocked},
		{name: "10000 async publisher confirms", run: observeManyConfirms},
		{name: "publisher nacks from reject-publish", run: observePublisherNacks},
		{name: "transactions", run: observeTransactions},
		{name: "acks of many deliveries rolled back", run: observeManyAcksRolledBack},
		{name: "basic.get", run: observeBasicGet},
		{name: "basic.recover requeue", run: observeRecoverRequeue},
		{name: "prefetch", run: observePrefetch},
		{name: "direct reply-to", run: observeDirectReplyTo},
		{name: "large, empty and fully decorated messages", run: observeMessageContents},
		{name: "2047 channels on one connection", run: observeAllChannels},
		{name: "multiple acks, nack and reject", run: observeAcknowledgements},
		{name: "40 outstanding deliveries acked one by one", run: observeAcksOneByOne},
		{name: "two consumers with different ack modes on one channel", run: observeMixedConsumers},
	})
}

// Connection handshake.

// The capabilities RabbitMQ 3.10 announces in connection.start that clients act on.
var announcedCapabilities = []string{
	"publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
	"connection.blocked", "authentication_failure_close", "per_consumer_qos", "direct_reply_to",
}

func observeHandshakePlain(t *testing.T, url string, j *journal) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	recordHandshake(t, j, conn)
}

func observeHandshakeAMQPlain(t *testing.T, url string, j *journal) {
	conn := dialWithConfig(t, url, amqp.Config{
		SASL:      []amqp.Authentication{&amqp.AMQPlainAuth{Username: "guest", Password: "guest"}},
		Heartbeat: 10 * time.Second,
		Locale:    "en_US",
	})
	recordHandshake(t, j, conn)
}

func observeTuneLimitsAskedByClient(t *testing.T, url string, j *journal) {
	conn := dialWithConfig(t, url, amqp.Config{ChannelMax: 100, FrameSize: 8192, Heartbeat: 3 * time.Second})
	j.add("channel_max %d, frame_max %d, heartbeat %v", conn.Config.ChannelMax, conn.Config.FrameSize, conn.Config.Heartbeat)
	// A message larger than one 8 KiB frame crosses in several body frames.
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	body := bytes.Repeat([]byte("0123456789abcdef"), 2048)
	publishTo(t, ch, queue, amqp.Publishing{Body: body})
	message, ok, err := ch.Get(queue, true)
	j.add("get: found %v, %d bytes, same body %v, %s", ok, len(message.Body), bytes.Equal(message.Body, body), describeError(err))
}

// lowerBrokerTuneLimits lowers the limits the broker offers in connection.tune, which it
// reads for every new connection, until the test ends.
func lowerBrokerTuneLimits(t *testing.T, n *localbroker.Node) {
	previous, err := rabbitmqctlOutput("-n", n.ErlangName, "-q", "eval", `[begin {ok, Old} = application:get_env(rabbit, Key), `+
		`ok = application:set_env(rabbit, Key, New), {Key, Old} end `+
		`|| {Key, New} <- [{heartbeat, 30}, {channel_max, 100}, {frame_max, 65536}]].`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		restore := fmt.Sprintf("[application:set_env(rabbit, Key, Old) || {Key, Old} <- %s].", strings.TrimSpace(previous))
		if _, err := rabbitmqctlOutput("-n", n.ErlangName, "-q", "eval", restore); err != nil {
			t.Errorf("restoring the broker's tune limits: %v", err)
		}
	})
}

// observeBrokerTuneLimits asks for more than the lowered limits of the broker.
func observeBrokerTuneLimits(t *testing.T, url string, j *journal) {
	// amqp091-go takes the smaller of its heartbeat and the broker's.
	conn := dialWithConfig(t, url, amqp.Config{Heartbeat: 45 * time.Second, Locale: "en_US"})
	j.add("channel_max %d, frame_max %d, heartbeat %v", conn.Config.ChannelMax, conn.Config.FrameSize, conn.Config.Heartbeat)
}

func recordHandshake(t *testing.T, j *journal, conn *amqp.Connection) {
	t.Helper()
	j.add("protocol %d-%d, locales %v, mechanism %s", conn.Major, conn.Minor, conn.Locales, conn.Config.SASL[0].Mechanism())
	for _, line := range flattenTable("server property ", conn.Properties) {
		j.add("%s", line)
	}
	j.add("channel_max %d, frame_max %d, heartbeat %v", conn.Config.ChannelMax, conn.Config.FrameSize, conn.Config.Heartbeat)
	capabilities, _ := conn.Properties["capabilities"].(amqp.Table)
	for _, capability := range announcedCapabilities {
		if capabilities[capability] != true {
			t.Errorf("capability %s: got %v, want true", capability, capabilities[capability])
		}
	}
}

func observeHandshakeRefusals(t *testing.T, url string, j *journal) {
	wrongPassword := strings.Replace(url, "guest:guest@", "guest:wrong@", 1)
	// Each refused login costs three seconds: RabbitMQ delays its silent close. AMQPLAIN and
	// unknown users take the same path through the proxy as this one.
	attempts := []struct {
		name   string
		url    string
		config amqp.Config
	}{
		{"wrong password", wrongPassword, amqp.Config{}},
		{"unknown vhost", url + "no-such-vhost", amqp.Config{}},
	}
	for _, a := range attempts {
		conn, err := amqp.DialConfig(a.url, a.config)
		if err == nil {
			conn.Close()
		}
		j.add("%s: %s", a.name, describeError(err))
	}
}

// Errors.

func observeChannelAndConnectionErrors(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)

	ch := openChannel(t, conn)
	_, err := ch.QueueDeclarePassive("amqp-mirror-no-such-queue", false, false, false, false, nil)
	j.add("passive declare of a missing queue: %s", describeError(err))

	// The proxy answers an unknown delivery tag itself; its channel.close must read like the broker's.
	ch = openChannel(t, conn)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	j.add("ack of a tag never delivered: %s", describeError(ch.Ack(42, false)))
	j.add("channel closed with %s", describeError(awaitCloseNotice(t, closed)))

	ch = openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	j.add("a new channel after the errors works: declare %s", describeError(errorOnly(ch.QueueDeclarePassive(queue, false, true, true, false, nil))))

	connectionClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	err = ch.Publish("", queue, false, true, amqp.Publishing{Body: []byte("immediate")})
	j.add("publish with immediate: %s", describeError(err))
	j.add("connection closed with %s", describeError(awaitCloseNotice(t, connectionClosed)))
}

// Returns, cancels, flow control.

func observeReturnBeforeConfirm(t *testing.T, url string, j *journal) {
	ch := openChannel(t, dialURL(t, url))
	queue := declareSessionQueue(t, ch, nil)
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	// Unbuffered: amqp091-go hands over returns and confirms in the order they arrive, from
	// one goroutine, so the order they are received here is the order on the wire.
	returns := ch.NotifyReturn(make(chan amqp.Return))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	ctx := testContext(t, 10*time.Second)
	for _, target := range []struct{ name, key string }{
		{"unroutable", "nowhere-1"}, {"routable", queue}, {"unroutable again", "nowhere-2"},
	} {
		err := ch.PublishWithContext(ctx, "", target.key, true, false, amqp.Publishing{MessageId: target.name, Body: []byte(target.name)})
		if err != nil {
			t.Fatalf("publish %s: %v", target.name, err)
		}
		j.add("published %s, mandatory", target.name)
	await:
		for {
			select {
			case r := <-returns:
				j.add("basic.return %d %s, exchange %q, routing key %q, message id %q, body %q",
					r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey, r.MessageId, r.Body)
			case c := <-confirms:
				j.add("confirm %d, ack %v", c.DeliveryTag, c.Ack)
				break await
			case <-ctx.Done():
				t.Fatalf("no confirm for the %s publish", target.name)
			}
		}
	}
}

func observeServerSentCancel(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	cancels := ch.NotifyCancel(make(chan string, 1))
	deliveries, err := ch.Consume(queue, "transparency-consumer", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	deleted, err := openChannel(t, conn).QueueDelete(queue, false, false, false)
	j.add("queue deleted from another channel: %d messages, %s", deleted, describeError(err))
	select {
	case tag := <-cancels:
		j.add("basic.cancel from the server for consumer %q", tag)
	case <-time.After(10 * time.Second):
		t.Fatal("no basic.cancel from the server")
	}
	_, open := <-deliveries
	j.add("deliveries channel open: %v", open)
	j.add("cancelling the cancelled consumer: %s", describeError(ch.Cancel("transparency-consumer", false)))
	j.add("the channel still serves: %s", describeError(errorOnly(ch.QueueDeclare("", false, true, true, false, nil))))
}

// observeBlockedAndUnblocked raises a memory alarm on the node. RabbitMQ blocks a connection, and
// tells it so, only once it publishes while the alarm is on.
func observeBlockedAndUnblocked(t *testing.T, url string, j *journal) {
	n := node(t, "rabbit2")
	conn := dialURL(t, url)
	blockings := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)

	if err := setMemoryWatermark(n.ErlangName, "0.0000001"); err != nil {
		t.Fatal(err)
	}
	restored := false
	t.Cleanup(func() {
		if restored {
			return
		}
		if err := setMemoryWatermark(n.ErlangName, "0.4"); err != nil {
			t.Errorf("restoring the memory watermark: %v", err)
		}
	})
	if err := ch.Publish("", queue, false, false, amqp.Publishing{Body: []byte("while blocked")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	j.add("published during the alarm")
	j.add("%s", awaitBlocking(t, blockings))

	if err := setMemoryWatermark(n.ErlangName, "0.4"); err != nil {
		t.Fatal(err)
	}
	restored = true
	j.add("%s", awaitBlocking(t, blockings))
	inspected, err := ch.QueueDeclarePassive(queue, false, true, true, false, nil)
	j.add("after the alarm: %d messages in the queue, %s", inspected.Messages, describeError(err))
}

func setMemoryWatermark(erlangName, fraction string) error {
	_, err := rabbitmqctlOutput("-n", erlangName, "set_vm_memory_high_watermark", fraction)
	return err
}

// rabbitmqctlOutput runs a command against a harness node and returns its output. It does not
// take a test's context: it also runs in cleanups, after that context ended.
func rabbitmqctlOutput(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// /usr/sbin/rabbitmqctl would switch to the rabbitmq user and its cookie; the harness
	// nodes use the caller's.
	output, err := exec.CommandContext(ctx, "/usr/lib/rabbitmq/bin/rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, output)
	}
	return string(output), nil
}

func awaitBlocking(t *testing.T, blockings <-chan amqp.Blocking) string {
	t.Helper()
	select {
	case b := <-blockings:
		if b.Active {
			return fmt.Sprintf("connection.blocked %q", b.Reason)
		}
		return "connection.unblocked"
	case <-time.After(20 * time.Second):
		t.Fatal("no connection.blocked or connection.unblocked within 20s")
	}
	return ""
}

// Publisher confirms.

func observeManyConfirms(t *testing.T, url string, j *journal) {
	const count = 10_000
	conn, tap := dialTapped(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, count))
	ctx := testContext(t, 30*time.Second)
	for i := range count {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "%d", i)}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	acks := 0
	for range count {
		select {
		case c := <-confirms:
			if c.Ack {
				acks++
			}
		case <-ctx.Done():
			t.Fatalf("only %d confirms arrived", acks)
		}
	}
	j.add("amqp091-go: %d of %d publishes acked", acks, count)
	j.add("%s", tap.confirmCoverage(count))
	inspected, err := ch.QueueDeclarePassive(queue, false, true, true, false, nil)
	j.add("queue holds %d messages, %s", inspected.Messages, describeError(err))
}

// observePublisherNacks fills a queue that refuses publishes once it holds ten: its first ten
// publishes are acked, the rest nacked, on the wire in whatever grouping the broker chose.
func observePublisherNacks(t *testing.T, url string, j *journal) {
	const count, limit = 1000, 10
	conn, tap := dialTapped(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, amqp.Table{"x-max-length": int32(limit), "x-overflow": "reject-publish"})
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, count))
	for i := range count {
		if err := ch.Publish("", queue, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "%d", i)}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	var outcome []string
	for range count {
		select {
		case c := <-confirms:
			outcome = append(outcome, fmt.Sprintf("%d %v", c.DeliveryTag, c.Ack))
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d confirms arrived", len(outcome))
		}
	}
	j.add("amqp091-go: first %v, eleventh %v, last %v", outcome[0], outcome[limit], outcome[count-1])
	acked := 0
	for _, o := range outcome {
		if strings.HasSuffix(o, "true") {
			acked++
		}
	}
	j.add("amqp091-go: %d acked, %d nacked", acked, count-acked)
	j.add("%s", tap.confirmCoverage(count))
}

// Transactions.

func observeTransactions(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	observer := openChannel(t, conn)
	ready := func() int { return readyCount(t, observer, queue) }

	j.add("tx.select: %s", describeError(ch.Tx()))
	for i := range 3 {
		publishTo(t, ch, queue, amqp.Publishing{Body: fmt.Appendf(nil, "rolled back %d", i)})
	}
	j.add("rollback of 3 publishes: %s, %d ready", describeError(ch.TxRollback()), ready())
	for i := range 2 {
		publishTo(t, ch, queue, amqp.Publishing{Body: fmt.Appendf(nil, "committed %d", i)})
	}
	j.add("commit of 2 publishes: %s, %d ready", describeError(ch.TxCommit()), ready())

	first, _, err1 := ch.Get(queue, false)
	second, _, err2 := ch.Get(queue, false)
	j.add("got %q tag %d and %q tag %d: %s %s", first.Body, first.DeliveryTag, second.Body, second.DeliveryTag, describeError(err1), describeError(err2))
	j.add("ack both (multiple) in the transaction: %s", describeError(ch.Ack(second.DeliveryTag, true)))
	j.add("rollback: %s, %d ready", describeError(ch.TxRollback()), ready())
	// The rolled-back acks never happened: both deliveries are unacknowledged and can be
	// acked again, one by one.
	j.add("ack %d again: %s", first.DeliveryTag, describeError(ch.Ack(first.DeliveryTag, false)))
	j.add("ack %d again: %s", second.DeliveryTag, describeError(ch.Ack(second.DeliveryTag, false)))
	j.add("commit: %s", describeError(ch.TxCommit()))
	// Closing the channel would requeue whatever is still unacknowledged.
	j.add("channel close: %s, then %d ready", describeError(ch.Close()), ready())
}

// observeManyAcksRolledBack settles enough deliveries in a transaction for the proxy to
// compact its tag map before the rollback puts them back.
func observeManyAcksRolledBack(t *testing.T, url string, j *journal) {
	const count = 40
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	for i := range count {
		publishTo(t, ch, queue, amqp.Publishing{Body: fmt.Appendf(nil, "%d", i)})
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	for range count {
		receive(t, deliveries)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	ackUpTo := func(last int) error {
		for tag := 1; tag <= last; tag++ {
			if err := ch.Ack(uint64(tag), false); err != nil {
				return err
			}
		}
		return nil
	}
	j.add("tx.select: %s", describeError(ch.Tx()))
	j.add("ack 1 to 21: %s, rollback: %s", describeError(ackUpTo(21)), describeError(ch.TxRollback()))
	j.add("ack 1 to %d: %s, rollback: %s", count, describeError(ackUpTo(count)), describeError(ch.TxRollback()))
	j.add("ack 1 to %d: %s, commit: %s", count, describeError(ackUpTo(count)), describeError(ch.TxCommit()))
	recordChannelEnd(t, j, conn, ch, closed, queue)
}

// Consuming.

func observeBasicGet(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	get := func(what string, noAck bool) amqp.Delivery {
		d, ok, err := ch.Get(queue, noAck)
		if !ok || err != nil {
			j.add("%s: get-empty %v, %s", what, !ok, describeError(err))
			return d
		}
		j.add("%s: get-ok %q tag %d, redelivered %v, %d more in the queue, exchange %q",
			what, d.Body, d.DeliveryTag, d.Redelivered, d.MessageCount, d.Exchange)
		return d
	}
	get("empty queue", false)
	for i := 1; i <= 3; i++ {
		publishTo(t, ch, queue, amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)})
	}
	get("no-ack", true)
	d := get("with ack", false)
	j.add("ack: %s", describeError(d.Ack(false)))
	d = get("with ack", false)
	j.add("nack with requeue: %s", describeError(d.Nack(false, true)))
	d = get("again after requeue", false)
	j.add("ack: %s", describeError(d.Ack(false)))
	get("drained", false)
	j.add("channel close: %s, %d ready", describeError(ch.Close()), readyCount(t, openChannel(t, conn), queue))
}

func observeRecoverRequeue(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)
	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	for i := 1; i <= 3; i++ {
		publishTo(t, ch, queue, amqp.Publishing{Body: fmt.Appendf(nil, "m%d", i)})
	}
	deliveries, err := ch.Consume(queue, "recovering", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	record := func() {
		for range 3 {
			d := receive(t, deliveries)
			j.add("delivered %q tag %d, redelivered %v", d.Body, d.DeliveryTag, d.Redelivered)
		}
	}
	record()
	j.add("basic.recover requeue: %s", describeError(ch.Recover(true)))
	record()
	j.add("ack 5 multiple: %s", describeError(ch.Ack(5, true)))
	j.add("ack 6: %s", describeError(ch.Ack(6, false)))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	j.add("ack 1, a tag from before the recover: %s", describeError(ch.Ack(1, false)))
	j.add("channel closed with %s", describeError(awaitCloseNotice(t, closed)))
	j.add("%d ready after the channel closed", readyCount(t, openChannel(t, conn), queue))
}

func observePrefetch(t *testing.T, url string, j *journal) {
	conn := dialURL(t, url)
	observer := openChannel(t, conn)

	ch := openChannel(t, conn)
	queue := declareSessionQueue(t, ch, nil)
	j.add("qos prefetch 5: %s", describeError(ch.Qos(5, 0, false)))
	for i := range 20 {
		publishTo(t, ch, queue, amqp.Publishing{Body: fmt.Appendf(nil, "%d", i)})
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	receiveTags := func(n int) []uint64 {
		var tags []uint64
		for range n {
			tags = append(tags, receive(t, deliveries).DeliveryTag)
		}
		return tags
	}
	// The queue counts what it has not sent: 15 ready means exactly five are out.
	j.add("received tags %v, %d ready", receiveTags(5), readyCount(t, observer, queue))
	j.add("ack 5 multiple: %s", describeError(ch.Ack(5, true)))
	j.add("received tags %v, %d ready", receiveTags(5), readyCount(t, observer, queue))

	// Global: one limit for the channel, shared by its consumers.
	shared := openChannel(t, conn)
	j.add("qos prefetch 3 global: %s", describeError(shared.Qos(3, 0, true)))
	queues := []string{declareSessionQueue(t, shared, nil), declareSessionQueue(t, shared, nil)}
	merged := make(chan amqp.Delivery, 20)
	for _, q := range queues {
		for i := range 10 {
			publishTo(t, shared, q, amqp.Publishing{Body: fmt.Appendf(nil, "%d", i)})
		}
		consumed, err := shared.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatalf("consume: %v", err)
		}
		go func() {
			for d := range consumed {
				merged <- d
			}
		}()
	}
	for range 3 {
		receive(t, merged)
	}
	j.add("received 3 from two consumers, %d ready", readyCount(t, observer, queues[0])+readyCount(t, observer, queues[1]))
	j.add("channel close: %s", describeError(shared.Close()))
}

func observeDirectReplyTo(t *testing.T, url string, j *journal) {
	serverChannel := openChannel(t, dialURL(t, url))
	requests := declareSessionQueue(t, serverChannel, nil)
	incoming, err := serverChannel.Consume(requests, "", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume requests: %v", err)
	}

	client := openChannel(t, dialURL(t, url))
	replies, err := client.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume amq.rabbitmq.reply-to: %v", err)
	}
	err = client.Publish("", requests, false, false, amqp.Publishing{ReplyTo: "amq.rabbitmq.reply-to", CorrelationId: "request-1", Body: []byte("ping")})
	j.add("request published: %s", describeError(err))
	request := receive(t, incoming)
	j.add("request %q, correlation %q, reply-to is a reply address: %v",
		request.Body, request.CorrelationId, strings.HasPrefix(request.ReplyTo, "amq.rabbitmq.reply-to."))
	err = serverChannel.Publish("", request.ReplyTo, true, false, amqp.Publishing{CorrelationId: request.CorrelationId, Body: []byte("pong")})
	j.add("reply published: %s", describeError(err))
	reply := receive(t, replies)
	j.add("reply %q, correlation %q, exchange %q, routing key is the reply address: %v",
		reply.Body, reply.CorrelationId, reply.Exchange, reply.RoutingKey == request.ReplyTo)

	// Without a reply-to consumer on the channel, the broker refuses the request.
	lonely := openChannel(t, dialURL(t, url))
	closed := lonely.NotifyClose(make(chan *amqp.Error, 1))
	err = lonely.Publish("", requests, false, false, amqp.Publishing{ReplyTo: "amq.rabbitmq.reply-to", Body: []byte("ping")})
	j.add("request without a reply consumer: %s", describeError(err))
	j.add("channel closed with %s", describeError(awaitCloseNotice(t, closed)))
}
