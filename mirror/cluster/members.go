package cluster

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/serf/serf"
)

// Serf tags a proxy publishes about itself. Tags are gossiped with every
// membership message, so they stay small: addresses and names, never
// metadata (which travels in the raft log).
const (
	tagAMQP    = "amqp"    // client-facing AMQP address
	tagAdmin   = "admin"   // admin API address
	tagBackend = "backend" // name of the broker beside the proxy
	tagRaft    = "raft"    // raft transport address
	tagExpect  = "expect"  // BootstrapExpect, so that mismatched settings are noticed
	// tagInLog is "1" once the member's log has a configuration: a cluster
	// exists, and a fresh node must wait to be added instead of
	// bootstrapping.
	tagInLog = "in_log"
)

// Status is a member's liveness as serf sees it.
type Status int

const (
	// StatusAlive: the member answers probes.
	StatusAlive Status = iota
	// StatusLeaving: the member announced a graceful leave and is still up.
	StatusLeaving
	// StatusLeft: the member left gracefully; it is no longer a voter.
	StatusLeft
	// StatusFailed: the member stopped answering probes (crash, kill,
	// partition) without leaving; it stays a voter.
	StatusFailed
)

func (s Status) String() string {
	switch s {
	case StatusAlive:
		return "alive"
	case StatusLeaving:
		return "leaving"
	case StatusLeft:
		return "left"
	case StatusFailed:
		return "failed"
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// Member is one proxy of the cluster: its node name, what it publishes in
// its tags, and its liveness.
type Member struct {
	// Name is the node name (config `node`), also the raft server ID.
	Name string
	// Gossip is the serf address (host:port) the member is reached at.
	Gossip string
	// AMQP and Admin are the proxy's client and admin addresses.
	AMQP, Admin string
	// Backend names the broker beside the proxy.
	Backend string
	// Raft is the member's raft transport address.
	Raft string
	// Expect is the member's BootstrapExpect (0 when it joins an existing
	// cluster).
	Expect int
	// InLog says that the member's metadata log has a configuration (it
	// was bootstrapped or added as a voter).
	InLog  bool
	Status Status
}

func memberFromSerf(m serf.Member) Member {
	status := StatusAlive
	switch m.Status {
	case serf.StatusLeaving:
		status = StatusLeaving
	case serf.StatusLeft:
		status = StatusLeft
	case serf.StatusFailed:
		status = StatusFailed
	}
	expect, _ := strconv.Atoi(m.Tags[tagExpect])
	return Member{
		Name:    m.Name,
		Gossip:  net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port))),
		AMQP:    m.Tags[tagAMQP],
		Admin:   m.Tags[tagAdmin],
		Backend: m.Tags[tagBackend],
		Raft:    m.Tags[tagRaft],
		Expect:  expect,
		InLog:   m.Tags[tagInLog] == "1",
		Status:  status,
	}
}

func membersFromSerf(ms []serf.Member) []Member {
	out := make([]Member, 0, len(ms))
	for _, m := range ms {
		out = append(out, memberFromSerf(m))
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// EventKind says what happened to a member.
type EventKind int

const (
	// EventJoin: a member joined, or came back after a failure.
	EventJoin EventKind = iota
	// EventLeave: a member left gracefully.
	EventLeave
	// EventFail: a member stopped answering and is presumed dead.
	EventFail
	// EventUpdate: a member changed its tags.
	EventUpdate
	// EventReap: a failed or left member was forgotten after
	// Config.ReconnectTimeout (or serf's tombstone timeout).
	EventReap
)

func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventLeave:
		return "leave"
	case EventFail:
		return "fail"
	case EventUpdate:
		return "update"
	case EventReap:
		return "reap"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one membership change of one member.
type Event struct {
	Kind   EventKind
	Member Member
}

func (e Event) String() string { return fmt.Sprintf("%s %s", e.Kind, e.Member.Name) }

// eventsFromSerf flattens a serf member event into one Event per member; it
// returns nothing for user events and queries, which the cluster does not
// use.
func eventsFromSerf(e serf.Event) []Event {
	me, ok := e.(serf.MemberEvent)
	if !ok {
		return nil
	}
	var kind EventKind
	switch me.Type {
	case serf.EventMemberJoin:
		kind = EventJoin
	case serf.EventMemberLeave:
		kind = EventLeave
	case serf.EventMemberFailed:
		kind = EventFail
	case serf.EventMemberUpdate:
		kind = EventUpdate
	case serf.EventMemberReap:
		kind = EventReap
	default:
		return nil
	}
	out := make([]Event, 0, len(me.Members))
	for _, m := range me.Members {
		out = append(out, Event{Kind: kind, Member: memberFromSerf(m)})
	}
	return out
}
