package mirror

import (
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

func TestCaughtUp(t *testing.T) {
	tests := []struct {
		name           string
		joinMark       uint64
		oldestOnMaster uint64
		masterEmpty    bool
		want           bool
	}{
		{name: "empty master: synchronised at once", joinMark: 10, masterEmpty: true, want: true},
		{name: "empty queue when the slave joined", joinMark: 0, masterEmpty: true, want: true},
		{name: "master still holds a message from before the join", joinMark: 10, oldestOnMaster: 4, want: false},
		{name: "master still holds the last message before the join", joinMark: 10, oldestOnMaster: 10, want: false},
		{name: "every message from before the join is gone", joinMark: 10, oldestOnMaster: 11, want: true},
		{name: "messages adopted from before the proxy count as 0", joinMark: 0, oldestOnMaster: 0, want: false},
		{name: "slave joined before anything was published, master holds new messages", joinMark: 0, oldestOnMaster: 1, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CaughtUp(tt.joinMark, tt.oldestOnMaster, tt.masterEmpty); got != tt.want {
				t.Errorf("CaughtUp(joinMark %d, oldest %d, empty %v) = %v, want %v", tt.joinMark, tt.oldestOnMaster, tt.masterEmpty, got, tt.want)
			}
		})
	}
}

func TestMarkSynchronised(t *testing.T) {
	tests := []struct {
		name    string
		meta    QueueMeta
		backend string
		want    QueueMeta
		changed bool
	}{
		{name: "unsynchronised slave", meta: queue("rabbit1", "rabbit2", "rabbit3"), backend: "rabbit3",
			want: queue("rabbit1", "rabbit2", "rabbit3+"), changed: true},
		{name: "already synchronised", meta: queue("rabbit1", "rabbit2+"), backend: "rabbit2",
			want: queue("rabbit1", "rabbit2+")},
		{name: "the master is no slave", meta: queue("rabbit1", "rabbit2"), backend: "rabbit1",
			want: queue("rabbit1", "rabbit2")},
		{name: "a backend without a copy", meta: queue("rabbit1", "rabbit2"), backend: "rabbit3",
			want: queue("rabbit1", "rabbit2")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.meta.Clone()
			got, changed := MarkSynchronised(tt.meta, tt.backend)
			checkUntouched(t, before, tt.meta)
			checkMeta(t, got, tt.want)
			if changed != tt.changed {
				t.Errorf("changed = %v, want %v", changed, tt.changed)
			}
		})
	}
}

func TestAutomaticSync(t *testing.T) {
	tests := []struct {
		name string
		def  config.Definition
		want bool
	}{
		{name: "no policy", def: config.Definition{}, want: false},
		{name: "automatic without ha-mode cannot mirror", def: config.Definition{SyncMode: config.SyncAutomatic}, want: false},
		{name: "ha-mode all, sync mode unset: manual", def: def(config.HAAll), want: false},
		{name: "manual", def: config.Definition{HAMode: config.HAAll, SyncMode: config.SyncManual}, want: false},
		{name: "automatic", def: automatic(exactly(2)), want: true},
	}
	for _, tt := range tests {
		if got := AutomaticSync(tt.def); got != tt.want {
			t.Errorf("%s: AutomaticSync(%s) = %v, want %v", tt.name, tt.def, got, tt.want)
		}
	}
}

func TestSyncBatches(t *testing.T) {
	tests := []struct {
		messages, batchSize, want int
	}{
		{0, 0, 0},
		{1, 0, 1},
		{4096, 0, 1},
		{4097, 0, 2},
		{10, 3, 4},
		{9, 3, 3},
	}
	for _, tt := range tests {
		d := config.Definition{HAMode: config.HAAll, SyncBatchSize: tt.batchSize}
		if got := SyncBatches(tt.messages, d); got != tt.want {
			t.Errorf("SyncBatches(%d, batch size %d) = %d, want %d", tt.messages, tt.batchSize, got, tt.want)
		}
	}
}
