package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/mirror"
)

type noPeers struct{}

func (noPeers) SendSettles(string, mirror.QueueID, []mirror.MessageID, mirror.Outcome) {}
func (noPeers) PurgeSlave(context.Context, string, mirror.QueueID) error               { return nil }
func (noPeers) SyncSlave(context.Context, string, mirror.QueueID) error                { return nil }
func (noPeers) WaitApplied(context.Context, uint64) error                              { return nil }
func (noPeers) CountDown(context.Context, string) (int, int, error)                    { return 0, 0, nil }
func (noPeers) Unrecorded(context.Context, string) ([]mirror.UnrecordedQueue, error) {
	return nil, nil
}
func (noPeers) Held(context.Context, string) (map[mirror.QueueID]mirror.Held, error) {
	return nil, nil
}
func (noPeers) StartCopy(context.Context, string, mirror.CopyJob) error {
	return errors.New("no peers")
}
func (noPeers) CopyState(context.Context, string, string, bool) (mirror.CopyState, error) {
	return mirror.CopyState{}, errors.New("no peers")
}
func (noPeers) Delivered(context.Context, mirror.QueueID, uint64) ([]mirror.MessageID, error) {
	return nil, nil
}

// TestClusterShares checks who does what for a queue mastered on rabbit1
// with a slave on rabbit2: one proxy alone does everything; in a cluster
// the proxy beside the master coordinates and each trims its own node's
// copies.
func TestClusterShares(t *testing.T) {
	m := mirror.QueueMeta{Master: "rabbit1", Slaves: []mirror.Slave{{Backend: "rabbit2"}}}
	tests := []struct {
		name                 string
		opts                 Options
		wantCoordinates      bool
		wantTrims1, wantTrim bool
	}{
		{"drop-in without node", Options{}, true, true, true},
		{"drop-in with node", Options{Node: "rabbit1"}, true, true, true},
		{"cluster, beside the master", Options{Node: "rabbit1", Peers: noPeers{}}, true, true, false},
		{"cluster, beside the slave", Options{Node: "rabbit2", Peers: noPeers{}}, false, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRoles(tc.opts)
			if got := r.coordinates(m); got != tc.wantCoordinates {
				t.Errorf("coordinates = %v, want %v", got, tc.wantCoordinates)
			}
			if got := r.trimsHere("rabbit1"); got != tc.wantTrims1 {
				t.Errorf("trimsHere(rabbit1) = %v, want %v", got, tc.wantTrims1)
			}
			if got := r.trimsHere("rabbit2"); got != tc.wantTrim {
				t.Errorf("trimsHere(rabbit2) = %v, want %v", got, tc.wantTrim)
			}
		})
	}
}
