package mirror

import (
	"encoding/binary"
	"testing"
)

// longstrField encodes a headers-table field with a long-string value.
func longstrField(key, value string) []byte {
	b := append([]byte{byte(len(key))}, key...)
	b = append(b, 'S')
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

func TestIdentityAtEnd(t *testing.T) {
	id := MessageID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	other := longstrField("app", "orders")
	tests := []struct {
		name        string
		table       []byte
		wantOK      bool
		wantNoTable bool
	}{
		{"last field", append(other, longstrField(IdentityHeader, string(id[:]))...), true, false},
		{"alone, from a message without a table", longstrField(IdentityHeader, string(id[:])+string(IdentityNoTable)), true, true},
		{"seventeen bytes without the no-table mark", longstrField(IdentityHeader, string(id[:])+"x"), false, false},
		{"not last", append(longstrField(IdentityHeader, string(id[:])), other...), false, false},
		{"another key", longstrField("x-amqp-mirror-ix", string(id[:])), false, false},
		{"too short a value", longstrField(IdentityHeader, "short"), false, false},
		{"empty table", nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, entry, noTable, ok := IdentityAtEnd(tt.table)
			if ok != tt.wantOK || noTable != tt.wantNoTable {
				t.Fatalf("ok %v, noTable %v; want %v, %v", ok, noTable, tt.wantOK, tt.wantNoTable)
			}
			if !ok {
				return
			}
			if got != id {
				t.Errorf("identity %v, want %v", got, id)
			}
			if want := len(longstrField(IdentityHeader, string(id[:]))) + map[bool]int{true: 1}[noTable]; entry != want {
				t.Errorf("entry %d bytes, want %d", entry, want)
			}
		})
	}
}
