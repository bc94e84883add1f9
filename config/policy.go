package config

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Policy sources, as list_policies shows them.
const (
	SourceFile            = "file"
	SourceRuntime         = "runtime"
	SourceOperatorFile    = "operator-file"
	SourceOperatorRuntime = "operator-runtime"
)

// Policy is a RabbitMQ policy: which objects (Pattern, ApplyTo, VHost) get
// which Definition, with Priority deciding between several that match.
type Policy struct {
	Name       string     `json:"name"`
	VHost      string     `json:"vhost"`
	Pattern    string     `json:"pattern"`
	ApplyTo    ApplyTo    `json:"apply-to"`
	Priority   int        `json:"priority"`
	Definition Definition `json:"definition"`
	Source     string     `json:"source,omitempty"`
	// OverridesFile is set on a runtime policy that hides a file policy of
	// the same vhost and name.
	OverridesFile bool `json:"overrides_file,omitempty"`

	re *regexp.Regexp // compiled Pattern, set by Validated
}

// Validated returns p with defaults filled in (vhost "/", apply-to all),
// its pattern compiled, and its definition checked as RabbitMQ would check
// it for set_policy (operator false) or set_operator_policy (operator true).
// Errors name the key path (pattern, definition.ha-params, ...).
func (p Policy) Validated(operator bool) (Policy, error) {
	if p.VHost == "" {
		p.VHost = "/"
	}
	if p.ApplyTo == ApplyUnset {
		p.ApplyTo = ApplyAll
	}
	pr := &problems{}
	if p.Name == "" {
		pr.add("name", "expected a non-empty policy name, found an empty one")
	}
	if _, ok := ParseApplyTo(p.ApplyTo.String()); !ok {
		pr.add("apply-to", "expected %s, found %s", expectedOneOf(applyToNames), p.ApplyTo)
	}
	re, err := regexp.Compile(p.Pattern)
	if err != nil {
		pr.add("pattern", "expected a regular expression, found %q: %v", p.Pattern, err)
	}
	p.re = re
	b, err := json.Marshal(p.Definition.Map())
	if err != nil {
		pr.add("definition", "cannot encode: %v", err)
	} else if _, err := parseDefinition(b, operator); err != nil {
		pr.errs = append(pr.errs, err)
	}
	return p, pr.err()
}

// matches reports whether the pattern matches name; like RabbitMQ's
// re:run it is an unanchored search.
func (p *Policy) matches(name string) bool {
	re := p.re
	if re == nil {
		var err error
		if re, err = regexp.Compile(p.Pattern); err != nil {
			return false
		}
	}
	return re.MatchString(name)
}

var policyKeys = []string{"name", "vhost", "pattern", "apply-to", "priority", "definition"}

func decodePolicies(p *problems, path string, v any, operator bool) []Policy {
	list, ok := v.([]any)
	if !ok {
		p.add(path, "expected a list of policies, found %s", describe(v))
		return nil
	}
	source := SourceFile
	if operator {
		source = SourceOperatorFile
	}
	var out []Policy
	for i, item := range list {
		ip := index(path, i)
		m, ok := item.(map[string]any)
		if !ok {
			p.add(ip, "expected a policy mapping with keys %v, found %s", policyKeys, describe(item))
			continue
		}
		p.unknownKeys(ip, m, policyKeys, "policy")
		pol := Policy{VHost: "/", ApplyTo: ApplyAll, Source: source}
		if s, ok := m["name"].(string); ok && s != "" {
			pol.Name = s
		} else {
			p.add(join(ip, "name"), "expected a non-empty string, found %s", describe(m["name"]))
		}
		if v, ok := m["vhost"]; ok {
			if s, ok := v.(string); ok && s != "" {
				pol.VHost = s
			} else {
				p.add(join(ip, "vhost"), "expected a non-empty string, found %s", describe(v))
			}
		}
		if s, ok := m["pattern"].(string); ok {
			pol.Pattern = s
			re, err := regexp.Compile(s)
			if err != nil {
				p.add(join(ip, "pattern"), "expected a regular expression, found %q: %v", s, err)
			}
			pol.re = re
		} else {
			p.add(join(ip, "pattern"), "expected a regular expression (string), found %s", describe(m["pattern"]))
		}
		if v, ok := m["apply-to"]; ok {
			s, _ := v.(string)
			if a, ok := ParseApplyTo(s); ok {
				pol.ApplyTo = a
			} else {
				p.add(join(ip, "apply-to"), "expected %s, found %s", expectedOneOf(applyToNames), describe(v))
			}
		}
		if v, ok := m["priority"]; ok {
			if n, ok := asInt(v); ok && n >= -1<<31 && n < 1<<31 {
				pol.Priority = int(n)
			} else {
				p.add(join(ip, "priority"), "expected an integer, found %s", describe(v))
			}
		}
		if v, ok := m["definition"]; ok {
			pol.Definition = decodeDefinition(p, join(ip, "definition"), v, operator)
		} else {
			p.add(join(ip, "definition"), "expected a definition mapping such as {ha-mode: all}, found none")
		}
		out = append(out, pol)
	}
	return out
}

// Candidate is one policy of the vhost as Match considered it.
type Candidate struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
	Pattern  string `json:"pattern"`
	ApplyTo  string `json:"apply-to"`
	Source   string `json:"source"`
	Matched  bool   `json:"matched"`
	Won      bool   `json:"won"`
	Reason   string `json:"reason"`
}

// Explanation says how Match decided: every policy of the vhost in decision
// order (priority descending, then name ascending), and the winner.
type Explanation struct {
	VHost      string      `json:"vhost"`
	Name       string      `json:"name"`
	Kind       string      `json:"kind"`
	Exclusive  bool        `json:"exclusive"`
	Candidates []Candidate `json:"candidates"`
	Winner     string      `json:"winner,omitempty"`
}

// Match picks the policy that applies to the object name of kind in vhost,
// as RabbitMQ 3.x's rabbit_policy:match does: among the vhost's policies
// whose apply-to covers kind and whose pattern matches name anywhere
// (unanchored, like re:run), the highest priority wins.
//
// Ties: RabbitMQ sorts the matches with a stable sort on priority alone, so
// equal priorities keep the order the runtime-parameters table returned
// them in, which no API specifies. Match breaks ties by name, the
// lexicographically smallest winning, so every proxy decides the same way.
//
// Exclusive queues never match a policy that has ha-mode (they are never
// mirrored); a policy without ha-* keys still applies to them.
func Match(policies []Policy, vhost, name string, kind Kind, exclusive bool) (*Policy, Explanation) {
	ex := Explanation{VHost: vhost, Name: name, Kind: kind.String(), Exclusive: exclusive}
	order := make([]int, 0, len(policies))
	for i := range policies {
		if policies[i].VHost == vhost {
			order = append(order, i)
		}
	}
	sortByPriority(policies, order)
	var winner *Policy
	for _, i := range order {
		p := &policies[i]
		c := Candidate{Name: p.Name, Priority: p.Priority, Pattern: p.Pattern, ApplyTo: p.ApplyTo.String(), Source: p.Source}
		switch {
		case !p.ApplyTo.Matches(kind):
			c.Reason = fmt.Sprintf("apply-to %s does not cover a %s", p.ApplyTo, kind)
		case !p.matches(name):
			c.Reason = fmt.Sprintf("pattern %q does not match %q", p.Pattern, name)
		case exclusive && kind == KindQueue && p.Definition.Mirrored():
			c.Reason = "exclusive queues are never mirrored; this policy has ha-mode"
		case winner == nil:
			winner = p
			c.Matched, c.Won = true, true
			c.Reason = fmt.Sprintf("matches; highest priority (%d)", p.Priority)
			ex.Winner = p.Name
		case winner.Priority == p.Priority:
			c.Matched = true
			c.Reason = fmt.Sprintf("matches, but ties at priority %d with %q, which sorts first by name", p.Priority, winner.Name)
		default:
			c.Matched = true
			c.Reason = fmt.Sprintf("matches, but priority %d is below %q's %d", p.Priority, winner.Name, winner.Priority)
		}
		ex.Candidates = append(ex.Candidates, c)
	}
	return winner, ex
}

// matchFast is Match without the explanation, for the proxy's hot path.
func matchFast(policies []Policy, vhost, name string, kind Kind, exclusive bool) *Policy {
	var winner *Policy
	for i := range policies {
		p := &policies[i]
		if p.VHost != vhost || !p.ApplyTo.Matches(kind) {
			continue
		}
		if winner != nil && (p.Priority < winner.Priority || (p.Priority == winner.Priority && p.Name > winner.Name)) {
			continue
		}
		if exclusive && kind == KindQueue && p.Definition.Mirrored() {
			continue
		}
		if p.matches(name) {
			winner = p
		}
	}
	return winner
}

func sortByPriority(policies []Policy, order []int) {
	less := func(a, b *Policy) bool {
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		return a.Name < b.Name
	}
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && less(&policies[order[j]], &policies[order[j-1]]); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
}

// Effective merges the user policy's definition with the operator policy's
// the way RabbitMQ 3.x does (rabbit_policy:merge_operator_definitions with
// the merge strategies of rabbit_mirror_queue_misc and rabbit_policies) and
// fills in defaults:
//   - a key only one side sets is taken from it;
//   - ha-mode: all beats exactly beats nodes;
//   - ha-params: two counts give the larger, a count beats a node list, two
//     node lists give the longer (the operator's when equal);
//   - ha-sync-mode: the operator's wins;
//   - expires, message-ttl, max-length, max-length-bytes,
//     max-in-memory-length, max-in-memory-bytes, delivery-limit: the smaller.
//
// ha-params that do not fit the merged ha-mode (a node list under
// "exactly", anything under "all") are dropped.
func Effective(user, operator *Policy) Definition {
	d, _ := merge(user, operator)
	return d
}

func merge(user, operator *Policy) (Definition, []string) {
	switch {
	case user == nil && operator == nil:
		return Definition{}.WithDefaults(), nil
	case operator == nil:
		return user.Definition.WithDefaults(), nil
	case user == nil:
		return operator.Definition.WithDefaults(), []string{fmt.Sprintf("no user policy; operator policy %q applies alone", operator.Name)}
	}
	u, o := user.Definition, operator.Definition
	d := u
	d.Other = make(map[string]any, len(u.Other)+len(o.Other))
	for k, v := range u.Other {
		d.Other[k] = v
	}
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }

	switch {
	case o.HAMode == HANone || o.HAMode == u.HAMode:
	case u.HAMode == HANone:
		d.HAMode = o.HAMode
		note("ha-mode %s from the operator policy", o.HAMode)
	case u.HAMode == HAAll:
		note("ha-mode all (user) beats %s (operator)", o.HAMode)
	case o.HAMode == HAAll:
		d.HAMode = HAAll
		note("ha-mode all (operator) beats %s (user)", u.HAMode)
	case u.HAMode == HAExactly:
		note("ha-mode exactly (user) beats %s (operator)", o.HAMode)
	case o.HAMode == HAExactly:
		d.HAMode = HAExactly
		note("ha-mode exactly (operator) beats %s (user)", u.HAMode)
	}

	uSet := u.HAParams.Count != 0 || u.HAParams.Nodes != nil
	oSet := o.HAParams.Count != 0 || o.HAParams.Nodes != nil
	uCount, oCount := u.HAParams.Nodes == nil, o.HAParams.Nodes == nil
	switch {
	case !oSet:
	case !uSet:
		d.HAParams = o.HAParams
	case uCount && oCount:
		if o.HAParams.Count > u.HAParams.Count {
			d.HAParams = o.HAParams
			note("ha-params %d (operator) is larger than %d (user)", o.HAParams.Count, u.HAParams.Count)
		}
	case uCount:
	case oCount:
		d.HAParams = o.HAParams
	default:
		if len(o.HAParams.Nodes) >= len(u.HAParams.Nodes) {
			d.HAParams = o.HAParams
			note("ha-params: the operator's node list (%d) is at least as long as the user's (%d)", len(o.HAParams.Nodes), len(u.HAParams.Nodes))
		}
	}
	switch d.HAMode {
	case HAAll, HANone:
		d.HAParams = HAParams{}
	case HAExactly:
		if d.HAParams.Nodes != nil {
			d.HAParams = u.HAParams
		}
	}

	if o.SyncMode != SyncUnset {
		if u.SyncMode != SyncUnset && u.SyncMode != o.SyncMode {
			note("ha-sync-mode %s (operator) wins over %s (user)", o.SyncMode, u.SyncMode)
		}
		d.SyncMode = o.SyncMode
	}
	for k, ov := range o.Other {
		uv, both := d.Other[k]
		ui, uok := asInt(uv)
		oi, ook := asInt(ov)
		switch {
		case !both:
			d.Other[k] = ov
		case uok && ook && oi < ui:
			d.Other[k] = ov
			note("%s %d (operator) is smaller than %d (user)", k, oi, ui)
		}
	}
	if len(d.Other) == 0 {
		d.Other = nil
	}
	return d.WithDefaults(), notes
}

// Report answers "which policy applies to this queue, and why": the user
// and operator decisions, the merge, and the effective definition.
type Report struct {
	User      Explanation `json:"policy"`
	Operator  Explanation `json:"operator_policy"`
	Merge     []string    `json:"merge,omitempty"`
	Effective Definition  `json:"effective"`
}

// Explain matches both policy lists and merges the winners.
func Explain(policies, operatorPolicies []Policy, vhost, name string, kind Kind, exclusive bool) Report {
	u, ue := Match(policies, vhost, name, kind, exclusive)
	o, oe := Match(operatorPolicies, vhost, name, kind, exclusive)
	d, notes := merge(u, o)
	return Report{User: ue, Operator: oe, Merge: notes, Effective: d}
}

// String renders the report for `ctl list_policies --explain`.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q in vhost %q", r.User.Kind, r.User.Name, r.User.VHost)
	if r.User.Exclusive {
		b.WriteString(" (exclusive)")
	}
	b.WriteString("\n")
	for _, part := range []struct {
		title string
		ex    Explanation
	}{{"policies", r.User}, {"operator policies", r.Operator}} {
		fmt.Fprintf(&b, "%s:\n", part.title)
		if len(part.ex.Candidates) == 0 {
			b.WriteString("  (none in this vhost)\n")
		}
		for _, c := range part.ex.Candidates {
			mark := " "
			if c.Won {
				mark = "*"
			}
			fmt.Fprintf(&b, "  %s %s\tpriority %d\t%s\t%s\n", mark, c.Name, c.Priority, c.Source, c.Reason)
		}
	}
	winner := r.User.Winner
	if winner == "" {
		winner = "(none)"
	}
	op := r.Operator.Winner
	if op == "" {
		op = "(none)"
	}
	fmt.Fprintf(&b, "applies: policy %s, operator policy %s\n", winner, op)
	for _, n := range r.Merge {
		fmt.Fprintf(&b, "merge: %s\n", n)
	}
	fmt.Fprintf(&b, "effective definition: %s\n", r.Effective)
	return b.String()
}
