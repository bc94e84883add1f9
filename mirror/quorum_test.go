package mirror

import (
	"slices"
	"testing"
)

func TestPublishTargetsAndQuorum(t *testing.T) {
	tests := []struct {
		name    string
		meta    QueueMeta
		live    []string
		targets []string
		quorum  []string
	}{
		{name: "unmirrored queue", meta: queue("rabbit1"), live: seedBackends,
			targets: []string{"rabbit1"}, quorum: []string{"rabbit1"}},
		{name: "seed: all synchronised", meta: queue("rabbit2", "rabbit3+", "rabbit1+"), live: seedBackends,
			targets: []string{"rabbit2", "rabbit3", "rabbit1"}, quorum: []string{"rabbit2", "rabbit3", "rabbit1"}},
		{name: "an unsynchronised slave is a target but not in the quorum", meta: queue("rabbit1", "rabbit2", "rabbit3+"), live: seedBackends,
			targets: []string{"rabbit1", "rabbit2", "rabbit3"}, quorum: []string{"rabbit1", "rabbit3"}},
		{name: "a slave on a dead backend is neither", meta: queue("rabbit1", "rabbit2+", "rabbit3+"), live: []string{"rabbit1", "rabbit3"},
			targets: []string{"rabbit1", "rabbit3"}, quorum: []string{"rabbit1", "rabbit3"}},
		{name: "master down: publishes reach the slaves, the quorum still needs a master", meta: queue("rabbit1", "rabbit2+", "rabbit3"), live: []string{"rabbit2", "rabbit3"},
			targets: []string{"rabbit2", "rabbit3"}, quorum: []string{"rabbit1", "rabbit2"}},
		{name: "nothing live", meta: queue("rabbit1", "rabbit2+"), live: nil,
			targets: nil, quorum: []string{"rabbit1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			live := NewLiveSet(tt.live...)
			before := tt.meta.Clone()
			prefix := []string{"kept"}
			if got := AppendPublishTargets(slices.Clone(prefix), &tt.meta, live); !slices.Equal(got, append(prefix, tt.targets...)) {
				t.Errorf("AppendPublishTargets = %v, want %v", got, append(prefix, tt.targets...))
			}
			if got := AppendConfirmQuorum(slices.Clone(prefix), &tt.meta, live); !slices.Equal(got, append(prefix, tt.quorum...)) {
				t.Errorf("AppendConfirmQuorum = %v, want %v", got, append(prefix, tt.quorum...))
			}
			checkUntouched(t, before, tt.meta)
		})
	}
}

func TestDecideConfirm(t *testing.T) {
	seed := queue("rabbit2", "rabbit3+", "rabbit1")
	tests := []struct {
		name    string
		meta    QueueMeta
		live    []string
		answers map[string]Answer
		want    Verdict
	}{
		{name: "nobody answered", meta: seed, live: seedBackends, want: VerdictPending},
		{name: "master only", meta: seed, live: seedBackends,
			answers: map[string]Answer{"rabbit2": AnswerAck}, want: VerdictPending},
		{name: "master and the synchronised slave: ack, the unsynchronised one is not waited for", meta: seed, live: seedBackends,
			answers: map[string]Answer{"rabbit2": AnswerAck, "rabbit3": AnswerAck}, want: VerdictAck},
		{name: "synchronised slave without the master: pending", meta: seed, live: seedBackends,
			answers: map[string]Answer{"rabbit3": AnswerAck, "rabbit1": AnswerAck}, want: VerdictPending},
		{name: "master nack nacks at once", meta: seed, live: seedBackends,
			answers: map[string]Answer{"rabbit2": AnswerNack}, want: VerdictNack},
		{name: "synchronised slave nack nacks", meta: seed, live: seedBackends,
			answers: map[string]Answer{"rabbit2": AnswerAck, "rabbit3": AnswerNack}, want: VerdictNack},
		{name: "unsynchronised slave nack is ignored", meta: seed, live: seedBackends,
			answers: map[string]Answer{"rabbit2": AnswerAck, "rabbit3": AnswerAck, "rabbit1": AnswerNack}, want: VerdictAck},
		{name: "synchronised slave's backend died: no longer waited for", meta: seed, live: []string{"rabbit1", "rabbit2"},
			answers: map[string]Answer{"rabbit2": AnswerAck}, want: VerdictAck},
		{name: "master down: nothing is confirmed", meta: queue("rabbit1", "rabbit2+"), live: []string{"rabbit2"},
			answers: map[string]Answer{"rabbit2": AnswerAck}, want: VerdictPending},
		{name: "after promotion the new master's ack confirms what the slaves got", meta: withEpoch(queue("rabbit2", "rabbit3"), 1), live: []string{"rabbit2", "rabbit3"},
			answers: map[string]Answer{"rabbit2": AnswerAck}, want: VerdictAck},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DecideConfirm(&tt.meta, NewLiveSet(tt.live...), func(b string) Answer { return tt.answers[b] })
			if got != tt.want {
				t.Errorf("DecideConfirm with answers %v = %s, want %s", tt.answers, got, tt.want)
			}
		})
	}
}

func TestEnumStrings(t *testing.T) {
	tests := []struct{ got, want string }{
		{AnswerAck.String(), "ack"},
		{VerdictNack.String(), "nack"},
		{CauseShutdown.String(), "shutdown"},
		{Answer(9).String(), "unknown(9)"},
		{Verdict(200).String(), "unknown(200)"},
		{Cause(3).String(), "unknown(3)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("String() = %q, want %q", tt.got, tt.want)
		}
	}
}

// perPublish runs the three per-publish decisions once, appending into
// reused slices, as the proxy does for each message.
func perPublish(m *QueueMeta, live LiveSet, targets, quorum []string, answer func(string) Answer) ([]string, []string, Verdict) {
	targets = AppendPublishTargets(targets[:0], m, live)
	quorum = AppendConfirmQuorum(quorum[:0], m, live)
	return targets, quorum, DecideConfirm(m, live, answer)
}

// The per-publish decisions allocate nothing once the caller's slices have
// grown: this is the design, not a measurement that may drift.
func TestPerPublishDecisionsDoNotAllocate(t *testing.T) {
	m := queue("rabbit1", "rabbit2+", "rabbit3", "rabbit4+", "rabbit5+")
	live := NewLiveSet("rabbit1", "rabbit2", "rabbit3", "rabbit5")
	targets := make([]string, 0, 8)
	quorum := make([]string, 0, 8)
	acked := func(string) Answer { return AnswerAck }
	var verdict Verdict
	allocs := testing.AllocsPerRun(1000, func() {
		targets, quorum, verdict = perPublish(&m, live, targets, quorum, acked)
	})
	if allocs != 0 {
		t.Errorf("per-publish decisions allocate %.1f times per publish, want 0", allocs)
	}
	if want := []string{"rabbit1", "rabbit2", "rabbit3", "rabbit5"}; !slices.Equal(targets, want) {
		t.Errorf("targets = %v, want %v", targets, want)
	}
	if want := []string{"rabbit1", "rabbit2", "rabbit5"}; !slices.Equal(quorum, want) {
		t.Errorf("quorum = %v, want %v", quorum, want)
	}
	if verdict != VerdictAck {
		t.Errorf("verdict = %s, want ack", verdict)
	}
}

// benchQueue is a queue mirrored on five backends, one of them down and one
// slave unsynchronised: every branch of the per-publish decisions runs.
func benchQueue() (QueueMeta, LiveSet) {
	return queue("rabbit1", "rabbit2+", "rabbit3", "rabbit4+", "rabbit5+"),
		NewLiveSet("rabbit1", "rabbit2", "rabbit3", "rabbit5")
}

func BenchmarkAppendPublishTargets(b *testing.B) {
	m, live := benchQueue()
	dst := make([]string, 0, 8)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendPublishTargets(dst[:0], &m, live)
	}
}

func BenchmarkAppendConfirmQuorum(b *testing.B) {
	m, live := benchQueue()
	dst := make([]string, 0, 8)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendConfirmQuorum(dst[:0], &m, live)
	}
}

func BenchmarkDecideConfirm(b *testing.B) {
	m, live := benchQueue()
	answers := map[string]Answer{"rabbit1": AnswerAck, "rabbit2": AnswerAck, "rabbit5": AnswerAck}
	answer := func(backend string) Answer { return answers[backend] }
	b.ReportAllocs()
	for b.Loop() {
		if DecideConfirm(&m, live, answer) != VerdictAck {
			b.Fatal("want ack")
		}
	}
}
