package proxy

import (
	"testing"

	"github.com/amqp-mirror/amqp-mirror/frames"
	"github.com/amqp-mirror/amqp-mirror/mirror"
	"github.com/amqp-mirror/amqp-mirror/proxy/internal/ledger"
)

// TestGroupLinkLost: when a link that owes a reply is lost, the client
// gets another target's reply (kept from before the loss, or the next to
// come), the proxy's answer to a setting, get-empty for a basic.get on a
// mirrored queue, or nothing yet while others still owe theirs; only a
// request no other link can answer is left unanswered (541).
func TestGroupLinkLost(t *testing.T) {
	const primary, other, third = 0, 1, 2
	type event struct {
		lost    bool // the link is lost; else it replies payload
		from    int
		payload string
	}
	mirroredGet := &pendingGet{queue: &ledger.QueueRef{ID: mirror.QueueID{VHost: "/", Name: "q"}}}
	tests := []struct {
		name    string
		targets int
		get     *pendingGet
		setting frames.Method
		events  []event
		want    []lostAnswer // what each loss gave, in order
		reply   string       // the reply kept for the client at the end
	}{
		{name: "single target", targets: 1, events: []event{{lost: true, from: primary}}, want: []lostAnswer{lostUnanswered}},
		{name: "single target, a setting", targets: 1, setting: &frames.BasicQosOk{},
			events: []event{{lost: true, from: primary}}, want: []lostAnswer{lostSetting}},
		{name: "a get on a mirrored queue", targets: 1, get: mirroredGet,
			events: []event{{lost: true, from: primary}}, want: []lostAnswer{lostGet}},
		{name: "a get on an unmirrored queue", targets: 1, get: &pendingGet{},
			events: []event{{lost: true, from: primary}}, want: []lostAnswer{lostUnanswered}},
		{name: "the other answered before", targets: 2,
			events: []event{{from: other, payload: "a"}, {lost: true, from: primary}}, want: []lostAnswer{lostReply}, reply: "a"},
		{name: "the other answers after", targets: 2,
			events: []event{{lost: true, from: primary}, {from: other, payload: "b"}}, want: []lostAnswer{lostWait}, reply: "b"},
		{name: "the first of two others", targets: 3,
			events: []event{{from: other, payload: "a"}, {lost: true, from: primary}, {from: third, payload: "c"}}, want: []lostAnswer{lostWait}, reply: "a"},
		{name: "every link lost", targets: 2,
			events: []event{{lost: true, from: primary}, {lost: true, from: other}}, want: []lostAnswer{lostWait, lostUnanswered}},
		{name: "every link lost, a setting", targets: 2, setting: &frames.ConfirmSelectOk{},
			events: []event{{lost: true, from: other}, {lost: true, from: primary}}, want: []lostAnswer{lostWait, lostSetting}},
		{name: "another lost after the primary replied", targets: 2,
			events: []event{{from: primary, payload: "p"}, {lost: true, from: other}}, want: []lostAnswer{lostReply}, reply: "p"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ch := &channelState{}
			g := &rpcGroup{pending: tc.targets, primary: primary, get: tc.get, settingOk: tc.setting}
			var got []lostAnswer
			for _, e := range tc.events {
				if e.lost {
					got = append(got, ch.groupLinkLost(g, e.from))
					continue
				}
				ch.groupReplied(g, e.from, []byte(e.payload))
			}
			if len(got) != len(tc.want) {
				t.Fatalf("answers %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("answers %v, want %v", got, tc.want)
				}
			}
			if string(g.reply) != tc.reply {
				t.Fatalf("reply %q, want %q", g.reply, tc.reply)
			}
		})
	}
}
