package store

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/raft"
)

// This file holds what the sidecar cluster (package mirror/cluster) needs of
// the Store beyond reads and writes: who leads, who votes, and changing the
// voters as serf membership changes. Only the leader may change the voters;
// raft applies one change at a time and each one through the log, so every
// proxy sees the same sequence of configurations.

// Voter is one voting member of the metadata log.
type Voter struct {
	// ID is the proxy's node name (the backend beside it).
	ID string
	// Address is where its raft transport listens (host:port).
	Address string
}

// Leader returns the node name and raft address of the log's current leader
// as this proxy knows it, or empty strings when it knows none (an election
// is in progress, or this proxy is on the minority side of a partition: a
// follower forgets its leader once the leader's heartbeats stop, and a
// leader that cannot reach a majority steps down).
func (s *Store) Leader() (id, address string) {
	addr, leaderID := s.raft.LeaderWithID()
	return string(leaderID), string(addr)
}

// Voters returns the voters of the latest configuration this proxy knows,
// sorted by ID; none when the log was never bootstrapped here.
func (s *Store) Voters() ([]Voter, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("reading the metadata log's voters: %w", s.raftError(err))
	}
	var voters []Voter
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			voters = append(voters, Voter{ID: string(srv.ID), Address: string(srv.Address)})
		}
	}
	slices.SortFunc(voters, func(a, b Voter) int { return strings.Compare(a.ID, b.ID) })
	return voters, nil
}

// Bootstrap starts a new log whose first configuration is exactly voters.
// It is for a store opened with Config.JoinCluster, at the beginning of
// time only: a store with any state refuses (raft.ErrCantBootstrap), which
// the caller may ignore.
func (s *Store) Bootstrap(voters []Voter) error {
	var conf raft.Configuration
	for _, v := range voters {
		conf.Servers = append(conf.Servers, raft.Server{
			Suffrage: raft.Voter, ID: raft.ServerID(v.ID), Address: raft.ServerAddress(v.Address),
		})
	}
	if err := s.raft.BootstrapCluster(conf).Error(); err != nil {
		return fmt.Errorf("bootstrapping the metadata log with %d voters: %w", len(voters), s.raftError(err))
	}
	return nil
}

// AddVoter makes v a voter, or updates its address when it already votes
// (a proxy restarted on another port). Only the leader can; others get
// ErrNotLeader.
func (s *Store) AddVoter(v Voter) error {
	f := s.raft.AddVoter(raft.ServerID(v.ID), raft.ServerAddress(v.Address), 0, s.timeout)
	if err := f.Error(); err != nil {
		return fmt.Errorf("adding voter %s at %s: %w", v.ID, v.Address, s.raftError(err))
	}
	return nil
}

// RemoveVoter removes the node from the configuration. Only the leader can;
// others get ErrNotLeader. A leader that removes itself steps down once the
// change is committed.
func (s *Store) RemoveVoter(id string) error {
	if err := s.raft.RemoveServer(raft.ServerID(id), 0, s.timeout).Error(); err != nil {
		return fmt.Errorf("removing voter %s: %w", id, s.raftError(err))
	}
	return nil
}

// LeaderChanges returns a channel that receives a value whenever this
// proxy's view of the leader changes (elected, lost, stepped down), and a
// function that stops the notifications. The channel holds one value: a
// slow reader sees one value for many changes, and raft never waits for it.
// Read Leader after a value arrives.
func (s *Store) LeaderChanges() (<-chan struct{}, func()) {
	observations := make(chan raft.Observation, 1)
	observer := raft.NewObserver(observations, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	s.raft.RegisterObserver(observer)
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	stopped := make(chan struct{})
	// The relay turns observations (which raft drops when the buffer is
	// full) into a coalesced signal the caller can stop reading at any time.
	go func() {
		defer close(stopped)
		defer close(out)
		signal := func() {
			select {
			case out <- struct{}{}:
			default:
			}
		}
		closed := s.closed
		for {
			select {
			case <-observations:
				signal()
			case <-closed:
				// A closed store leads no more. raft may not say so: a
				// leader stepping down clears its own leader ID without
				// an observation, and the shutdown's clear then finds
				// nothing to change.
				signal()
				closed = nil
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return out, func() {
		once.Do(func() {
			s.raft.DeregisterObserver(observer)
			close(done)
			<-stopped
		})
	}
}

// raftError maps raft's errors onto the store's vocabulary.
func (s *Store) raftError(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	}
	return err
}
