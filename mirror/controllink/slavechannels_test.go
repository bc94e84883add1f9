package controllink

import (
	"slices"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestNewestFirst(t *testing.T) {
	tests := []struct {
		name string
		open []uint64
		want []uint64
	}{
		{name: "none", open: nil, want: []uint64{}},
		{name: "one", open: []uint64{7}, want: []uint64{7}},
		{name: "in order", open: []uint64{1, 2, 3}, want: []uint64{3, 2, 1}},
		{name: "gaps left by closed channels", open: []uint64{40, 2, 977, 13}, want: []uint64{977, 40, 13, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			open := make(map[uint64]*amqp.Channel)
			for _, seq := range tt.open {
				open[seq] = nil
			}
			if got := newestFirst(open); !slices.Equal(got, tt.want) {
				t.Errorf("newestFirst(%v) = %v, want %v", tt.open, got, tt.want)
			}
		})
	}
}
