package mirror

import "strconv"

// This file holds the decisions taken for every publish: which backends a
// publish to a queue must reach, and when the client may be told it is
// confirmed. They run once per message, so they allocate nothing: callers
// pass a slice to append to and keep it between publishes.

// LiveSet is the set of backends the proxy can reach right now, as
// membership (backend links, serf) last reported it. A backend not in the
// set, or mapped to false, is not live; a nil LiveSet holds nothing.
type LiveSet map[string]bool

// NewLiveSet returns a LiveSet holding the given backends.
func NewLiveSet(backends ...string) LiveSet {
	l := make(LiveSet, len(backends))
	for _, b := range backends {
		l[b] = true
	}
	return l
}

// Has reports whether backend is live.
func (l LiveSet) Has(backend string) bool { return l[backend] }

// AppendPublishTargets appends to dst the backends a publish to the queue
// must be sent to, and returns the extended slice: the master and every
// slave, each only when its backend is live, master first and slaves in
// join order. Unsynchronised slaves are targets too: they must receive
// every message published after they joined, or they never catch up.
//
// A master that is not live is left out (there is no link to send on); the
// publish then reaches the slaves only, and DecideConfirm holds its confirm
// until a promotion names a new master: a publish made while a slave is
// being promoted is confirmed once the new master holds it, or nacked.
func AppendPublishTargets(dst []string, m *QueueMeta, live LiveSet) []string {
	if live.Has(m.Master) {
		dst = append(dst, m.Master)
	}
	for i := range m.Slaves {
		if b := m.Slaves[i].Backend; live.Has(b) {
			dst = append(dst, b)
		}
	}
	return dst
}

// AppendConfirmQuorum appends to dst the backends whose confirms a publish
// needs before the client is told it is confirmed: the master, live or not,
// and every synchronised slave whose backend is live. That is what makes a
// client's confirm mean "held by every copy that may be promoted without
// loss". The master is in the quorum even when it is down, so that nothing
// is confirmed while a queue has no master; after a promotion the quorum is
// computed again from the new metadata. Unsynchronised slaves are not in
// the quorum: they may miss older messages anyway, and waiting for them
// would tie publish latency to the slowest new mirror.
func AppendConfirmQuorum(dst []string, m *QueueMeta, live LiveSet) []string {
	dst = append(dst, m.Master)
	for i := range m.Slaves {
		if s := &m.Slaves[i]; s.Synchronised && live.Has(s.Backend) {
			dst = append(dst, s.Backend)
		}
	}
	return dst
}

// Answer is what one backend said about one publish.
type Answer uint8

// Answers a backend gives, in its own confirm-mode sequence.
const (
	AnswerNone Answer = iota // not answered yet
	AnswerAck
	AnswerNack
)

var answerNames = []string{"none", "ack", "nack"}

func (a Answer) String() string { return enumName(answerNames, int(a)) }

// Verdict is what the client is told about one publish.
type Verdict uint8

// Verdicts: wait, basic.ack or basic.nack.
const (
	VerdictPending Verdict = iota
	VerdictAck
	VerdictNack
)

var verdictNames = []string{"pending", "ack", "nack"}

func (v Verdict) String() string { return enumName(verdictNames, int(v)) }

// DecideConfirm says what the client is told about a publish, from the
// answers the backends gave so far (answer returns AnswerNone for a backend
// that did not answer or was not sent the publish). It is evaluated against
// the current metadata and live set, not the ones at publish time: a
// synchronised slave that dies stops being waited for, and after a
// promotion the new master's confirm is the one that counts.
//
//   - a nack from the master, or from any synchronised live slave, nacks:
//     acking would promise a copy that one of them does not hold, and the
//     client can publish again;
//   - an ack from every member of AppendConfirmQuorum acks;
//   - anything else waits. Answers from unsynchronised slaves and from
//     backends that hold no copy are ignored.
func DecideConfirm(m *QueueMeta, live LiveSet, answer func(backend string) Answer) Verdict {
	verdict := VerdictAck
	switch answer(m.Master) {
	case AnswerNack:
		return VerdictNack
	case AnswerNone:
		verdict = VerdictPending
	}
	for i := range m.Slaves {
		s := &m.Slaves[i]
		if !s.Synchronised || !live.Has(s.Backend) {
			continue
		}
		switch answer(s.Backend) {
		case AnswerNack:
			return VerdictNack
		case AnswerNone:
			verdict = VerdictPending
		}
	}
	return verdict
}

// enumName is String for the small enums of this package: never panics,
// and an unknown value prints as unknown(N) so that it shows in logs.
func enumName(names []string, i int) string {
	if i < 0 || i >= len(names) {
		return "unknown(" + strconv.Itoa(i) + ")"
	}
	return names[i]
}
