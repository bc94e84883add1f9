package store

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestStoreVotersOfASingleVoter(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	id, addr := s.Leader()
	if id != "rabbit1" || addr == "" {
		t.Errorf("Leader() = %q, %q; want rabbit1 and its address", id, addr)
	}
	voters, err := s.Voters()
	if err != nil {
		t.Fatal(err)
	}
	if want := []Voter{{ID: "rabbit1", Address: addr}}; !reflect.DeepEqual(voters, want) {
		t.Errorf("Voters() = %+v, want %+v", voters, want)
	}
	if err := s.Bootstrap([]Voter{{ID: "rabbit2", Address: "elsewhere"}}); !errors.Is(err, raft.ErrCantBootstrap) {
		t.Errorf("Bootstrap of a store with state: err = %v, want raft.ErrCantBootstrap", err)
	}
}

// LeaderChanges signals when this store stops leading; stopping it closes
// the channel and may be repeated.
func TestStoreLeaderChanges(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	changes, stop := s.LeaderChanges()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changes:
	case <-time.After(5 * time.Second):
		t.Fatal("no leader change signalled when the only voter shut down")
	}
	stop()
	stop()
	closed := make(chan struct{})
	go func() {
		for range changes { // a value may still be buffered
		}
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Errorf("channel still open after stop")
	}
}
