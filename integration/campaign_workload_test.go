package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The campaign's workload: several mirrored queues of different kinds,
// publishers with confirms that give every message a unique id
// ("publisher/sequence" in message_id and body), consumers and a poller
// with manual acks, and a journal of what every client saw, which the
// checker reads at the end. Every client is an amqp091-go client without
// reconnect logic on its own connection through the proxy: a failover
// must not reach it as an error.

// campaignQueue is one queue of the workload.
type campaignQueue struct {
	name string
	args amqp.Table
	// publishers publish to it through the default exchange.
	publishers int
	// consumers is how each reader takes messages: "consume", "cancel"
	// (consumes with x-cancel-on-ha-failover and consumes again when
	// cancelled) or "get" (polls with basic.get).
	consumers []string
	// ordered: a single consumer, so the messages of one publisher that
	// arrive without redelivered arrive in the order they were published.
	ordered bool
	// priorities: publishers give each message a random priority 0-4.
	priorities bool
	// rejectEvery: the consumer nacks without requeue every n-th delivery,
	// which the broker dead-letters to deadLetterTo.
	rejectEvery  int
	deadLetterTo string
}

// campaignDelivery is one message as a reader saw it.
type campaignDelivery struct {
	queue       string
	reader      string
	at          time.Time
	redelivered bool
}

// campaignMessage is what happened to one published message.
type campaignMessage struct {
	queue       string // where it was published
	publishedAt time.Time
	confirmed   bool
	nacked      bool
	// rejected: a reader nacked it without requeue, so it is owed to the
	// queue's dead-letter target.
	rejected   bool
	deliveries []campaignDelivery
	// ackSettled, by queue, is when a synchronous round trip on the
	// channel that acked it completed after the ack, and when the delivery
	// acked had arrived. With no fault between the two, the proxy has
	// the ack from then on, and the message must never be delivered from
	// that queue again; an ack across a failover may have named a tag of
	// the lost master, which settles nothing.
	ackSettled map[string]ackSettle
}

type ackSettle struct{ at, deliveredAt time.Time }

// campaignWorkload runs the clients and keeps the journal.
type campaignWorkload struct {
	t      *testing.T
	url    string
	queues []campaignQueue

	ctx     context.Context // ends the publishers
	stop    context.CancelFunc
	readers context.Context // ends the readers, after the drain
	halt    context.CancelFunc
	// publishing counts the publishers, wg the readers.
	publishing, wg sync.WaitGroup

	mu         sync.Mutex
	messages   map[string]*campaignMessage
	unexpected []string
	problems   []string // what a client should never see
	reconsumes int      // consumes again after an x-cancel-on-ha-failover cancel
	faults     faultWindows
	lastSeen   time.Time
	longestGap time.Duration // between two deliveries, while publishing
}

func newCampaignWorkload(t *testing.T, url string, queues []campaignQueue) *campaignWorkload {
	ctx, stop := context.WithCancel(context.Background())
	readers, halt := context.WithCancel(context.Background())
	w := &campaignWorkload{
		t: t, url: url, queues: queues,
		ctx: ctx, stop: stop, readers: readers, halt: halt,
		messages: map[string]*campaignMessage{},
	}
	t.Cleanup(func() {
		stop()
		halt()
		w.publishing.Wait()
		w.wg.Wait()
	})
	return w
}

// start opens every client.
func (w *campaignWorkload) start() {
	w.t.Helper()
	for _, q := range w.queues {
		for i := range q.publishers {
			w.addPublisher(fmt.Sprintf("%s.p%d", q.name, i+1), q)
		}
		for i, kind := range q.consumers {
			reader := fmt.Sprintf("%s.%s%d", q.name, kind, i+1)
			if kind == "get" {
				w.addPoller(reader, q)
			} else {
				w.addConsumer(reader, q, kind == "cancel")
			}
		}
	}
}

func (w *campaignWorkload) problem(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.problems = append(w.problems, fmt.Sprintf(format, args...))
}

func (w *campaignWorkload) channel(purpose string) *amqp.Channel {
	w.t.Helper()
	conn := dialURL(w.t, w.url)
	ch, err := conn.Channel()
	if err != nil {
		w.t.Fatalf("%s: channel: %v", purpose, err)
	}
	return ch
}

// addPublisher publishes one persistent message at a time and waits for
// its confirm, so that a publish left unanswered shows as a problem.
func (w *campaignWorkload) addPublisher(name string, q campaignQueue) {
	w.t.Helper()
	ch := w.channel(name)
	if err := ch.Confirm(false); err != nil {
		w.t.Fatal(err)
	}
	w.publishing.Go(func() {
		for seq := 1; w.ctx.Err() == nil; seq++ {
			id := name + "/" + strconv.Itoa(seq)
			msg := amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte(id)}
			if q.priorities {
				msg.Priority = uint8(rand.IntN(5))
			}
			w.mu.Lock()
			w.messages[id] = &campaignMessage{queue: q.name, publishedAt: time.Now(), ackSettled: map[string]ackSettle{}}
			w.mu.Unlock()
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q.name, false, false, msg)
			if err != nil {
				w.problem("publish %s: %v", id, err)
				return
			}
			// A broker in a resource alarm holds publishes until it ends.
			wait, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			ok, err := dc.WaitContext(wait)
			cancel()
			if err != nil {
				w.problem("publish %s neither confirmed nor nacked within 60s: %v", id, err)
				return
			}
			w.mu.Lock()
			m := w.messages[id]
			m.confirmed, m.nacked = ok, !ok
			w.mu.Unlock()
			// Pacing leaves the two cores to the brokers and the proxy.
			time.Sleep(3 * time.Millisecond)
		}
	})
}

// received records a delivery; it returns false for a message the
// workload never published.
func (w *campaignWorkload) received(queue, reader string, d amqp.Delivery) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if !w.lastSeen.IsZero() && w.ctx.Err() == nil {
		w.longestGap = max(w.longestGap, now.Sub(w.lastSeen))
	}
	w.lastSeen = now
	m, ok := w.messages[d.MessageId]
	if !ok || string(d.Body) != d.MessageId {
		w.unexpected = append(w.unexpected, fmt.Sprintf("%q (body %q) from %s", d.MessageId, d.Body, queue))
		return false
	}
	m.deliveries = append(m.deliveries, campaignDelivery{queue: queue, reader: reader, at: now, redelivered: d.Redelivered})
	return true
}

// settled records that ids' acks on queue reached the proxy.
func (w *campaignWorkload) settled(queue string, ids []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for _, id := range ids {
		m, ok := w.messages[id]
		if !ok {
			continue
		}
		if _, seen := m.ackSettled[queue]; seen {
			continue
		}
		for _, d := range slices.Backward(m.deliveries) {
			if d.queue == queue {
				m.ackSettled[queue] = ackSettle{at: now, deliveredAt: d.at}
				break
			}
		}
	}
}

func (w *campaignWorkload) rejected(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m, ok := w.messages[id]; ok {
		m.rejected = true
	}
}

// addConsumer consumes with manual acks, acking every few deliveries at
// once (multiple) and then completing a basic.qos round trip on the same
// channel, after which the acks before it are the proxy's.
func (w *campaignWorkload) addConsumer(reader string, q campaignQueue, cancelOnFailover bool) {
	w.t.Helper()
	ch := w.channel(reader)
	const prefetch = 20
	if err := ch.Qos(prefetch, 0, false); err != nil {
		w.t.Fatal(err)
	}
	var args amqp.Table
	if cancelOnFailover {
		args = amqp.Table{"x-cancel-on-ha-failover": true}
	}
	consume := func() (<-chan amqp.Delivery, error) {
		return ch.ConsumeWithContext(w.readers, q.name, reader, false, false, false, false, args)
	}
	deliveries, err := consume()
	if err != nil {
		w.t.Fatalf("consume %s: %v", reader, err)
	}
	ackEvery := 1 + rand.IntN(5)
	w.wg.Go(func() {
		var unacked []string
		count := 0
		for {
			select {
			case <-w.readers.Done():
				return
			case d, open := <-deliveries:
				if !open {
					if w.readers.Err() != nil {
						return
					}
					if !cancelOnFailover {
						w.problem("%s: deliveries ended: the channel or consumer closed", reader)
						return
					}
					// Cancelled on a failover. The deliveries not
					// acked yet stay the channel's, and the next
					// multiple ack covers them.
					w.mu.Lock()
					w.reconsumes++
					w.mu.Unlock()
					if deliveries, err = consume(); err != nil {
						w.problem("%s: consume again after a cancel: %v", reader, err)
						return
					}
					continue
				}
				if !w.received(q.name, reader, d) {
					_ = d.Ack(false)
					continue
				}
				count++
				if q.rejectEvery > 0 && count%q.rejectEvery == 0 {
					if err := d.Nack(false, false); err != nil {
						w.problem("%s: nack of %s: %v", reader, d.MessageId, err)
						return
					}
					w.rejected(d.MessageId)
					continue
				}
				if unacked = append(unacked, d.MessageId); len(unacked) < ackEvery {
					continue
				}
				if err := d.Ack(true); err != nil {
					w.problem("%s: ack of %s: %v", reader, d.MessageId, err)
					return
				}
				if err := ch.Qos(prefetch, 0, false); err != nil {
					w.problem("%s: basic.qos after an ack: %v", reader, err)
					return
				}
				w.settled(q.name, unacked)
				unacked = unacked[:0]
			}
		}
	})
}

// addPoller takes messages with basic.get and acks each.
func (w *campaignWorkload) addPoller(reader string, q campaignQueue) {
	w.t.Helper()
	ch := w.channel(reader)
	w.wg.Go(func() {
		for w.readers.Err() == nil {
			d, ok, err := ch.Get(q.name, false)
			if err != nil {
				w.problem("%s: basic.get: %v", reader, err)
				return
			}
			if !ok {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if !w.received(q.name, reader, d) {
				_ = d.Ack(false)
				continue
			}
			if err := d.Ack(false); err != nil {
				w.problem("%s: ack of %s: %v", reader, d.MessageId, err)
				return
			}
			// basic.get is synchronous: the next one completes after
			// the ack, but a qos round trip settles it now.
			if err := ch.Qos(1, 0, false); err != nil {
				w.problem("%s: basic.qos after an ack: %v", reader, err)
				return
			}
			w.settled(q.name, []string{d.MessageId})
		}
	})
}

// faultWindow is when a fault was injected and when the cluster was whole
// again.
type faultWindow struct{ from, to time.Time }

type faultWindows []faultWindow

// overlap reports whether a fault's window overlaps [from, to].
func (f faultWindows) overlap(from, to time.Time) bool {
	return slices.ContainsFunc(f, func(w faultWindow) bool { return !w.to.Before(from) && !w.from.After(to) })
}

// fault records a fault's window, for the checker.
func (w *campaignWorkload) fault(from, to time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faults = append(w.faults, faultWindow{from, to})
}

// acrossFault reports whether a fault's window overlaps [from, to].
func (w *campaignWorkload) acrossFault(from, to time.Time) bool {
	return w.faults.overlap(from, to)
}

// progress is how many messages were confirmed and how many delivered.
func (w *campaignWorkload) progress() (confirmed, delivered int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.messages {
		if m.confirmed {
			confirmed++
		}
		if len(m.deliveries) > 0 {
			delivered++
		}
	}
	return confirmed, delivered
}

// waitProgress waits until n more messages were confirmed and delivered.
func (w *campaignWorkload) waitProgress(n int, within time.Duration) error {
	c0, d0 := w.progress()
	deadline := time.Now().Add(within)
	for {
		c, d := w.progress()
		if c >= c0+n && d >= d0+n {
			return nil
		}
		if problems := w.problemList(); len(problems) > 0 {
			return fmt.Errorf("the clients saw %d problems: %s", len(problems), strings.Join(problems, "; "))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("in %v, %d more confirmed and %d more delivered; want %d each", within, c-c0, d-d0, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (w *campaignWorkload) problemList() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.problems)
}

// campaignVerdict is what the checker found.
type campaignVerdict struct {
	published, confirmed, nacked, delivered int
	lost                                    []string // confirmed (or dead-lettered) and never delivered where owed
	unflagged                               []string // delivered again from a queue without redelivered
	ackedThenRedelivered                    []string // delivered from a queue after its ack there settled
	outOfOrder                              []string // on an ordered queue, a first delivery before an earlier publish's
	unexpected, problems                    []string
	reconsumes                              int
	longestGap                              time.Duration
}

func (v campaignVerdict) clean() bool {
	return len(v.lost)+len(v.unflagged)+len(v.ackedThenRedelivered)+len(v.outOfOrder)+len(v.unexpected)+len(v.problems) == 0
}

// finish stops the publishers and waits for their last confirms, waits
// until every confirmed message has been delivered where it is owed (or
// drain runs out), stops the readers and returns the checker's verdict.
func (w *campaignWorkload) finish(drain time.Duration) campaignVerdict {
	w.stop()
	// A publish still waiting for its confirm is confirmed after this, and
	// must have its chance to be delivered too.
	w.publishing.Wait()
	deadline := time.Now().Add(drain)
	for time.Now().Before(deadline) && len(w.check().lost) > 0 {
		time.Sleep(100 * time.Millisecond)
	}
	w.halt()
	w.wg.Wait()
	return w.check()
}

// check reads the journal.
func (w *campaignWorkload) check() campaignVerdict {
	w.mu.Lock()
	defer w.mu.Unlock()
	deadLetterTo := map[string]string{}
	ordered := map[string]bool{}
	for _, q := range w.queues {
		deadLetterTo[q.name] = q.deadLetterTo
		ordered[q.name] = q.ordered
	}
	v := campaignVerdict{
		unexpected: slices.Clone(w.unexpected), problems: slices.Clone(w.problems),
		reconsumes: w.reconsumes, longestGap: w.longestGap,
	}
	// lastFirst[queue][publisher] is the sequence of the publisher's
	// message last delivered for the first time, unflagged, from queue.
	lastFirst := map[string]map[string]int{}
	ids := make([]string, 0, len(w.messages))
	for id := range w.messages {
		ids = append(ids, id)
	}
	for _, id := range ids {
		m := w.messages[id]
		v.published++
		if m.confirmed {
			v.confirmed++
		}
		if m.nacked {
			v.nacked++
		}
		if len(m.deliveries) > 0 {
			v.delivered++
		}
		owed := []string{m.queue}
		if m.rejected && deadLetterTo[m.queue] != "" {
			owed = append(owed, deadLetterTo[m.queue])
		}
		if m.confirmed {
			for _, q := range owed {
				if !slices.ContainsFunc(m.deliveries, func(d campaignDelivery) bool { return d.queue == q }) {
					v.lost = append(v.lost, id+" from "+q)
				}
			}
		}
		seen := map[string]bool{}
		for _, d := range m.deliveries {
			if seen[d.queue] && !d.redelivered {
				v.unflagged = append(v.unflagged, fmt.Sprintf("%s from %s to %s", id, d.queue, d.reader))
			}
			seen[d.queue] = true
			if s, ok := m.ackSettled[d.queue]; ok && d.at.After(s.at) && !w.acrossFault(s.deliveredAt, s.at) {
				v.ackedThenRedelivered = append(v.ackedThenRedelivered,
					fmt.Sprintf("%s from %s to %s, %v after its ack settled", id, d.queue, d.reader, d.at.Sub(s.at).Round(time.Millisecond)))
			}
		}
	}
	// Order: replay the ordered queues' unflagged deliveries in time.
	type first struct {
		id string
		d  campaignDelivery
	}
	var firsts []first
	for _, id := range ids {
		for _, d := range w.messages[id].deliveries {
			if ordered[d.queue] && !d.redelivered {
				firsts = append(firsts, first{id, d})
			}
		}
	}
	slices.SortFunc(firsts, func(a, b first) int { return a.d.at.Compare(b.d.at) })
	for _, f := range firsts {
		publisher, seqText, _ := strings.Cut(f.id, "/")
		seq, _ := strconv.Atoi(seqText)
		if lastFirst[f.d.queue] == nil {
			lastFirst[f.d.queue] = map[string]int{}
		}
		if last := lastFirst[f.d.queue][publisher]; seq <= last {
			v.outOfOrder = append(v.outOfOrder, fmt.Sprintf("%s from %s after %s/%d", f.id, f.d.queue, publisher, last))
		}
		lastFirst[f.d.queue][publisher] = max(seq, lastFirst[f.d.queue][publisher])
	}
	for _, list := range [][]string{v.lost, v.unflagged, v.ackedThenRedelivered, v.outOfOrder, v.unexpected} {
		slices.Sort(list)
	}
	return v
}

// errCampaignUnclean is what a verdict with findings reports.
var errCampaignUnclean = errors.New("the campaign found what no client may see")
