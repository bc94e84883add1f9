package mirror

import (
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

func TestBacklogCaughtUp(t *testing.T) {
	tests := []struct {
		name        string
		backlog     Backlog
		masterEmpty bool
		want        bool
	}{
		{name: "joined an empty queue", backlog: Backlog{}, want: true},
		{name: "nothing of the backlog settled", backlog: Backlog{Held: 3}, want: false},
		{name: "part of the backlog settled", backlog: Backlog{Held: 3}.Settle(2), want: false},
		{name: "the whole backlog settled, newer messages remain", backlog: Backlog{Held: 3}.Settle(2).Settle(1), want: true},
		{name: "master empty, whatever was counted", backlog: Backlog{Held: 3}, masterEmpty: true, want: true},
		{name: "more settled than held (a miscount): caught up, not stuck", backlog: Backlog{Held: 1}.Settle(2), want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.backlog.CaughtUp(tt.masterEmpty); got != tt.want {
				t.Errorf("%+v.CaughtUp(master empty %v) = %v, want %v", tt.backlog, tt.masterEmpty, got, tt.want)
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
