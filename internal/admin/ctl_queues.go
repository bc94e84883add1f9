package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

// queueColumns are the columns list_queues can show, in the order its help
// lists them. Backends are named as in the config's backends list. The
// default starts with rabbitmqctl's own (name, messages), so that a script
// reading the first two columns of rabbitmqctl list_queues reads the same
// here, then says where the copies are. rabbitmqctl's names of the
// mirroring columns are accepted, so that scripts written for RabbitMQ's
// mirroring keep working.
var queueColumns = columnSet[mirror.QueueStatus]{
	columns: []column[mirror.QueueStatus]{
		{"name", "the queue's name", func(q mirror.QueueStatus) any { return q.Meta.ID.Name }},
		{"messages", "messages_ready and messages_unacknowledged together, as rabbitmqctl counts them", func(q mirror.QueueStatus) any { return count(q.Messages) }},
		{"messages_ready", "messages ready in the master (its queue.declare-ok count)", func(q mirror.QueueStatus) any { return count(q.MessagesReady) }},
		{"messages_unacknowledged", "messages the proxies' clients hold unacknowledged (asked of every live proxy)", func(q mirror.QueueStatus) any { return count(q.MessagesUnacked) }},
		{"master", "the backend whose copy clients consume from", func(q mirror.QueueStatus) any { return q.Meta.Master }},
		{"slaves", "the backends holding a mirror, in join order (oldest first)", func(q mirror.QueueStatus) any { return nonNil(slaveNames(q.Meta.Slaves)) }},
		{"synchronised_slaves", "the slaves holding every message the master holds, in join order", func(q mirror.QueueStatus) any { return nonNil(q.Meta.SynchronisedSlaves()) }},
		{"syncing_slaves", "the slaves a synchronisation is copying to now", func(q mirror.QueueStatus) any { return nonNil(q.Syncing) }},
		{"refused", "the backends that refuse the proxy's own account in the queue's vhost (the vhost is missing there, or the account lacks permissions): no copy is placed there until they accept", func(q mirror.QueueStatus) any { return nonNil(q.Refused) }},
		{"consumers", "consumers on the master", func(q mirror.QueueStatus) any { return count(q.Consumers) }},
		{"policy", "the effective policy's name, empty for none", func(q mirror.QueueStatus) any { return q.Policy }},
		{"exclusive", "true for an exclusive queue: never mirrored; messages and consumers empty (its broker tells its owner only)", func(q mirror.QueueStatus) any { return q.Exclusive }},
	},
	defaults: []string{"name", "messages", "master", "slaves", "synchronised_slaves"},
	aliases: map[string]string{
		"pid":                     "master",
		"slave_pids":              "slaves",
		"synchronised_slave_pids": "synchronised_slaves",
	},
}

// needsUnacked reports whether a column shows the unacknowledged messages,
// which the other proxies of a cluster are asked for.
func needsUnacked(column string) bool {
	return column == "messages" || column == "messages_unacknowledged"
}

func slaveNames(slaves []mirror.Slave) []string {
	out := make([]string, 0, len(slaves))
	for _, s := range slaves {
		out = append(out, s.Backend)
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// count is a count the engine reports as -1 when the master's broker could
// not be asked: nil then, so that the table shows nothing and JSON null
// rather than a number a script could add up.
func count(n int) *int {
	if n < 0 {
		return nil
	}
	return &n
}

// The queue commands, served by the engine's Queues.
var (
	listQueuesCommand = command{
		usage: "list_queues [-p VHOST] [--formatter table|json] [COLUMN ...]",
		brief: "lists queues with their master, slaves and synchronised slaves",
		summary: "Lists the queues of a vhost that the proxies know: those declared or used through them,\nexclusive queues too (never mirrored). One line each, tab-separated with a\nheader line (--formatter json: an array of objects keyed by column). Lists of backends\nare shown as [rabbit2, rabbit3]. COLUMN is one or more of:\n" +
			queueColumns.help(),
		moreArgs: true,
		check:    queueColumns.check,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			columns := a
			if len(columns) == 0 {
				columns = queueColumns.defaults
			}
			o.say("Listing queues for vhost %s ...", o.vhost)
			list, err := c.ListQueues(ctx, o.vhost, slices.ContainsFunc(columns, needsUnacked))
			if err != nil {
				return err
			}
			return queueColumns.print(o, list, columns)
		},
	}
	syncQueueCommand = command{
		usage:   "sync_queue [-p VHOST] [--wait [--timeout D]] NAME",
		brief:   "synchronises a mirrored queue's unsynchronised slaves",
		summary: "Starts copying the master's messages to the queue's unsynchronised slaves, for queues\nwith ha-sync-mode manual (the default). The queue keeps serving clients meanwhile, so\nctl returns once the copy has started; list_queues synchronised_slaves tells when it is\ndone, or --wait waits for it (at most --timeout; exit code 75 when that runs out).",
		args:    1,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			id := mirror.QueueID{VHost: o.vhost, Name: a[0]}
			o.say("Synchronising queue '%s' in vhost '%s' ...", a[0], o.vhost)
			if err := c.SyncQueue(ctx, id); err != nil {
				return err
			}
			if !o.wait {
				return nil
			}
			return waitSynchronised(ctx, c, id, syncPollInterval)
		},
	}
	cancelSyncQueueCommand = command{
		usage:   "cancel_sync_queue [-p VHOST] NAME",
		brief:   "stops a synchronisation in progress",
		summary: "Stops the synchronisation of a queue that sync_queue or ha-sync-mode automatic started.\nSlaves that were not synchronised stay so.",
		args:    1,
		run: func(ctx context.Context, c *Client, o *ctlOptions, a []string) error {
			o.say("Stopping synchronising queue '%s' in vhost '%s' ...", a[0], o.vhost)
			return c.CancelSyncQueue(ctx, mirror.QueueID{VHost: o.vhost, Name: a[0]})
		},
	}
)

// syncPollInterval is how often sync_queue --wait asks list_queues: a
// sync of a few messages ends within it, one of many takes seconds.
const syncPollInterval = 200 * time.Millisecond

// waitTimeoutError is sync_queue --wait running out of time: the sync goes
// on, only ctl stopped waiting.
type waitTimeoutError struct {
	id                   mirror.QueueID
	slaves, synchronised []string
	timeout              error
}

func (e *waitTimeoutError) Error() string {
	return fmt.Sprintf("%v: %d of %d slaves synchronised %s when ctl stopped waiting (%v); the synchronisation goes on: see list_queues, or wait longer with --timeout",
		e.id, len(e.synchronised), len(e.slaves), tableCell(nonNil(e.synchronised)), e.timeout)
}

// waitSynchronised polls the queue until every slave is synchronised.
// Polling, not an event stream: the API stays plain request and answer,
// and a sync worth waiting for lasts many polls.
func waitSynchronised(ctx context.Context, c *Client, id mirror.QueueID, every time.Duration) error {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	var last mirror.QueueMeta
	for {
		list, err := c.ListQueues(ctx, id.VHost, false)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("waiting for the synchronisation of %v: %w", id, err)
		}
		if err == nil {
			i := slices.IndexFunc(list, func(q mirror.QueueStatus) bool { return q.Meta.ID == id })
			if i < 0 {
				return fmt.Errorf("waiting for the synchronisation of %v: the queue is gone", id)
			}
			last = list[i].Meta
			if len(last.SynchronisedSlaves()) == len(last.Slaves) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return &waitTimeoutError{id: id, slaves: slaveNames(last.Slaves), synchronised: last.SynchronisedSlaves(), timeout: ctx.Err()}
		case <-ticker.C:
		}
	}
}

// tableCell formats a value as rabbitmqctl's table does: lists in
// brackets, comma-separated.
func tableCell(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []string:
		return "[" + strings.Join(v, ", ") + "]"
	case *int:
		if v == nil {
			return ""
		}
		return strconv.Itoa(*v)
	case map[string]any:
		// rabbitmqctl prints empty arguments as []; others as JSON here.
		if len(v) == 0 {
			return "[]"
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if enc.Encode(v) == nil {
			return strings.TrimSuffix(b.String(), "\n")
		}
	}
	return fmt.Sprint(v)
}

// orderedObject is a JSON object whose keys keep the order the columns
// were asked in (a map would sort them).
type orderedObject []field

type field struct {
	key   string
	value any
}

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		// An encoder, not json.Marshal, so that names with & < > stay
		// readable, as in the rest of ctl's JSON.
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(f.key); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1) // Encode's newline
		b.WriteByte(':')
		if err := enc.Encode(f.value); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
