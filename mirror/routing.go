package mirror

import (
	"math"
	"strings"
	"sync"

	"github.com/amqp-mirror/amqp-mirror/frames"
)

// Routing a publish to a named exchange, evaluated by the proxy from the
// metadata log the way RabbitMQ 3.10 evaluates it (rabbit_exchange:route,
// the exchange type modules, rabbit_basic:header_routes), so that the
// publish goes only to the backends holding a copy of a queue it reaches.
//
// Leaving out a backend RabbitMQ would deliver to loses a message; sending
// to one too many costs a copy. Every doubt therefore widens the route.
// Doubt is tracked, not just resolved towards "matches": a binding that
// only may match must not stop an exchange's alternate exchange from being
// followed (RabbitMQ follows it when nothing matched), so a match is one of
// three results, and the certainty of reaching an exchange or a queue is the
// weakest result on the way to it.

// RoutedMessage is what routing reads of a publish.
type RoutedMessage struct {
	VHost, Exchange, RoutingKey string
	// Headers are the message's headers table, decoded; HeadersKnown says so. Without
	// them the message is taken to carry no CC or BCC header (the caller checked the
	// raw bytes), and a headers exchange on the way makes Route answer NeedHeaders.
	Headers      frames.Table
	HeadersKnown bool
}

// Route is where a publish must go.
type Route struct {
	// Backends are the backends to send to, in the order given to NewRoutingTable.
	// The slice may be shared between routes: do not modify it.
	Backends []string
	// All: every backend (the route cannot be known from the log, or reaches no queue).
	All bool
	// NeedHeaders: ask again with the message's headers.
	NeedHeaders bool
}

// RoutingTable is the log's exchanges and queue bindings, indexed for Route.
type RoutingTable struct {
	backends []string
	// setBytes is the length of a backendSet over the configured backends.
	setBytes  int
	exchanges []exchangeNode
	byID      map[ExchangeID]int
	walks     sync.Pool // of *walk
	// lists holds the ordered backend names of the sets a route most
	// often ends with (one queue's copies), keyed by the set's bytes, so
	// that such a route allocates nothing.
	lists map[string][]string
}

// matchResult is whether a binding matches a message: RabbitMQ's answer
// where the proxy can tell it, mayMatch where it cannot.
type matchResult uint8

const (
	unmatched matchResult = iota
	mayMatch
	matched
)

var matchResultNames = []string{"unmatched", "may match", "matched"}

func (r matchResult) String() string { return enumName(matchResultNames, int(r)) }

type exchangeKind uint8

const (
	// unroutable: the default exchange, a plugin's type, or a type the log
	// does not know; reaching it sends the publish everywhere.
	unroutable exchangeKind = iota
	directKind
	fanoutKind
	topicKind
	headersKind
)

// Special values of destination.exchange and exchangeNode.alternate.
const (
	toQueue     = -1 // destination: a queue, whose copies are in backends
	noRecord    = -2 // an exchange the log has no record of: route everywhere
	noAlternate = -3
)

// destination is where one binding leads.
type destination struct {
	exchange int // index into RoutingTable.exchanges, or toQueue or noRecord
	backends backendSet
}

type topicBinding struct {
	// words are the binding key split as RabbitMQ splits it, with runs of
	// "#" folded into one (same matches, less backtracking).
	words []string
	to    destination
}

type headersBinding struct {
	any bool // x-match any or any-with-x; otherwise all or all-with-x
	// unsure: the arguments could not be decoded, x-match has a value
	// RabbitMQ 3.10 refuses, or a matched key repeats.
	unsure bool
	// fields are the arguments matched against the headers: x-match
	// removed, and other x- keys too unless x-match is *-with-x.
	fields frames.Table
	to     destination
}

type exchangeNode struct {
	kind exchangeKind
	// alternate is the index of the alternate exchange, noAlternate, or
	// noRecord.
	alternate int
	// unknownBindings are the backends not in the exchange's Fresh list:
	// they may hold bindings the log does not know and get every publish
	// that reaches the exchange.
	unknownBindings backendSet

	direct  map[string][]destination
	fanout  []destination
	topic   []topicBinding
	headers []headersBinding
}

// NewRoutingTable indexes the log's exchanges and queues (immutable afterwards, safe for
// concurrent Route calls). backends are the configured backend names.
func NewRoutingTable(backends []string, exchanges []ExchangeMeta, queues []QueueMeta) *RoutingTable {
	t := &RoutingTable{
		backends:  backends,
		setBytes:  (len(backends) + 7) / 8,
		exchanges: make([]exchangeNode, len(exchanges)),
		byID:      make(map[ExchangeID]int, len(exchanges)),
		lists:     make(map[string][]string),
	}
	t.walks.New = func() any { return &walk{table: t, reached: make(backendSet, t.setBytes)} }
	position := make(map[string]int, len(backends))
	for i, b := range backends {
		if _, seen := position[b]; !seen {
			position[b] = i
		}
	}
	setOf := func(names []string) backendSet {
		s := make(backendSet, t.setBytes)
		for _, n := range names {
			if i, ok := position[n]; ok {
				s.add(i)
			}
		}
		return s
	}

	for i, x := range exchanges {
		t.byID[x.ID] = i
	}
	for i, x := range exchanges {
		node := &t.exchanges[i]
		node.kind = kindOf(x)
		node.alternate = noAlternate
		if x.AlternateExchange != "" {
			node.alternate = t.exchangeIndex(x.ID.VHost, x.AlternateExchange)
		}
		node.unknownBindings = make(backendSet, t.setBytes)
		for b := range backends {
			if !x.IsFresh(backends[b]) {
				node.unknownBindings.add(b)
			}
		}
		for _, b := range x.Bindings {
			node.bind(b.RoutingKey, b.Arguments, destination{exchange: t.exchangeIndex(x.ID.VHost, b.Destination)})
		}
	}
	for _, q := range queues {
		copies := setOf(q.Backends())
		t.remember(copies)
		to := destination{exchange: toQueue, backends: copies}
		for _, b := range q.Bindings {
			if i, ok := t.byID[ExchangeID{VHost: q.ID.VHost, Name: b.Exchange}]; ok && b.Exchange != "" {
				t.exchanges[i].bind(b.RoutingKey, b.Arguments, to)
			}
		}
	}
	t.remember(setOf(backends))
	return t
}

func kindOf(x ExchangeMeta) exchangeKind {
	if x.ID.Name == "" {
		return unroutable
	}
	switch x.Type {
	case "direct":
		return directKind
	case "fanout":
		return fanoutKind
	case "topic":
		return topicKind
	case "headers":
		return headersKind
	}
	return unroutable
}

// exchangeIndex returns the index of the named exchange, or noRecord. The
// default exchange's record, if any, routes everywhere (kindOf).
func (t *RoutingTable) exchangeIndex(vhost, name string) int {
	if i, ok := t.byID[ExchangeID{VHost: vhost, Name: name}]; ok {
		return i
	}
	return noRecord
}

// remember keeps the ordered names of set for Route to hand out.
func (t *RoutingTable) remember(set backendSet) {
	if _, ok := t.lists[string(set)]; !ok {
		t.lists[string(set)] = t.names(set)
	}
}

// names lists the backends in set, in configured order.
func (t *RoutingTable) names(set backendSet) []string {
	var out []string
	for i, b := range t.backends {
		if set.has(i) {
			out = append(out, b)
		}
	}
	return out
}

// bind adds a binding with the exchange as source, read the way the
// exchange's type reads it.
func (x *exchangeNode) bind(key string, arguments []byte, to destination) {
	switch x.kind {
	case directKind:
		if x.direct == nil {
			x.direct = make(map[string][]destination)
		}
		x.direct[key] = append(x.direct[key], to)
	case fanoutKind:
		x.fanout = append(x.fanout, to)
	case topicKind:
		x.topic = append(x.topic, topicBinding{words: topicPattern(key), to: to})
	case headersKind:
		x.headers = append(x.headers, newHeadersBinding(arguments, to))
	}
}

// topicPattern splits a binding key into words like RabbitMQ's
// split_topic_key ("" is no word, "a..b" has an empty middle word) and
// folds each run of "#" into one: "#.#" matches what "#" matches.
func topicPattern(key string) []string {
	if key == "" {
		return nil
	}
	var words []string
	for w := range strings.SplitSeq(key, ".") {
		if w == "#" && len(words) > 0 && words[len(words)-1] == "#" {
			continue
		}
		words = append(words, w)
	}
	return words
}

func newHeadersBinding(arguments []byte, to destination) headersBinding {
	h := headersBinding{to: to}
	var table frames.Table
	if len(arguments) > 0 {
		decoded, n, err := frames.DecodeTable(arguments)
		if err != nil || n != len(arguments) {
			h.unsure = true
			return h
		}
		table = decoded
	}
	withX := false
	if v, ok := table.Get("x-match"); ok {
		// RabbitMQ 3.10 refuses any other value at bind time (and reads
		// one bound by an older version as all): not ours to guess.
		switch v {
		case "all":
		case "any":
			h.any = true
		case "all-with-x":
			withX = true
		case "any-with-x":
			h.any, withX = true, true
		default:
			h.unsure = true
			return h
		}
	}
	for _, f := range table {
		if f.Key == "x-match" || (!withX && strings.HasPrefix(f.Key, "x-")) {
			continue
		}
		if _, repeated := h.fields.Get(f.Key); repeated {
			// RabbitMQ pairs repeated keys by position after a stable
			// sort; rare enough not to model.
			h.unsure = true
		}
		h.fields = append(h.fields, f)
	}
	return h
}

// Route evaluates where a publish must go.
func (t *RoutingTable) Route(m RoutedMessage) Route {
	if m.Exchange == "" {
		return Route{All: true}
	}
	start, ok := t.byID[ExchangeID{VHost: m.VHost, Name: m.Exchange}]
	if !ok {
		return Route{All: true}
	}
	w := t.walks.Get().(*walk)
	defer t.release(w)
	w.reset(&m)
	if !w.addRoutingKeys(&m) {
		return Route{All: true}
	}
	w.push(start, matched)
	for len(w.pending) > 0 {
		next := w.pending[len(w.pending)-1]
		w.pending = w.pending[:len(w.pending)-1]
		switch w.visit(next) {
		case routeEverywhere:
			return Route{All: true}
		case askForHeaders:
			return Route{NeedHeaders: true}
		}
	}
	// Reaching no queue for sure: every broker routes the message nowhere
	// alike, or to an alternate exchange of its own policy, or returns it
	// (mandatory); only every backend gets all of that right.
	if !w.queueReached || w.reached.empty() {
		return Route{All: true}
	}
	if list, ok := t.lists[string(w.reached)]; ok {
		return Route{Backends: list}
	}
	return Route{Backends: t.names(w.reached)}
}

// routingKey is one key a message is routed with.
type routingKey struct {
	key     string
	certain matchResult // matched, or mayMatch for a key RabbitMQ ignores
}

// addRoutingKeys collects the routing key and those of the CC and BCC
// headers (rabbit_basic:header_routes). It returns false when a CC or BCC
// header is not an array: RabbitMQ refuses the publish.
func (w *walk) addRoutingKeys(m *RoutedMessage) bool {
	w.keys = append(w.keys, routingKey{key: m.RoutingKey, certain: matched})
	if !m.HeadersKnown {
		return true
	}
	for _, header := range [...]string{"CC", "BCC"} {
		v, present := m.Headers.Get(header)
		if !present {
			continue
		}
		routes, isArray := v.([]any)
		if !isArray {
			return false
		}
		for _, r := range routes {
			switch r := r.(type) {
			case string:
				w.keys = append(w.keys, routingKey{key: r, certain: matched})
			case []byte:
				// A byte array ('x') element: RabbitMQ 3.10 routes by
				// longstr elements only, so this key only may match: it
				// adds routes but never keeps an alternate exchange out.
				w.keys = append(w.keys, routingKey{key: string(r), certain: mayMatch})
			}
		}
	}
	return true
}

// reach is an exchange on the way, and how certainly it is reached.
type reach struct {
	exchange int
	certain  matchResult
}

// walk is one Route evaluation: rabbit_exchange:route1's work list, with
// a visited set so that exchange-binding cycles end. Walks are pooled and
// reused: a Route call allocates nothing for them.
type walk struct {
	table *RoutingTable
	// headers and headersKnown are the message's; the routing keys are in
	// keys.
	headers      frames.Table
	headersKnown bool
	keys         []routingKey
	pending      []reach
	visited      []reach // the most certain reach of each exchange so far
	reached      backendSet
	// queueReached: some queue is reached for sure.
	queueReached bool
}

// release returns w to the pool, without the message's headers.
func (t *RoutingTable) release(w *walk) {
	w.headers = nil
	t.walks.Put(w)
}

func (w *walk) reset(m *RoutedMessage) {
	w.headers, w.headersKnown = m.Headers, m.HeadersKnown
	w.keys = w.keys[:0]
	w.pending = w.pending[:0]
	w.visited = w.visited[:0]
	clear(w.reached)
	w.queueReached = false
}

// outcome is how a visit leaves the evaluation.
type outcome uint8

const (
	keepWalking outcome = iota
	routeEverywhere
	askForHeaders
)

// push queues exchange for a visit, unless it was visited as certainly.
// A second, more certain visit can only add certainty, since what an
// exchange routes to does not depend on the way the message came.
func (w *walk) push(exchange int, certain matchResult) {
	for i := range w.visited {
		if w.visited[i].exchange == exchange {
			if w.visited[i].certain >= certain {
				return
			}
			w.visited[i].certain = certain
			w.pending = append(w.pending, reach{exchange, certain})
			return
		}
	}
	w.visited = append(w.visited, reach{exchange, certain})
	w.pending = append(w.pending, reach{exchange, certain})
}

// visit routes the message through one exchange.
func (w *walk) visit(r reach) outcome {
	x := &w.table.exchanges[r.exchange]
	switch {
	case x.kind == unroutable:
		return routeEverywhere
	case x.kind == headersKind && !w.headersKnown:
		return askForHeaders
	}
	w.reached.union(x.unknownBindings)

	best := unmatched
	follow := func(to destination, result matchResult) bool {
		best = max(best, result)
		return w.follow(to, min(r.certain, result))
	}
	switch x.kind {
	case directKind:
		for _, k := range w.keys {
			for _, to := range x.direct[k.key] {
				if !follow(to, k.certain) {
					return routeEverywhere
				}
			}
		}
	case fanoutKind:
		for _, to := range x.fanout {
			if !follow(to, matched) {
				return routeEverywhere
			}
		}
	case topicKind:
		for i := range x.topic {
			b := &x.topic[i]
			result := unmatched
			for _, k := range w.keys {
				if k.certain > result && b.matches(k.key) {
					result = k.certain
				}
			}
			if result != unmatched && !follow(b.to, result) {
				return routeEverywhere
			}
		}
	case headersKind:
		for i := range x.headers {
			b := &x.headers[i]
			if result := b.match(w.headers); result != unmatched && !follow(b.to, result) {
				return routeEverywhere
			}
		}
	}

	// rabbit_exchange:process_alternate: the alternate exchange is taken
	// when the exchange's own bindings matched nothing.
	if best == matched || x.alternate == noAlternate {
		return keepWalking
	}
	if x.alternate == noRecord {
		return routeEverywhere
	}
	certain := matched
	if best == mayMatch {
		certain = mayMatch
	}
	w.push(x.alternate, min(r.certain, certain))
	return keepWalking
}

// follow takes one matched binding; false means route everywhere.
func (w *walk) follow(to destination, certain matchResult) bool {
	switch to.exchange {
	case noRecord:
		return false
	case toQueue:
		w.reached.union(to.backends)
		if certain == matched {
			w.queueReached = true
		}
	default:
		w.push(to.exchange, certain)
	}
	return true
}

// matches reports whether the binding matches key. Most keys fail on the
// pattern's first or last word when it is literal, which is checked first.
func (b *topicBinding) matches(key string) bool {
	if n := len(b.words); n > 0 {
		first, last := b.words[0], b.words[n-1]
		if first != "#" && first != "*" && !strings.HasPrefix(key, first) {
			return false
		}
		if last != "#" && last != "*" && !strings.HasSuffix(key, last) {
			return false
		}
	}
	return topicMatch(b.words, key)
}

// topicMatch reports whether the words of key match the binding's pattern:
// "*" is exactly one word, "#" zero or more.
func topicMatch(pattern []string, key string) bool {
	position := 0
	if key == "" {
		position = noWordsLeft
	}
	return topicMatchFrom(pattern, key, position)
}

// noWordsLeft is the position past the last word of a key. (Position
// len(key) is not it: after a trailing '.', one empty word is left.)
const noWordsLeft = -1

func topicMatchFrom(pattern []string, key string, position int) bool {
	for len(pattern) > 0 {
		if pattern[0] == "#" {
			rest := pattern[1:]
			if len(rest) == 0 {
				return true
			}
			for {
				if topicMatchFrom(rest, key, position) {
					return true
				}
				if position == noWordsLeft {
					return false
				}
				_, position = nextTopicWord(key, position)
			}
		}
		if position == noWordsLeft {
			return false
		}
		var word string
		word, position = nextTopicWord(key, position)
		if pattern[0] != "*" && pattern[0] != word {
			return false
		}
		pattern = pattern[1:]
	}
	return position == noWordsLeft
}

// nextTopicWord returns the word of key at position and where the next
// one starts.
func nextTopicWord(key string, position int) (word string, next int) {
	end := strings.IndexByte(key[position:], '.')
	if end < 0 {
		return key[position:], noWordsLeft
	}
	return key[position : position+end], position + end + 1
}

// match is rabbit_exchange_type_headers:headers_match, with mayMatch
// wherever the proxy cannot tell RabbitMQ's answer.
func (b *headersBinding) match(headers frames.Table) matchResult {
	if b.unsure {
		return mayMatch
	}
	all := matched // for x-match all: the weakest field result
	anyOf := unmatched
	for _, f := range b.fields {
		result := headerMatch(f, headers)
		all = min(all, result)
		anyOf = max(anyOf, result)
	}
	if b.any {
		return anyOf
	}
	return all
}

// headerMatch matches one binding argument against the headers.
func headerMatch(f frames.Field, headers frames.Table) matchResult {
	var value any
	found := 0
	for _, h := range headers {
		if h.Key == f.Key {
			if found == 0 {
				value = h.Value
			}
			found++
		}
	}
	switch {
	case found == 0:
		return unmatched
	case found > 1:
		return mayMatch // repeated header: paired by position, not modelled
	case f.Value == nil:
		return matched // void: the header needs only be present
	}
	return sameValue(f.Value, value)
}

// valueClass groups field values the way Erlang's == compares them.
type valueClass uint8

const (
	classUnsure valueClass = iota // floats, tables, arrays: see sameValue
	classBool
	classInteger
	classString
	classDecimal
	classVoid
)

// sameValue is Erlang's == on the decoded values (RabbitMQ compares the
// values, not their field types): every integer type and timestamps by
// number, longstr and byte array by bytes. Floats (1.0 == 1 in Erlang),
// tables and arrays (compared with their element types) say mayMatch.
func sameValue(binding, header any) matchResult {
	bc, hc := classOf(binding), classOf(header)
	switch {
	case bc == classUnsure || hc == classUnsure:
		return mayMatch
	case bc != hc:
		return unmatched
	}
	var same bool
	switch bc {
	case classInteger:
		same = asInteger(binding) == asInteger(header)
	case classString:
		same = sameString(binding, header)
	default: // bool, Decimal, nil: Go's == is Erlang's
		same = binding == header
	}
	if same {
		return matched
	}
	return unmatched
}

func classOf(v any) valueClass {
	switch v.(type) {
	case bool:
		return classBool
	case int8, uint8, int16, uint16, int32, uint32, int64, frames.Timestamp, int:
		return classInteger
	case string, []byte:
		return classString
	case frames.Decimal:
		return classDecimal
	case nil:
		return classVoid
	}
	return classUnsure
}

// integer is an integer value of any field type: timestamps reach 2^64-1.
type integer struct {
	value      int64
	aboveInt64 bool // value holds the amount above math.MaxInt64
}

func asInteger(v any) integer {
	switch v := v.(type) {
	case int8:
		return integer{value: int64(v)}
	case uint8:
		return integer{value: int64(v)}
	case int16:
		return integer{value: int64(v)}
	case uint16:
		return integer{value: int64(v)}
	case int32:
		return integer{value: int64(v)}
	case uint32:
		return integer{value: int64(v)}
	case int64:
		return integer{value: v}
	case int:
		return integer{value: int64(v)}
	case frames.Timestamp:
		if v > math.MaxInt64 {
			return integer{value: int64(v - math.MaxInt64), aboveInt64: true}
		}
		return integer{value: int64(v)}
	}
	return integer{}
}

// sameString compares two longstr or byte array values by their bytes.
// (A []byte converted in a comparison is not copied.)
func sameString(a, b any) bool {
	switch a := a.(type) {
	case string:
		switch b := b.(type) {
		case string:
			return a == b
		case []byte:
			return a == string(b)
		}
	case []byte:
		switch b := b.(type) {
		case string:
			return string(a) == b
		case []byte:
			return string(a) == string(b)
		}
	}
	return false
}

// backendSet has bit i set for the i-th configured backend.
type backendSet []byte

func (s backendSet) add(i int)      { s[i/8] |= 1 << (i % 8) }
func (s backendSet) has(i int) bool { return s[i/8]&(1<<(i%8)) != 0 }
func (s backendSet) union(o backendSet) {
	for i := range o {
		s[i] |= o[i]
	}
}

func (s backendSet) empty() bool {
	for _, b := range s {
		if b != 0 {
			return false
		}
	}
	return true
}
