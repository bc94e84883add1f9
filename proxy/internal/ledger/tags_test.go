package ledger

import (
	"reflect"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

func TestDeliveryTagsSettle(t *testing.T) {
	type delivery struct {
		backend    int
		backendTag uint64
		needsAck   bool
	}
	type settlement struct {
		tag      uint64
		multiple bool
		want     []BackendAck
		wantOK   bool
	}
	tests := []struct {
		name       string
		deliveries []delivery
		settle     []settlement
		wantLeft   int
	}{
		{
			name:       "single ack maps to the backend tag",
			deliveries: []delivery{{0, 7, true}, {0, 8, true}},
			settle:     []settlement{{tag: 2, want: []BackendAck{{Backend: 0, BackendTag: 8}}, wantOK: true}},
			wantLeft:   1,
		},
		{
			name:       "multiple ack becomes one multiple ack per backend",
			deliveries: []delivery{{0, 1, true}, {1, 1, true}, {0, 2, true}, {1, 2, true}, {0, 3, true}},
			settle: []settlement{{tag: 4, multiple: true, want: []BackendAck{
				{Backend: 0, BackendTag: 2, Multiple: true},
				{Backend: 1, BackendTag: 2, Multiple: true},
			}, wantOK: true}},
			wantLeft: 1,
		},
		{
			name:       "multiple with tag 0 settles everything",
			deliveries: []delivery{{0, 1, true}, {0, 2, true}},
			settle:     []settlement{{tag: 0, multiple: true, want: []BackendAck{{Backend: 0, BackendTag: 2, Multiple: true}}, wantOK: true}},
		},
		{
			name:       "multiple with tag 0 and nothing outstanding is a no-op",
			deliveries: nil,
			settle:     []settlement{{tag: 0, multiple: true, wantOK: true}},
		},
		{
			name:       "unknown tag is refused",
			deliveries: []delivery{{0, 1, true}},
			settle:     []settlement{{tag: 5, wantOK: false}},
			wantLeft:   1,
		},
		{
			name:       "double ack is refused the second time",
			deliveries: []delivery{{0, 1, true}},
			settle: []settlement{
				{tag: 1, want: []BackendAck{{Backend: 0, BackendTag: 1}}, wantOK: true},
				{tag: 1, wantOK: false},
			},
		},
		{
			name:       "no-ack deliveries take a tag but cannot be acked",
			deliveries: []delivery{{0, 1, false}, {0, 2, true}},
			settle: []settlement{
				{tag: 1, wantOK: false},
				{tag: 2, want: []BackendAck{{Backend: 0, BackendTag: 2}}, wantOK: true},
			},
		},
		{
			name:       "multiple skips deliveries already settled",
			deliveries: []delivery{{0, 1, true}, {0, 2, true}, {0, 3, true}},
			settle: []settlement{
				{tag: 2, want: []BackendAck{{Backend: 0, BackendTag: 2}}, wantOK: true},
				{tag: 3, multiple: true, want: []BackendAck{{Backend: 0, BackendTag: 3, Multiple: true}}, wantOK: true},
			},
		},
		{
			name:       "multiple naming a settled tag is refused",
			deliveries: []delivery{{0, 1, true}, {0, 2, true}},
			settle: []settlement{
				{tag: 2, want: []BackendAck{{Backend: 0, BackendTag: 2}}, wantOK: true},
				{tag: 2, multiple: true, wantOK: false},
			},
			wantLeft: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d DeliveryTags
			for i, dl := range tt.deliveries {
				if got := d.Deliver(Delivered{Backend: dl.backend, BackendTag: dl.backendTag}, dl.needsAck); got != uint64(i+1) {
					t.Fatalf("deliver %d: got proxy tag %d, want %d", i, got, i+1)
				}
			}
			for i, s := range tt.settle {
				got, _, ok := d.Settle(s.tag, s.multiple, nil, false, nil, nil)
				if ok != s.wantOK {
					t.Fatalf("settle %d (tag %d): got ok=%v, want %v", i, s.tag, ok, s.wantOK)
				}
				if !reflect.DeepEqual(got, s.want) {
					t.Errorf("settle %d (tag %d): got acks %+v, want %+v", i, s.tag, got, s.want)
				}
			}
			if got := d.Outstanding(); got != tt.wantLeft {
				t.Errorf("outstanding: got %d, want %d", got, tt.wantLeft)
			}
		})
	}
}

func TestDeliveryTagsRestoreAfterRollback(t *testing.T) {
	var d DeliveryTags
	for i := uint64(1); i <= 3; i++ {
		d.Deliver(Delivered{BackendTag: i}, true)
	}
	_, settled, ok := d.Settle(2, true, nil, true, nil, nil)
	if !ok || len(settled) != 2 {
		t.Fatalf("settle: got ok=%v settled=%v, want 2 settled", ok, settled)
	}
	d.Restore(settled)
	if got := d.Outstanding(); got != 3 {
		t.Fatalf("after restore: got %d outstanding, want 3", got)
	}
	acks, _, ok := d.Settle(1, false, nil, false, nil, nil)
	if !ok || !reflect.DeepEqual(acks, []BackendAck{{Backend: 0, BackendTag: 1}}) {
		t.Errorf("ack after restore: got %+v ok=%v", acks, ok)
	}
}

// TestDeliveryTagsRecoverOkDropsOneBackend: basic.recover reaches every
// link of the channel, and each link's recover-ok voids only the tags of
// its own deliveries. The master's redeliveries may come before a slave's
// recover-ok; they stay outstanding, and ack 0 multiple settles them.
func TestDeliveryTagsRecoverOkDropsOneBackend(t *testing.T) {
	const master, slave = 0, 1
	var d DeliveryTags
	d.Deliver(Delivered{Backend: master, BackendTag: 1}, true)
	d.Deliver(Delivered{Backend: master, BackendTag: 2}, true)
	d.Deliver(Delivered{Backend: slave, BackendTag: 1}, true)
	d.Settle(2, false, nil, false, nil, nil)

	d.DropFrom(master) // the master's recover-ok
	d.Deliver(Delivered{Backend: master, BackendTag: 3}, true)
	d.Deliver(Delivered{Backend: master, BackendTag: 4}, true)
	if got := d.Outstanding(); got != 3 {
		t.Fatalf("after the master's recover-ok and its two redeliveries: got %d outstanding, want 3", got)
	}
	d.DropFrom(slave) // the slave's recover-ok, after the master's redeliveries
	if got := d.Outstanding(); got != 2 {
		t.Fatalf("after the slave's recover-ok: got %d outstanding, want the 2 redeliveries", got)
	}
	if _, _, ok := d.Settle(1, false, nil, false, nil, nil); ok {
		t.Errorf("a tag from before the recover settles; want it refused")
	}
	acks, _, ok := d.Settle(0, true, nil, false, nil, nil)
	if want := []BackendAck{{Backend: master, BackendTag: 4, Multiple: true}}; !ok || !reflect.DeepEqual(acks, want) {
		t.Errorf("ack 0 multiple: got %+v ok=%v, want %+v", acks, ok, want)
	}
	if got := d.Outstanding(); got != 0 {
		t.Errorf("after ack 0 multiple: got %d outstanding, want 0", got)
	}
}

func TestDeliveryTagsSteadyStateDoesNotAllocate(t *testing.T) {
	var d DeliveryTags
	var acks []BackendAck
	backendTag := uint64(0)
	step := func() {
		backendTag++
		tag := d.Deliver(Delivered{BackendTag: backendTag}, true)
		acks, _, _ = d.Settle(tag, false, acks[:0], false, nil, nil)
	}
	for i := 0; i < 100; i++ {
		step()
	}
	if allocs := testing.AllocsPerRun(1000, step); allocs != 0 {
		t.Errorf("deliver+ack allocates %.1f times per message, want 0", allocs)
	}
}

func TestDeliveryTagsCompactsSettledEntries(t *testing.T) {
	var d DeliveryTags
	for i := uint64(1); i <= 1000; i++ {
		d.Deliver(Delivered{BackendTag: i}, true)
	}
	// Ack all but the first: the first pins the front, the rest must go.
	for i := uint64(2); i <= 1000; i++ {
		if _, _, ok := d.Settle(i, false, nil, false, nil, nil); !ok {
			t.Fatalf("settle %d refused", i)
		}
	}
	if len(d.pending) > 64 {
		t.Errorf("pending holds %d entries for 1 outstanding delivery, want compaction", len(d.pending))
	}
	if _, _, ok := d.Settle(1, false, nil, false, nil, nil); !ok {
		t.Errorf("the pinned first delivery can no longer be acked")
	}
}

// TestDeliveryTagsCountUnacked: list_queues counts the deliveries waiting
// for the client's settlement by the queue they came from, in the vhost
// asked for, and leaves out those settled, those of an unknown queue and
// those of a link no longer open.
func TestDeliveryTagsCountUnacked(t *testing.T) {
	orders := &QueueRef{ID: mirror.QueueID{VHost: "/", Name: "orders"}}
	jobs := &QueueRef{ID: mirror.QueueID{VHost: "prod", Name: "jobs"}}
	var d DeliveryTags
	for _, m := range []Delivered{
		{Backend: 0, Gen: 1, BackendTag: 1, From: orders},
		{Backend: 0, Gen: 1, BackendTag: 2, From: orders}, // settled below
		{Backend: 1, Gen: 1, BackendTag: 1, From: orders}, // its link was lost (gen 2 now)
		{Backend: 1, Gen: 2, BackendTag: 1, From: orders},
		{Backend: 0, Gen: 1, BackendTag: 3, From: jobs},
		{Backend: 0, Gen: 1, BackendTag: 4}, // a queue the proxy does not record
	} {
		d.Deliver(m, true)
	}
	d.Deliver(Delivered{Backend: 0, Gen: 1, BackendTag: 5, From: orders}, false) // no-ack
	if _, _, ok := d.Settle(2, false, nil, false, nil, nil); !ok {
		t.Fatal("settling tag 2: not found")
	}
	live := func(backend int, gen uint64) bool { return gen == []uint64{1, 2}[backend] }
	tests := []struct {
		vhost string
		want  map[mirror.QueueID]int
	}{
		{"", map[mirror.QueueID]int{orders.ID: 2, jobs.ID: 1}},
		{"/", map[mirror.QueueID]int{orders.ID: 2}},
		{"prod", map[mirror.QueueID]int{jobs.ID: 1}},
		{"test", map[mirror.QueueID]int{}},
	}
	for _, tt := range tests {
		got := make(map[mirror.QueueID]int)
		d.CountUnacked(tt.vhost, live, got)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("vhost %q: got %v, want %v", tt.vhost, got, tt.want)
		}
	}
}

func TestDeliveryTagsAppendMirrored(t *testing.T) {
	orders := &QueueRef{ID: mirror.QueueID{VHost: "/", Name: "orders"}}
	id := func(b byte) mirror.MessageID { return mirror.MessageID{b} }
	var d DeliveryTags
	for _, m := range []Delivered{
		{Backend: 0, BackendTag: 1, Queue: orders, ID: id(1)},
		{Backend: 0, BackendTag: 2, Queue: orders, ID: id(2)}, // settled below
		{Backend: 1, BackendTag: 1, Queue: orders, ID: id(3)},
		{Backend: 1, BackendTag: 2}, // not mirrored
	} {
		d.Deliver(m, true)
	}
	if _, _, ok := d.Settle(2, false, nil, false, nil, nil); !ok {
		t.Fatal("settling tag 2: not found")
	}
	tests := []struct {
		backend int
		want    []Trimmed
	}{
		{-1, []Trimmed{{orders, id(1)}, {orders, id(3)}}},
		{0, []Trimmed{{orders, id(1)}}},
		{1, []Trimmed{{orders, id(3)}}},
		{2, nil},
	}
	for _, tt := range tests {
		if got := d.AppendMirrored(nil, tt.backend); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("backend %d: got %v, want %v", tt.backend, got, tt.want)
		}
	}
}
