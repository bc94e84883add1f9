package mirror

import (
	"slices"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// HandOver moves a queue's master to one of its synchronised slaves while
// the old master is still up: ha-mode nodes without the master's backend.
type HandOver struct {
	From, To string
}

// Plan is what Reconcile decided for one queue. The shell carries it out
// in this order: declare the queue on every Add backend, record Meta in the
// metadata store (conditional on the version it read), move consumers if
// there is a HandOver, start synchronising Sync, and delete the copies on
// the Drop backends last, so that no copy is deleted before the metadata
// stops naming it.
type Plan struct {
	// Meta is the queue's metadata once the plan is carried out.
	Meta QueueMeta
	// Add are the backends that get a new, unsynchronised slave, in join
	// order (they are the youngest slaves of Meta, in this order).
	Add []string
	// Drop are the backends whose copy is to be deleted: slaves the policy
	// no longer wants, and after a HandOver the old master.
	Drop []string
	// HandOver is set (To != "") when the master moves to a slave.
	HandOver HandOver
	// Sync are the live unsynchronised slaves of Meta to synchronise now:
	// all of them under ha-sync-mode automatic, none under manual.
	Sync []string
}

// Changed reports whether Meta differs from the metadata Reconcile read.
func (p Plan) Changed() bool {
	return len(p.Add) > 0 || len(p.Drop) > 0 || p.HandOver.To != ""
}

// Reconcile compares a queue's metadata with the mirroring its effective
// policy definition asks for, given the configured backends (in
// configuration order) and the live ones, and returns the plan that makes
// them agree. It never changes m.
//
// What the policy asks for (config.Definition, RabbitMQ 3.x semantics):
//
//   - no ha-mode: the master alone; every slave is dropped.
//   - ha-mode all: a slave on every configured backend but the master's.
//   - ha-mode exactly, ha-params N: N copies counting the master, so N-1
//     slaves (N above the backend count means every backend). As in
//     RabbitMQ, only live slaves count when it chooses replacements: if
//     fewer than N-1 slaves are live, new slaves go to live backends that
//     hold no copy, and each replacement takes the slot of a slave on a dead
//     backend (the youngest first). Slaves on dead backends are kept while
//     there is room for them, since their backends come back. If more than
//     N-1 slaves are live (ha-params lowered, a dead slave came back), the
//     youngest are dropped.
//   - ha-mode nodes, ha-params [names]: slaves on the named backends that
//     are configured (other names are ignored), none elsewhere. A master on
//     a backend not named stays master, so that no message is lost, until a
//     named slave is synchronised; then the oldest live synchronised named
//     slave takes over (HandOver) and the epoch rises.
//
// Slaves are only ever added on live backends, unsynchronised, and those
// added together join in ring order: the configured backends after the
// master's, wrapping round. Existing slaves keep their join order. Slaves on
// backends that are no longer configured are dropped in every mode.
//
// A queue whose master is not live is left as it is (an empty plan): the
// first decision for it is Promote, and a queue that waits for its master
// changes nothing until the master is back.
func Reconcile(m QueueMeta, def config.Definition, backends []string, live LiveSet) Plan {
	plan := Plan{Meta: m.Clone()}
	out := &plan.Meta
	if !live.Has(out.Master) {
		return plan
	}
	def = def.WithDefaults()

	// Keep only slaves the policy could want at all. A slave entry on the
	// master's backend or listed twice names the master's (or the first
	// entry's) own copy: it leaves the metadata but its copy is not deleted.
	kept := make([]Slave, 0, len(out.Slaves))
	for _, s := range out.Slaves {
		switch {
		case s.Backend == out.Master || slices.ContainsFunc(kept, func(k Slave) bool { return k.Backend == s.Backend }):
		case !slices.Contains(backends, s.Backend):
			plan.Drop = append(plan.Drop, s.Backend)
		default:
			kept = append(kept, s)
		}
	}

	var want func(backend string) bool // which backends may hold a slave; nil: none
	switch def.HAMode {
	case config.HAAll:
		want = func(string) bool { return true }
	case config.HANodes:
		named := namedBackends(def.HAParams.Nodes, backends)
		want = func(b string) bool { return slices.Contains(named, b) }
		if !want(out.Master) {
			kept = plan.handOver(kept, want, live)
		}
	case config.HAExactly:
		kept = plan.exactly(kept, def.HAParams.Count, backends, live)
	}

	// Drop what the mode does not want, then add the wanted live backends
	// that hold no copy, in ring order after the (possibly new) master.
	// exactly has done both itself.
	if def.HAMode != config.HAExactly {
		n := 0
		for _, s := range kept {
			if want != nil && want(s.Backend) {
				kept[n] = s
				n++
			} else {
				plan.Drop = append(plan.Drop, s.Backend)
			}
		}
		kept = kept[:n]
		if want != nil {
			for _, b := range ringAfter(backends, out.Master) {
				if want(b) && live.Has(b) && !holds(out.Master, kept, b) {
					kept = append(kept, Slave{Backend: b})
					plan.Add = append(plan.Add, b)
				}
			}
		}
	}
	if plan.HandOver.To != "" {
		plan.Drop = append(plan.Drop, plan.HandOver.From)
	}
	out.Slaves = kept
	if len(out.Slaves) == 0 {
		out.Slaves = nil
	}

	if AutomaticSync(def) {
		for _, s := range out.Slaves {
			if !s.Synchronised && live.Has(s.Backend) {
				plan.Sync = append(plan.Sync, s.Backend)
			}
		}
	}
	return plan
}

// handOver makes the oldest live synchronised slave that want accepts the
// master, if there is one, and returns the slaves without it.
func (p *Plan) handOver(slaves []Slave, want func(string) bool, live LiveSet) []Slave {
	i := slices.IndexFunc(slaves, func(s Slave) bool {
		return s.Synchronised && live.Has(s.Backend) && want(s.Backend)
	})
	if i < 0 {
		return slaves
	}
	p.HandOver = HandOver{From: p.Meta.Master, To: slaves[i].Backend}
	p.Meta.Master = slaves[i].Backend
	p.Meta.Epoch++
	return slices.Delete(slaves, i, i+1)
}

// exactly applies ha-mode exactly with count copies to slaves (already
// limited to configured backends) and returns the slaves to keep, the new
// ones last; it records what it adds and drops in p.
func (p *Plan) exactly(slaves []Slave, count int, backends []string, live LiveSet) []Slave {
	want := max(min(count, len(backends))-1, 0)

	// The oldest live slaves keep their places; younger live ones beyond
	// the count go.
	keep := make([]bool, len(slaves))
	liveKept := 0
	for i, s := range slaves {
		if live.Has(s.Backend) && liveKept < want {
			keep[i] = true
			liveKept++
		}
	}
	// Replacements on live backends without a copy, in ring order.
	var added []Slave
	for _, b := range ringAfter(backends, p.Meta.Master) {
		if liveKept+len(added) >= want {
			break
		}
		if live.Has(b) && !holds(p.Meta.Master, slaves, b) {
			added = append(added, Slave{Backend: b})
			p.Add = append(p.Add, b)
		}
	}
	// Slaves on dead backends fill the slots left, oldest first.
	room := want - liveKept - len(added)
	for i, s := range slaves {
		if !live.Has(s.Backend) && room > 0 {
			keep[i] = true
			room--
		}
	}
	out := make([]Slave, 0, want)
	for i, s := range slaves {
		if keep[i] {
			out = append(out, s)
		} else {
			p.Drop = append(p.Drop, s.Backend)
		}
	}
	return append(out, added...)
}

// namedBackends returns the configured backends among names, in the order
// of names, each once.
func namedBackends(names, backends []string) []string {
	var out []string
	for _, n := range names {
		if slices.Contains(backends, n) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func holds(master string, slaves []Slave, backend string) bool {
	return master == backend || slices.ContainsFunc(slaves, func(s Slave) bool { return s.Backend == backend })
}
