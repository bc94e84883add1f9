package proxy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// settleRecorder is a Mirror that records what Settle is told, as
// "queue outcome ids" lines; any other method panics.
type settleRecorder struct {
	Mirror
	calls []string
}

func (r *settleRecorder) Settle(q mirror.QueueID, ids []mirror.MessageID, outcome mirror.Outcome) {
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = fmt.Sprint(id[15])
	}
	r.calls = append(r.calls, fmt.Sprintf("%s %v %s", q.Name, outcome, strings.Join(names, ",")))
}

// TestSettlerBatchesAcks: acks reach the engine in one call per queue
// when the client loop flushes them, and before anything else it is told.
func TestSettlerBatchesAcks(t *testing.T) {
	a := &ledger.QueueRef{ID: mirror.QueueID{VHost: "/", Name: "a"}}
	b := &ledger.QueueRef{ID: mirror.QueueID{VHost: "/", Name: "b"}}
	msg := func(q *ledger.QueueRef, n byte) ledger.Trimmed {
		return ledger.Trimmed{Queue: q, ID: mirror.MessageID{15: n}}
	}
	type step struct {
		trims   []ledger.Trimmed
		outcome mirror.Outcome
		flush   bool // flushAcked instead of trim
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  []string
	}{
		{
			name: "acks wait for the flush, one call per queue",
			steps: []step{
				{trims: []ledger.Trimmed{msg(a, 1)}, outcome: mirror.Acked},
				{trims: []ledger.Trimmed{msg(b, 2)}, outcome: mirror.Acked},
				{trims: []ledger.Trimmed{msg(a, 3), msg(a, 4)}, outcome: mirror.Acked},
				{flush: true},
			},
			want: []string{
				fmt.Sprintf("a %v 1,3,4", mirror.Acked),
				fmt.Sprintf("b %v 2", mirror.Acked),
			},
		},
		{
			name: "a rejection goes after the acks before it",
			steps: []step{
				{trims: []ledger.Trimmed{msg(a, 1)}, outcome: mirror.Acked},
				{trims: []ledger.Trimmed{msg(a, 2)}, outcome: mirror.Rejected},
				{trims: []ledger.Trimmed{msg(a, 3)}, outcome: mirror.Acked},
				{flush: true},
			},
			want: []string{
				fmt.Sprintf("a %v 1", mirror.Acked),
				fmt.Sprintf("a %v 2", mirror.Rejected),
				fmt.Sprintf("a %v 3", mirror.Acked),
			},
		},
		{
			name: "a flush with nothing acked tells nothing",
			steps: []step{
				{flush: true},
				{trims: []ledger.Trimmed{msg(a, 1)}, outcome: mirror.Requeued},
				{flush: true},
			},
			want: []string{fmt.Sprintf("a %v 1", mirror.Requeued)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &settleRecorder{}
			s := &settler{mirror: rec}
			for _, st := range tc.steps {
				if st.flush {
					s.flushAcked()
					continue
				}
				s.trim(slices.Clone(st.trims), st.outcome)
			}
			if !slices.Equal(rec.calls, tc.want) {
				t.Fatalf("Settle calls:\n%s\nwant:\n%s", strings.Join(rec.calls, "\n"), strings.Join(tc.want, "\n"))
			}
			if len(s.acked) != 0 {
				t.Fatalf("%d acks left after the flush", len(s.acked))
			}
		})
	}
}
