package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// DefaultSyncBatchSize is RabbitMQ's default ha-sync-batch-size.
const DefaultSyncBatchSize = 4096

// Definition is a policy's definition: the ha-* keys typed, and the other
// RabbitMQ policy keys the proxy passes on or ignores kept in Other.
//
// A Definition from ParseDefinition or the file holds exactly what was
// written (zero values mean "not given"), because operator merging needs to
// know which keys were set. WithDefaults fills in RabbitMQ's defaults;
// Effective returns merged definitions with defaults applied.
type Definition struct {
	HAMode             HAMode
	HAParams           HAParams
	SyncMode           SyncMode
	SyncBatchSize      int
	PromoteOnShutdown  PromoteMode
	PromoteOnFailure   PromoteMode
	QueueMasterLocator Locator
	// Other holds accepted non-ha keys (max-length, message-ttl, ...) with
	// integers as int64 and strings as string.
	Other map[string]any
}

// HAParams is ha-params: a copy count for ha-mode exactly, backend names for
// ha-mode nodes, nothing for all.
type HAParams struct {
	Count int
	Nodes []string
}

// Mirrored reports whether the definition asks for mirroring.
func (d Definition) Mirrored() bool { return d.HAMode != HANone }

// WithDefaults returns d with RabbitMQ 3.x's defaults for the unset ha-*
// keys of a mirrored definition: ha-sync-mode manual, ha-sync-batch-size
// 4096, ha-promote-on-shutdown when-synced, ha-promote-on-failure always.
// A definition without ha-mode is returned unchanged.
func (d Definition) WithDefaults() Definition {
	if d.HAMode == HANone {
		return d
	}
	if d.SyncMode == SyncUnset {
		d.SyncMode = SyncManual
	}
	if d.SyncBatchSize == 0 {
		d.SyncBatchSize = DefaultSyncBatchSize
	}
	if d.PromoteOnShutdown == PromoteUnset {
		d.PromoteOnShutdown = PromoteWhenSynced
	}
	if d.PromoteOnFailure == PromoteUnset {
		d.PromoteOnFailure = PromoteAlways
	}
	return d
}

// Map renders the definition as the JSON object rabbitmqctl prints,
// containing only keys that were given.
func (d Definition) Map() map[string]any {
	m := make(map[string]any, len(d.Other)+7)
	for k, v := range d.Other {
		m[k] = v
	}
	if d.HAMode != HANone {
		m["ha-mode"] = d.HAMode.String()
	}
	switch {
	case d.HAParams.Nodes != nil:
		m["ha-params"] = append([]string(nil), d.HAParams.Nodes...)
	case d.HAParams.Count != 0:
		m["ha-params"] = d.HAParams.Count
	}
	if d.SyncMode != SyncUnset {
		m["ha-sync-mode"] = d.SyncMode.String()
	}
	if d.SyncBatchSize != 0 {
		m["ha-sync-batch-size"] = d.SyncBatchSize
	}
	if d.PromoteOnShutdown != PromoteUnset {
		m["ha-promote-on-shutdown"] = d.PromoteOnShutdown.String()
	}
	if d.PromoteOnFailure != PromoteUnset {
		m["ha-promote-on-failure"] = d.PromoteOnFailure.String()
	}
	if d.QueueMasterLocator != LocatorUnset {
		m["queue-master-locator"] = d.QueueMasterLocator.String()
	}
	return m
}

// MarshalJSON writes the rabbitmqctl form, e.g. {"ha-mode":"exactly","ha-params":2}.
func (d Definition) MarshalJSON() ([]byte, error) { return json.Marshal(d.Map()) }

// UnmarshalJSON accepts what ParseDefinition accepts, and also an empty
// object or null (the effective definition of an object no policy matches).
func (d *Definition) UnmarshalJSON(b []byte) error {
	if t := string(bytes.TrimSpace(b)); t == "null" || strings.ReplaceAll(t, " ", "") == "{}" {
		*d = Definition{}
		return nil
	}
	v, err := ParseDefinition(b)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// String is the compact JSON form, as list_policies prints it.
func (d Definition) String() string {
	b, err := d.MarshalJSON()
	if err != nil {
		return fmt.Sprintf("%#v", d.Map())
	}
	return string(b)
}

// ParseDefinition parses set_policy's DEFINITION argument exactly as
// rabbitmqctl takes it: a JSON object such as {"ha-mode":"exactly","ha-params":2}.
// It validates like RabbitMQ (see validateDefinition) and reports every
// problem at once.
func ParseDefinition(data []byte) (Definition, error) {
	return parseDefinition(data, false)
}

// ParseOperatorDefinition is ParseDefinition for set_operator_policy, which
// accepts fewer keys (see operatorKeys).
func ParseOperatorDefinition(data []byte) (Definition, error) {
	return parseDefinition(data, true)
}

func parseDefinition(data []byte, operator bool) (Definition, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return Definition{}, &FieldError{Path: "definition", Message: fmt.Sprintf("expected a JSON object, could not parse it: %v", err)}
	}
	if dec.More() {
		return Definition{}, &FieldError{Path: "definition", Message: "expected one JSON object, found trailing data"}
	}
	p := &problems{}
	d := decodeDefinition(p, "definition", raw, operator)
	return d, p.err()
}

// Policy keys RabbitMQ 3.x accepts besides the ha-* ones, with their checks
// (rabbit_policies.erl and plugins). Only the ha-* keys and
// queue-master-locator change what the proxy does; the rest are accepted so
// existing RabbitMQ policies load unchanged.
var otherKeys = map[string]func(v any) (any, string){
	"alternate-exchange":            stringValue,
	"dead-letter-exchange":          stringValue,
	"dead-letter-routing-key":       stringValue,
	"federation-upstream":           stringValue,
	"federation-upstream-set":       stringValue,
	"message-ttl":                   intAtLeast(0),
	"expires":                       intAtLeast(1),
	"max-length":                    intAtLeast(0),
	"max-length-bytes":              intAtLeast(0),
	"max-in-memory-length":          intAtLeast(0),
	"max-in-memory-bytes":           intAtLeast(0),
	"delivery-limit":                intAtLeast(0),
	"initial-cluster-size":          intAtLeast(0),
	"max-segment-size":              intAtLeast(0),
	"stream-max-segment-size-bytes": intAtLeast(0),
	"queue-version":                 intBetween(1, 2),
	"queue-mode":                    oneOf("default", "lazy"),
	"overflow":                      oneOf("drop-head", "reject-publish", "reject-publish-dlx"),
	"queue-leader-locator":          oneOf("client-local", "random", "least-leaders", "balanced"),
	"dead-letter-strategy":          oneOf("at-most-once", "at-least-once"),
	"max-age":                       matches(regexp.MustCompile(`^[0-9]+[YMDhms]$`), "a duration such as 7D or 12h"),
}

// operatorKeys are the keys RabbitMQ 3.x registers as
// operator_policy_validator (rabbit_policies.erl, rabbit_mirror_queue_misc.erl).
var operatorKeys = []string{
	"ha-mode", "ha-params", "ha-sync-mode",
	"expires", "message-ttl", "max-length", "max-length-bytes",
	"max-in-memory-length", "max-in-memory-bytes", "delivery-limit",
}

var haKeys = []string{
	"ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size",
	"ha-promote-on-shutdown", "ha-promote-on-failure",
}

func stringValue(v any) (any, string) {
	if s, ok := v.(string); ok {
		return s, ""
	}
	return nil, "a string"
}

func intAtLeast(min int64) func(any) (any, string) {
	return func(v any) (any, string) {
		if n, ok := asInt(v); ok && n >= min {
			return n, ""
		}
		return nil, fmt.Sprintf("an integer >= %d", min)
	}
}

func intBetween(min, max int64) func(any) (any, string) {
	return func(v any) (any, string) {
		if n, ok := asInt(v); ok && n >= min && n <= max {
			return n, ""
		}
		return nil, fmt.Sprintf("an integer from %d to %d", min, max)
	}
}

func oneOf(values ...string) func(any) (any, string) {
	return func(v any) (any, string) {
		if s, ok := v.(string); ok {
			for _, w := range values {
				if s == w {
					return s, ""
				}
			}
		}
		return nil, "one of " + strings.Join(values, ", ")
	}
}

func matches(re *regexp.Regexp, what string) func(any) (any, string) {
	return func(v any) (any, string) {
		if s, ok := v.(string); ok && re.MatchString(s) {
			return s, ""
		}
		return nil, what
	}
}

func knownDefinitionKeys(operator bool) []string {
	if operator {
		return operatorKeys
	}
	keys := append([]string{}, haKeys...)
	keys = append(keys, "queue-master-locator")
	for k := range otherKeys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// decodeDefinition validates a definition mapping the way RabbitMQ 3.x does
// (rabbit_mirror_queue_misc:validate_policy and the ha mode modules):
//   - ha-* keys without ha-mode are refused;
//   - ha-mode exactly needs ha-params, a positive integer;
//   - ha-mode all takes no ha-params;
//   - ha-mode nodes needs ha-params, a non-empty list of strings;
//   - ha-sync-mode manual|automatic, ha-sync-batch-size a positive integer,
//     ha-promote-on-shutdown/-failure always|when-synced;
//   - an unknown key is refused (RabbitMQ: "not recognised policy settings").
//
// Every problem is reported, each with its key path. It is one switch over
// the keys a definition may hold, read in one place beside the rules
// above, which is why it runs past a hundred lines.
func decodeDefinition(p *problems, path string, raw any, operator bool) Definition {
	var d Definition
	m, ok := raw.(map[string]any)
	if !ok {
		p.add(path, "expected a mapping of policy keys such as {\"ha-mode\": \"all\"}, found %s", describe(raw))
		return d
	}
	if len(m) == 0 {
		p.add(path, "expected at least one policy key, found an empty definition")
		return d
	}
	what := "policy definition"
	if operator {
		what = "operator policy definition"
	}
	p.unknownKeys(path, m, knownDefinitionKeys(operator), what)

	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := m[k]
		check, ok := otherKeys[k]
		if !ok {
			continue
		}
		if operator && !contains(operatorKeys, k) {
			continue // already reported as unknown
		}
		val, want := check(v)
		if want != "" {
			p.add(join(path, k), "expected %s, found %s", want, describe(v))
			continue
		}
		if d.Other == nil {
			d.Other = make(map[string]any)
		}
		d.Other[k] = val
	}
	if v, ok := m["queue-master-locator"]; ok && !operator {
		s, _ := v.(string)
		if l, ok := ParseLocator(s); ok {
			d.QueueMasterLocator = l
		} else {
			p.add(join(path, "queue-master-locator"), "expected %s, found %s", expectedOneOf(locatorNames), describe(v))
		}
	}

	modeRaw, hasMode := m["ha-mode"]
	if !hasMode {
		for _, k := range haKeys {
			if _, ok := m[k]; ok && (!operator || contains(operatorKeys, k)) {
				p.add(join(path, k), "ha-mode must be specified to use %s; found %s without ha-mode", k, k)
			}
		}
		return d
	}
	modeString, _ := modeRaw.(string)
	mode, ok := ParseHAMode(modeString)
	if !ok {
		p.add(join(path, "ha-mode"), "expected %s, found %s", expectedOneOf(haModeNames), describe(modeRaw))
	}
	d.HAMode = mode
	params, hasParams := m["ha-params"]
	paramsPath := join(path, "ha-params")
	switch mode {
	case HAExactly:
		n, isInt := asInt(params)
		switch {
		case !hasParams:
			p.add(paramsPath, "ha-mode \"exactly\" needs ha-params, a positive integer (the number of copies); found no ha-params")
		case !isInt || n <= 0 || n > 1<<31:
			p.add(paramsPath, "ha-mode \"exactly\" takes a positive integer, found %s", describe(params))
		default:
			d.HAParams.Count = int(n)
		}
	case HAAll:
		if hasParams {
			p.add(paramsPath, "ha-mode \"all\" does not take ha-params, found %s", describe(params))
		}
	case HANodes:
		list, isList := params.([]any)
		switch {
		case !hasParams:
			p.add(paramsPath, "ha-mode \"nodes\" needs ha-params, a non-empty list of backend names; found no ha-params")
		case !isList:
			p.add(paramsPath, "ha-mode \"nodes\" takes a non-empty list of backend names (strings), found %s", describe(params))
		case len(list) == 0:
			p.add(paramsPath, "ha-mode \"nodes\" takes a non-empty list of backend names, found an empty list")
		default:
			nodes := make([]string, 0, len(list))
			for i, item := range list {
				s, ok := item.(string)
				if !ok || s == "" {
					p.add(index(paramsPath, i), "expected a backend name (non-empty string), found %s", describe(item))
					continue
				}
				nodes = append(nodes, s)
			}
			d.HAParams.Nodes = nodes
		}
	}
	if v, ok := m["ha-sync-mode"]; ok {
		s, _ := v.(string)
		if sm, ok := ParseSyncMode(s); ok {
			d.SyncMode = sm
		} else {
			p.add(join(path, "ha-sync-mode"), "expected %s, found %s", expectedOneOf(syncModeNames), describe(v))
		}
	}
	if operator {
		return d
	}
	if v, ok := m["ha-sync-batch-size"]; ok {
		n, isInt := asInt(v)
		if isInt && n > 0 && n <= 1<<31 {
			d.SyncBatchSize = int(n)
		} else {
			p.add(join(path, "ha-sync-batch-size"), "expected an integer greater than 0, found %s", describe(v))
		}
	}
	for _, key := range []string{"ha-promote-on-shutdown", "ha-promote-on-failure"} {
		v, ok := m[key]
		if !ok {
			continue
		}
		s, _ := v.(string)
		pm, ok := ParsePromoteMode(s)
		if !ok {
			p.add(join(path, key), "expected %s, found %s", expectedOneOf(promoteModeNames), describe(v))
			continue
		}
		if key == "ha-promote-on-shutdown" {
			d.PromoteOnShutdown = pm
		} else {
			d.PromoteOnFailure = pm
		}
	}
	return d
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
