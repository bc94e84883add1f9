package proxy

import "testing"

// TestChannelTableSlots: ids up to channel_max are tracked wherever their
// chunk falls, ids beyond it are not, and only chunks of opened ids exist.
func TestChannelTableSlots(t *testing.T) {
	table := newChannelTable(2047)
	tests := []struct {
		id      uint16
		tracked bool
	}{
		{1, true}, {63, true}, {64, true}, {2047, true}, {2048, false}, {65535, false},
	}
	for _, tt := range tests {
		ch := table.open(tt.id)
		if got := table.get(tt.id) == ch; got != tt.tracked {
			t.Errorf("channel %d: tracked %v, want %v", tt.id, got, tt.tracked)
		}
	}
	made := 0
	for i := range table.chunks {
		if table.chunks[i].Load() != nil {
			made++
		}
	}
	if made != 3 { // ids 1 and 63, 64, 2047
		t.Errorf("%d chunks of slots made, want 3", made)
	}
	if table.get(500) != nil {
		t.Error("a channel that was never opened is found")
	}
	table.remove(64, table.get(64))
	if table.get(64) != nil {
		t.Error("channel 64 is still found after remove")
	}
	if table.get(63) == nil {
		t.Error("removing channel 64 lost channel 63")
	}
}
