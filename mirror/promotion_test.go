package mirror

import (
	"slices"
	"strings"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

func promoteOn(failure, shutdown config.PromoteMode) config.Definition {
	return config.Definition{HAMode: config.HAAll, PromoteOnFailure: failure, PromoteOnShutdown: shutdown}
}

func TestPromote(t *testing.T) {
	all := def(config.HAAll)
	tests := []struct {
		name   string
		meta   QueueMeta
		live   []string
		cause  Cause
		def    config.Definition
		want   QueueMeta
		to     string // "" when nobody is promoted
		synced bool
		reason string // a phrase the reason must contain
	}{
		// The seed: queue_2 mastered on rabbit2 with slaves rabbit3, rabbit1
		// (ring order, synchronised); rabbit2 is stopped.
		{name: "seed: rabbit2 stopped, queue_2's oldest slave rabbit3 becomes master",
			meta: queue("rabbit2", "rabbit3+", "rabbit1+"), live: []string{"rabbit1", "rabbit3"}, cause: CauseShutdown, def: all,
			want: withEpoch(queue("rabbit3", "rabbit1+"), 1), to: "rabbit3", synced: true, reason: "oldest live synchronised"},
		{name: "seed: rabbit2 crashes, same promotion",
			meta: queue("rabbit2", "rabbit3+", "rabbit1+"), live: []string{"rabbit1", "rabbit3"}, cause: CauseFailure, def: all,
			want: withEpoch(queue("rabbit3", "rabbit1+"), 1), to: "rabbit3", synced: true},
		{name: "the oldest synchronised slave beats an older unsynchronised one",
			meta: withEpoch(queue("rabbit1", "rabbit2", "rabbit3+"), 3), live: []string{"rabbit2", "rabbit3"}, cause: CauseFailure, def: all,
			want: withEpoch(queue("rabbit3", "rabbit2"), 4), to: "rabbit3", synced: true},
		{name: "a synchronised slave on a dead backend is skipped and loses its synchronised mark",
			meta: queue("rabbit1", "rabbit2+", "rabbit3+", "rabbit4"), live: []string{"rabbit3", "rabbit4"}, cause: CauseFailure, def: all,
			want: withEpoch(queue("rabbit3", "rabbit2", "rabbit4"), 1), to: "rabbit3", synced: true},

		{name: "failure, none synchronised, default always: oldest live slave, messages lost",
			meta: queue("rabbit1", "rabbit2", "rabbit3"), live: []string{"rabbit2", "rabbit3"}, cause: CauseFailure, def: all,
			want: withEpoch(queue("rabbit2", "rabbit3"), 1), to: "rabbit2", reason: "are lost"},
		{name: "failure, none synchronised, always: a dead older slave is passed over",
			meta: queue("rabbit1", "rabbit2", "rabbit3"), live: []string{"rabbit3"}, cause: CauseFailure, def: all,
			want: withEpoch(queue("rabbit3", "rabbit2"), 1), to: "rabbit3"},
		{name: "failure, none synchronised, ha-promote-on-failure when-synced: waits",
			meta: queue("rabbit1", "rabbit2", "rabbit3"), live: []string{"rabbit2", "rabbit3"}, cause: CauseFailure, def: promoteOn(config.PromoteWhenSynced, config.PromoteUnset),
			want: queue("rabbit1", "rabbit2", "rabbit3"), reason: "waits"},
		{name: "shutdown, none synchronised, default when-synced: waits",
			meta: queue("rabbit1", "rabbit2", "rabbit3"), live: []string{"rabbit2", "rabbit3"}, cause: CauseShutdown, def: all,
			want: queue("rabbit1", "rabbit2", "rabbit3"), reason: "ha-promote-on-shutdown is when-synced"},
		{name: "shutdown, none synchronised, ha-promote-on-shutdown always: promotes",
			meta: queue("rabbit1", "rabbit2", "rabbit3"), live: []string{"rabbit2", "rabbit3"}, cause: CauseShutdown, def: promoteOn(config.PromoteUnset, config.PromoteAlways),
			want: withEpoch(queue("rabbit2", "rabbit3"), 1), to: "rabbit2"},
		{name: "shutdown with a synchronised slave promotes whatever the mode",
			meta: queue("rabbit1", "rabbit2", "rabbit3+"), live: []string{"rabbit2", "rabbit3"}, cause: CauseShutdown, def: promoteOn(config.PromoteWhenSynced, config.PromoteWhenSynced),
			want: withEpoch(queue("rabbit3", "rabbit2"), 1), to: "rabbit3", synced: true},
		{name: "definition without ha-mode: RabbitMQ's defaults apply",
			meta: queue("rabbit1", "rabbit2"), live: []string{"rabbit2"}, cause: CauseFailure, def: config.Definition{},
			want: withEpoch(queue("rabbit2"), 1), to: "rabbit2"},

		{name: "no slave: waits",
			meta: queue("rabbit1"), live: []string{"rabbit2", "rabbit3"}, cause: CauseFailure, def: config.Definition{},
			want: queue("rabbit1"), reason: "no live slave"},
		{name: "every slave dead: waits, even with always",
			meta: queue("rabbit1", "rabbit2+", "rabbit3"), live: nil, cause: CauseFailure, def: all,
			want: queue("rabbit1", "rabbit2+", "rabbit3"), reason: "no live slave"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.meta.Clone()
			p := Promote(tt.meta, NewLiveSet(tt.live...), tt.cause, tt.def)
			checkUntouched(t, before, tt.meta)
			checkMeta(t, p.Meta, tt.want)
			if p.From != tt.meta.Master || p.To != tt.to {
				t.Errorf("From, To = %q, %q; want %q, %q", p.From, p.To, tt.meta.Master, tt.to)
			}
			if p.Promoted() != (tt.to != "") {
				t.Errorf("Promoted() = %v, want %v", p.Promoted(), tt.to != "")
			}
			if p.Synchronised != tt.synced {
				t.Errorf("Synchronised = %v, want %v", p.Synchronised, tt.synced)
			}
			if wantLoss := tt.to != "" && !tt.synced; p.LosesMessages() != wantLoss {
				t.Errorf("LosesMessages() = %v, want %v", p.LosesMessages(), wantLoss)
			}
			if p.Meta.Holds(tt.meta.Master) && p.Promoted() {
				t.Errorf("old master %s still holds a copy in %s", tt.meta.Master, describe(p.Meta))
			}
			if !strings.Contains(p.Reason, tt.reason) {
				t.Errorf("Reason = %q, want it to contain %q", p.Reason, tt.reason)
			}
			// Only the want of a live slave is worth deciding again.
			if want := tt.reason == "no live slave"; p.NoLiveSlave != want {
				t.Errorf("NoLiveSlave = %v, want %v", p.NoLiveSlave, want)
			}
		})
	}
}

func TestRejoin(t *testing.T) {
	tests := []struct {
		name    string
		meta    QueueMeta
		backend string
		want    QueueMeta
		joined  bool
	}{
		// The seed, continued: rabbit2 comes back after queue_2 moved to
		// rabbit3; its stale copy is purged and it is the youngest slave.
		{name: "seed: old master rabbit2 returns as the youngest slave",
			meta: withEpoch(queue("rabbit3", "rabbit1+"), 1), backend: "rabbit2",
			want: withEpoch(queue("rabbit3", "rabbit1+", "rabbit2"), 1), joined: true},
		{name: "a returning slave moves to the youngest place, unsynchronised",
			meta: queue("rabbit1", "rabbit2+", "rabbit3+"), backend: "rabbit2",
			want: queue("rabbit1", "rabbit3+", "rabbit2"), joined: true},
		{name: "the youngest slave returning stays youngest",
			meta: queue("rabbit1", "rabbit2+", "rabbit3"), backend: "rabbit3",
			want: queue("rabbit1", "rabbit2+", "rabbit3"), joined: true},
		{name: "the master returning (the queue waited for it): nothing changes",
			meta: queue("rabbit1", "rabbit2"), backend: "rabbit1",
			want: queue("rabbit1", "rabbit2")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.meta.Clone()
			r := Rejoin(tt.meta, tt.backend)
			checkUntouched(t, before, tt.meta)
			checkMeta(t, r.Meta, tt.want)
			if r.Joined != tt.joined || r.Purge != tt.joined {
				t.Errorf("Joined, Purge = %v, %v; want %v, %v (a joining copy is always purged)", r.Joined, r.Purge, tt.joined, tt.joined)
			}
		})
	}
}

func TestSlaveLost(t *testing.T) {
	tests := []struct {
		name    string
		meta    QueueMeta
		backend string
		want    QueueMeta
		changed bool
	}{
		{name: "synchronised slave keeps its place, unsynchronised", meta: queue("rabbit1", "rabbit2+", "rabbit3+"), backend: "rabbit2",
			want: queue("rabbit1", "rabbit2", "rabbit3+"), changed: true},
		{name: "unsynchronised slave: nothing to change", meta: queue("rabbit1", "rabbit2"), backend: "rabbit2",
			want: queue("rabbit1", "rabbit2")},
		{name: "not a slave", meta: queue("rabbit1", "rabbit2+"), backend: "rabbit3",
			want: queue("rabbit1", "rabbit2+")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.meta.Clone()
			got, changed := SlaveLost(tt.meta, tt.backend)
			checkUntouched(t, before, tt.meta)
			checkMeta(t, got, tt.want)
			if changed != tt.changed {
				t.Errorf("changed = %v, want %v", changed, tt.changed)
			}
		})
	}
}

// The seed's walkthrough end to end through the decisions: place
// queue_1..3, mirror them with ha-mode all, stop rabbit2, bring it back.
func TestSeedWalkthrough(t *testing.T) {
	all := def(config.HAAll)
	live := NewLiveSet(seedBackends...)
	var queues []QueueMeta
	for _, name := range []string{"queue_1", "queue_2", "queue_3"} {
		master, err := Placement{Backends: seedBackends, Live: live, Masters: CountMasters(queues)}.Master(config.LocatorMinMasters)
		if err != nil {
			t.Fatal(err)
		}
		plan := Reconcile(QueueMeta{ID: QueueID{VHost: "/", Name: name}, Master: master}, all, seedBackends, live)
		// The queues are empty, so each new slave is synchronised at once.
		m := plan.Meta
		for _, b := range plan.Add {
			if (Backlog{Held: 0}).CaughtUp(true) {
				m, _ = MarkSynchronised(m, b)
			}
		}
		queues = append(queues, m)
	}
	wantMirrored := []string{
		"master rabbit1 rabbit2+ rabbit3+, epoch 0",
		"master rabbit2 rabbit3+ rabbit1+, epoch 0",
		"master rabbit3 rabbit1+ rabbit2+, epoch 0",
	}
	for i, q := range queues {
		if got := describe(q); got != wantMirrored[i] {
			t.Errorf("%s after the policy: %s, want %s", q.ID.Name, got, wantMirrored[i])
		}
	}

	// rabbitmqctl stop_app on rabbit2.
	delete(live, "rabbit2")
	for i, q := range queues {
		if q.Master == "rabbit2" {
			p := Promote(q, live, CauseShutdown, all)
			if !p.Promoted() {
				t.Fatalf("%s not promoted: %s", q.ID.Name, p.Reason)
			}
			queues[i] = p.Meta
		} else {
			queues[i], _ = SlaveLost(q, "rabbit2")
		}
		queues[i] = Reconcile(queues[i], all, seedBackends, live).Meta
	}
	wantStopped := []string{
		"master rabbit1 rabbit2 rabbit3+, epoch 0",
		"master rabbit3 rabbit1+, epoch 1",
		"master rabbit3 rabbit1+ rabbit2, epoch 0",
	}
	for i, q := range queues {
		if got := describe(q); got != wantStopped[i] {
			t.Errorf("%s with rabbit2 stopped: %s, want %s", q.ID.Name, got, wantStopped[i])
		}
	}

	// rabbitmqctl start_app on rabbit2: it rejoins every queue as the
	// youngest slave, purged.
	live["rabbit2"] = true
	for i, q := range queues {
		r := Rejoin(q, "rabbit2")
		if !r.Purge {
			t.Errorf("%s: rabbit2's copy not purged on rejoin", q.ID.Name)
		}
		queues[i] = Reconcile(r.Meta, all, seedBackends, live).Meta
	}
	wantBack := []string{
		"master rabbit1 rabbit3+ rabbit2, epoch 0",
		"master rabbit3 rabbit1+ rabbit2, epoch 1",
		"master rabbit3 rabbit1+ rabbit2, epoch 0",
	}
	for i, q := range queues {
		if got := describe(q); got != wantBack[i] {
			t.Errorf("%s with rabbit2 back: %s, want %s", q.ID.Name, got, wantBack[i])
		}
	}
}

// ha-mode exactly 2 over the seed's three backends, through a failure and a
// return: the promoted slave gets a replacement mirror on the third
// backend, and the old master, back and purged, is the copy too many.
func TestExactlyTwoThroughFailover(t *testing.T) {
	two := exactly(2)
	live := NewLiveSet(seedBackends...)
	m := Reconcile(queue("rabbit1"), two, seedBackends, live).Meta
	m, _ = MarkSynchronised(m, "rabbit2")
	if got, want := describe(m), "master rabbit1 rabbit2+, epoch 0"; got != want {
		t.Fatalf("mirrored: %s, want %s", got, want)
	}

	delete(live, "rabbit1")
	p := Promote(m, live, CauseFailure, two)
	plan := Reconcile(p.Meta, two, seedBackends, live)
	if got, want := describe(plan.Meta), "master rabbit2 rabbit3, epoch 1"; got != want || !slices.Equal(plan.Add, []string{"rabbit3"}) {
		t.Fatalf("after rabbit1 failed: %s adding %v, want %s adding [rabbit3]", got, plan.Add, want)
	}
	m, _ = MarkSynchronised(plan.Meta, "rabbit3")

	live["rabbit1"] = true
	r := Rejoin(m, "rabbit1")
	plan = Reconcile(r.Meta, two, seedBackends, live)
	if got, want := describe(plan.Meta), "master rabbit2 rabbit3+, epoch 1"; got != want || !slices.Equal(plan.Drop, []string{"rabbit1"}) {
		t.Errorf("after rabbit1 returned: %s dropping %v, want %s dropping [rabbit1]", got, plan.Drop, want)
	}
}
