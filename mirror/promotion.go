package mirror

import (
	"fmt"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// Cause is why a queue's master backend went away; it selects which
// ha-promote-on-* key decides when no slave is synchronised.
type Cause uint8

// Causes of losing a master.
const (
	// CauseFailure: the backend crashed, reset its connections or stopped
	// answering for failover_grace. ha-promote-on-failure decides.
	CauseFailure Cause = iota
	// CauseShutdown: a controlled stop (the operator stopped the backend or
	// its proxy left the cluster gracefully). ha-promote-on-shutdown decides.
	CauseShutdown
)

var causeNames = []string{"failure", "shutdown"}

func (c Cause) String() string { return enumName(causeNames, int(c)) }

// Promotion is what Promote decided.
type Promotion struct {
	// Meta is the queue's metadata afterwards; equal to the input (a copy)
	// when nobody was promoted.
	Meta QueueMeta
	// From is the lost master; To the promoted slave, "" when the queue
	// waits for its master instead.
	From, To string
	// Synchronised tells whether To was a synchronised slave. When it was
	// not, messages only the old master held are lost (RabbitMQ's
	// behaviour with ha-promote-on-*: always), and
	// the shell should say so in its log.
	Synchronised bool
	// Reason explains the decision in words, for logs and `ctl`.
	Reason string
	// NoLiveSlave is set when nobody was promoted because no slave's
	// backend counted as live: a slave whose backend comes back while
	// the master is still lost can be promoted then.
	NoLiveSlave bool
}

// Promoted reports whether a slave became master.
func (p Promotion) Promoted() bool { return p.To != "" }

// LosesMessages reports whether the promotion loses the messages only the
// old master held (an unsynchronised slave was promoted).
func (p Promotion) LosesMessages() bool { return p.Promoted() && !p.Synchronised }

// Promote decides what happens to a queue whose master's backend was lost
// for cause; live is the set of live backends after the loss and def the
// queue's effective policy definition. It never changes m.
//
//   - The oldest live synchronised slave becomes master; the epoch rises.
//   - With no live synchronised slave, the promote mode decides:
//     ha-promote-on-failure for CauseFailure (default always),
//     ha-promote-on-shutdown for CauseShutdown (default when-synced).
//     always promotes the oldest live slave, and messages only the old
//     master held are lost; when-synced promotes nobody and the queue
//     waits for its master to come back.
//   - With no live slave at all, nobody is promoted.
//
// The old master is not a slave afterwards: its copy is stale (it misses
// what was published and holds what was acked since), so when its backend
// returns it comes back through Rejoin, purged. Slaves whose backends are
// not live are marked unsynchronised for the same reason (see SlaveLost).
func Promote(m QueueMeta, live LiveSet, cause Cause, def config.Definition) Promotion {
	p := Promotion{Meta: m.Clone(), From: m.Master}
	out := &p.Meta

	chosen := -1
	for i, s := range out.Slaves {
		if s.Synchronised && live.Has(s.Backend) {
			chosen = i
			break
		}
	}
	if chosen >= 0 {
		p.Synchronised = true
		p.Reason = fmt.Sprintf("master %s lost (%s): promoted %s, the oldest live synchronised slave", m.Master, cause, out.Slaves[chosen].Backend)
	} else {
		mode := promoteMode(def, cause)
		oldestLive := -1
		for i, s := range out.Slaves {
			if live.Has(s.Backend) {
				oldestLive = i
				break
			}
		}
		switch {
		case oldestLive < 0:
			p.Reason = fmt.Sprintf("master %s lost (%s): no live slave to promote; the queue waits for its master or a slave's backend", m.Master, cause)
			p.NoLiveSlave = true
			return p
		case mode == config.PromoteWhenSynced:
			p.Reason = fmt.Sprintf("master %s lost (%s): no synchronised slave and ha-promote-on-%s is when-synced; the queue waits for its master", m.Master, cause, cause)
			return p
		}
		chosen = oldestLive
		p.Reason = fmt.Sprintf("master %s lost (%s): no synchronised slave, ha-promote-on-%s is always: promoted %s, the oldest live slave; messages only %s held are lost", m.Master, cause, cause, out.Slaves[chosen].Backend, m.Master)
	}

	p.To = out.Slaves[chosen].Backend
	out.Master = p.To
	out.Epoch++
	slaves := make([]Slave, 0, len(out.Slaves)-1)
	for i, s := range out.Slaves {
		if i == chosen {
			continue
		}
		if !live.Has(s.Backend) {
			s.Synchronised = false
		}
		slaves = append(slaves, s)
	}
	out.Slaves = slaves
	if len(out.Slaves) == 0 {
		out.Slaves = nil
	}
	return p
}

// promoteMode returns the ha-promote-on-* mode that applies to cause, with
// RabbitMQ's defaults for unset keys (also for unmirrored definitions,
// whose defaults WithDefaults leaves unset).
func promoteMode(def config.Definition, cause Cause) config.PromoteMode {
	if cause == CauseShutdown {
		if def.PromoteOnShutdown == config.PromoteUnset {
			return config.PromoteWhenSynced
		}
		return def.PromoteOnShutdown
	}
	if def.PromoteOnFailure == config.PromoteUnset {
		return config.PromoteAlways
	}
	return def.PromoteOnFailure
}

// SlaveLost returns the metadata after the backend of one of the queue's
// slaves was lost: the slave stays listed, in its place, but is no longer
// synchronised, since it misses every publish and every ack from now on.
// It never changes m. Whether an ha-mode exactly queue replaces it is
// Reconcile's decision. changed is false when backend is no synchronised
// slave of the queue.
func SlaveLost(m QueueMeta, backend string) (out QueueMeta, changed bool) {
	out = m.Clone()
	if i := out.SlaveIndex(backend); i >= 0 && out.Slaves[i].Synchronised {
		out.Slaves[i].Synchronised = false
		changed = true
	}
	return out, changed
}

// Rejoining is what Rejoin decided.
type Rejoining struct {
	// Meta is the queue's metadata afterwards.
	Meta QueueMeta
	// Purge is set when the backend's copy must be purged before it counts
	// as a slave: it is stale.
	Purge bool
	// Joined is set when the backend became a slave (or moved to the
	// youngest place); false when nothing changes.
	Joined bool
}

// Rejoin decides what happens when backend, which held a copy of the
// queue, is back: typically the old master after a promotion, or a slave
// whose backend was down. It never changes m.
//
//   - The queue's master: nothing changes (the queue waited for it).
//   - Otherwise the backend becomes the youngest slave, unsynchronised,
//     and its copy must be purged first: while it was away it missed
//     publishes and kept messages that were acked, so nothing it holds can
//     be trusted. A slave that was listed moves to the youngest place, as a
//     RabbitMQ mirror that restarts is a new mirror; so an ha-mode exactly
//     queue that replaced it meanwhile drops the returning copy (the
//     youngest live one) rather than the replacement that has synchronised.
//
// Rejoin does not look at the policy: Reconcile afterwards drops the slave
// again when the policy does not want one there.
func Rejoin(m QueueMeta, backend string) Rejoining {
	r := Rejoining{Meta: m.Clone()}
	out := &r.Meta
	if backend == out.Master || backend == "" {
		return r
	}
	if i := out.SlaveIndex(backend); i >= 0 {
		out.Slaves = append(out.Slaves[:i], out.Slaves[i+1:]...)
	}
	out.Slaves = append(out.Slaves, Slave{Backend: backend})
	r.Purge, r.Joined = true, true
	return r
}
