package engine

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
)

func TestAdoptedMeta(t *testing.T) {
	id := mirror.QueueID{VHost: "/", Name: "q"}
	tests := []struct {
		name   string
		copies []found
		master string
		slaves []string
	}{
		{name: "one copy", copies: []found{{"rabbit2", 1000}}, master: "rabbit2"},
		{name: "most messages wins", copies: []found{{"rabbit1", 3}, {"rabbit2", 10}, {"rabbit3", 5}}, master: "rabbit2", slaves: []string{"rabbit1", "rabbit3"}},
		{name: "a tie goes to the first configured", copies: []found{{"rabbit1", 0}, {"rabbit3", 0}}, master: "rabbit1", slaves: []string{"rabbit3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := adoptedMeta(id, tt.copies)
			if m.Master != tt.master {
				t.Errorf("master = %s, want %s", m.Master, tt.master)
			}
			var slaves []string
			for _, s := range m.Slaves {
				if s.Synchronised {
					t.Errorf("adopted slave on %s is synchronised; want unsynchronised", s.Backend)
				}
				slaves = append(slaves, s.Backend)
			}
			if !reflect.DeepEqual(slaves, tt.slaves) {
				t.Errorf("slaves = %v, want %v", slaves, tt.slaves)
			}
			if !m.Durable || m.ID != id {
				t.Errorf("got %+v, want a durable record of %v", m, id)
			}
		})
	}
}

func encode(t *testing.T, table frames.Table) []byte {
	t.Helper()
	b, err := frames.AppendTable(nil, table)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTables(t *testing.T) {
	tests := []struct {
		name    string
		table   frames.Table
		want    amqp.Table
		locator string
	}{
		{name: "none", table: nil, want: nil},
		{name: "empty", table: frames.Table{}, want: nil},
		{
			name: "queue arguments",
			table: frames.Table{
				{Key: "x-max-priority", Value: uint8(10)},
				{Key: "x-message-ttl", Value: int32(60000)},
				{Key: "x-queue-master-locator", Value: "client-local"},
				{Key: "x-dead-letter-exchange", Value: []byte("dlx")},
			},
			want: amqp.Table{
				"x-max-priority": uint8(10), "x-message-ttl": int32(60000),
				"x-queue-master-locator": "client-local", "x-dead-letter-exchange": []byte("dlx"),
			},
			locator: "client-local",
		},
		{
			name: "nested values",
			table: frames.Table{
				{Key: "t", Value: frames.Table{{Key: "d", Value: frames.Decimal{Scale: 2, Value: 314}}}},
				{Key: "a", Value: []any{frames.Timestamp(1700000000), "x"}},
				{Key: "t", Value: "a duplicate key: the first wins"},
			},
			want: amqp.Table{
				"t": amqp.Table{"d": amqp.Decimal{Scale: 2, Value: 314}},
				"a": []any{time.Unix(1700000000, 0), "x"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var encoded []byte
			if tt.table != nil {
				encoded = encode(t, tt.table)
			}
			got, err := amqpTable(encoded)
			if err != nil {
				t.Fatalf("amqpTable: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("amqpTable = %#v, want %#v", got, tt.want)
			}
			if got, err := tableString(encoded, "x-queue-master-locator"); err != nil || got != tt.locator {
				t.Errorf("locator argument = %q, %v; want %q", got, err, tt.locator)
			}
			if got := hasKey(encoded, "x-max-priority"); got != (tt.want["x-max-priority"] != nil) {
				t.Errorf("hasKey(x-max-priority) = %v", got)
			}
		})
	}
}

// TestLookupDoesNotAllocate: Lookup is on every publish.
func TestLookupDoesNotAllocate(t *testing.T) {
	e := New(Options{})
	defer e.cancel()
	id := mirror.QueueID{VHost: "/", Name: "orders"}
	m := map[mirror.QueueID]mirror.QueueMeta{id: {ID: id, Master: "rabbit1", Slaves: []mirror.Slave{{Backend: "rabbit2"}}}}
	e.view.current.Store(&snapshot{base: m, recent: map[mirror.QueueID]recentWrite{{Name: "new"}: {}}})
	var found bool
	allocs := testing.AllocsPerRun(1000, func() {
		_, found = e.Lookup(id)
	})
	if !found {
		t.Fatal("Lookup does not find the queue in the snapshot")
	}
	if allocs != 0 {
		t.Errorf("Lookup allocates %.1f times per call, want 0", allocs)
	}
}

func BenchmarkLookup(b *testing.B) {
	e := New(Options{})
	defer e.cancel()
	m := map[mirror.QueueID]mirror.QueueMeta{}
	for i := range 10000 {
		id := mirror.QueueID{VHost: "/", Name: fmt.Sprint("queue-", i)}
		m[id] = mirror.QueueMeta{ID: id, Master: "rabbit1"}
	}
	e.view.current.Store(&snapshot{base: m})
	id := mirror.QueueID{VHost: "/", Name: "queue-4242"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e.Lookup(id)
		}
	})
}

// TestSnapshotOverlay: the engine's own writes are visible to Lookup and
// placement at once, over the Store's state, deletions included.
func TestSnapshotOverlay(t *testing.T) {
	e := New(Options{})
	defer e.cancel()
	q := func(name, master string, version uint64) mirror.QueueMeta {
		return mirror.QueueMeta{ID: mirror.QueueID{VHost: "/", Name: name}, Master: master, Version: version}
	}
	e.view.current.Store(&snapshot{base: map[mirror.QueueID]mirror.QueueMeta{
		{VHost: "/", Name: "a"}: q("a", "rabbit1", 1),
		{VHost: "/", Name: "b"}: q("b", "rabbit1", 2),
	}})
	e.view.noteWrite(q("c", "rabbit2", 3)) // new
	e.view.noteWrite(q("a", "rabbit3", 4)) // promoted
	e.view.noteDelete(q("b", "", 0).ID)    // deleted
	e.view.noteWrite(q("a", "rabbit2", 3)) // an older write of a, arriving late
	tests := []struct {
		name   string
		master string
		found  bool
	}{
		{name: "a", master: "rabbit3", found: true},
		{name: "b"},
		{name: "c", master: "rabbit2", found: true},
		{name: "d"},
	}
	for _, tt := range tests {
		got, ok := e.Lookup(mirror.QueueID{VHost: "/", Name: tt.name})
		if ok != tt.found || got.Master != tt.master {
			t.Errorf("Lookup(%s) = master %q, %v; want %q, %v", tt.name, got.Master, ok, tt.master, tt.found)
		}
	}
	if got, want := e.view.countMasters(e.backends), map[string]int{"rabbit2": 1, "rabbit3": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("countMasters = %v, want %v", got, want)
	}
}

// TestRejoinsBefore: a drop counts as before a copy's rejoin only when its
// x-death time (whole seconds) is before the rejoin's second, and only for
// that copy.
func TestRejoinsBefore(t *testing.T) {
	id := mirror.QueueID{VHost: "/", Name: "q"}
	rejoined := time.Date(2026, 12, 6, 0, 30, 10, 400_000_000, time.UTC)
	var r rejoins
	r.note(id, "rabbit2", rejoined)
	tests := []struct {
		name    string
		queue   mirror.QueueID
		backend string
		death   time.Time
		want    bool
	}{
		{"a second before", id, "rabbit2", rejoined.Truncate(time.Second).Add(-time.Second), true},
		{"the rejoin's own second", id, "rabbit2", rejoined.Truncate(time.Second), false},
		{"after", id, "rabbit2", rejoined.Add(time.Second), false},
		{"another backend's copy", id, "rabbit3", rejoined.Add(-time.Minute), false},
		{"another queue", mirror.QueueID{VHost: "/", Name: "other"}, "rabbit2", rejoined.Add(-time.Minute), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.before(tt.queue, tt.backend, tt.death); got != tt.want {
				t.Errorf("before(%v, %s, %v) = %v, want %v", tt.queue, tt.backend, tt.death, got, tt.want)
			}
		})
	}
	// A rejoin older than rejoinMemory is forgotten at the next note.
	r.note(mirror.QueueID{VHost: "/", Name: "later"}, "rabbit3", rejoined.Add(rejoinMemory+time.Minute))
	if r.before(id, "rabbit2", rejoined.Add(-time.Minute)) {
		t.Error("a rejoin older than rejoinMemory is still remembered")
	}
}
