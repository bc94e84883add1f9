package proxy

import "testing"

// TestGroupPrimaryLost: when the link whose reply a client waits for is
// lost, another target's reply answers, whether it came before the loss
// or after; a request no other link was asked stays unanswered.
func TestGroupPrimaryLost(t *testing.T) {
	const primary, other, third = 0, 1, 2
	type reply struct {
		from    int
		payload string
	}
	tests := []struct {
		name    string
		targets int
		before  []reply // replies before the primary's link is lost
		after   []reply // replies after
		wantOK  bool
		want    string // the reply the client gets; "" for none yet
		done    bool   // complete once every reply is in
	}{
		{name: "single target", targets: 1, wantOK: false},
		{name: "the other answered before", targets: 2, before: []reply{{other, "a"}}, wantOK: true, want: "a", done: true},
		{name: "the other answers after", targets: 2, after: []reply{{other, "b"}}, wantOK: true, want: "b", done: true},
		{name: "first of two others", targets: 3, before: []reply{{other, "a"}}, after: []reply{{third, "c"}}, wantOK: true, want: "a", done: true},
		{name: "two others after", targets: 3, after: []reply{{third, "c"}, {other, "b"}}, wantOK: true, want: "c", done: true},
		{name: "still waiting", targets: 3, after: []reply{{third, "c"}}, wantOK: true, want: "c", done: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ch := &channelState{}
			g := &rpcGroup{pending: tc.targets, primary: primary}
			for _, r := range tc.before {
				if ch.groupReplied(g, r.from == g.primary, []byte(r.payload)) {
					t.Fatalf("complete before the primary's reply")
				}
			}
			done, answered, ok := ch.groupPrimaryLost(g)
			if ok != tc.wantOK {
				t.Fatalf("ok = %t, want %t", ok, tc.wantOK)
			}
			if !ok {
				if g.pending != tc.targets || g.primary != primary {
					t.Fatalf("a refused take-over changed the group: %+v", g)
				}
				return
			}
			if answered != (len(tc.before) > 0) {
				t.Fatalf("answered = %t with %d replies before the loss", answered, len(tc.before))
			}
			for _, r := range tc.after {
				done = ch.groupReplied(g, r.from == g.primary, []byte(r.payload))
			}
			if done != tc.done {
				t.Fatalf("done = %t, want %t (pending %d)", done, tc.done, g.pending)
			}
			if string(g.reply) != tc.want {
				t.Fatalf("reply = %q, want %q", g.reply, tc.want)
			}
		})
	}
}
