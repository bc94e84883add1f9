package config

import "fmt"

// The enums below are the closed vocabularies of the file and of policy
// definitions. Each zero value means "not given"; String never panics, and
// unknown values print as "unknown(N)" so a corrupted value is visible in
// logs instead of crashing them.

// HAMode is a policy's ha-mode.
type HAMode int

// HA modes. HANone (no ha-mode key) means the queue is not mirrored.
const (
	HANone HAMode = iota
	HAExactly
	HAAll
	HANodes
)

var haModeNames = []string{"", "exactly", "all", "nodes"}

func (m HAMode) String() string { return enumString(haModeNames, int(m)) }

// ParseHAMode parses an ha-mode value as RabbitMQ spells it.
func ParseHAMode(s string) (HAMode, bool) {
	i, ok := enumParse(haModeNames, s)
	return HAMode(i), ok
}

// MarshalText implements encoding.TextMarshaler.
func (m HAMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// SyncMode is a policy's ha-sync-mode.
type SyncMode int

// Sync modes; SyncUnset resolves to SyncManual, RabbitMQ's default.
const (
	SyncUnset SyncMode = iota
	SyncManual
	SyncAutomatic
)

var syncModeNames = []string{"", "manual", "automatic"}

func (m SyncMode) String() string { return enumString(syncModeNames, int(m)) }

// ParseSyncMode parses an ha-sync-mode value.
func ParseSyncMode(s string) (SyncMode, bool) {
	i, ok := enumParse(syncModeNames, s)
	return SyncMode(i), ok
}

// MarshalText implements encoding.TextMarshaler.
func (m SyncMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// PromoteMode is the value of ha-promote-on-shutdown and ha-promote-on-failure.
type PromoteMode int

// Promote modes; PromoteUnset resolves to the key's RabbitMQ default
// (when-synced on shutdown, always on failure).
const (
	PromoteUnset PromoteMode = iota
	PromoteAlways
	PromoteWhenSynced
)

var promoteModeNames = []string{"", "always", "when-synced"}

func (m PromoteMode) String() string { return enumString(promoteModeNames, int(m)) }

// ParsePromoteMode parses an ha-promote-on-* value.
func ParsePromoteMode(s string) (PromoteMode, bool) {
	i, ok := enumParse(promoteModeNames, s)
	return PromoteMode(i), ok
}

// MarshalText implements encoding.TextMarshaler.
func (m PromoteMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// Locator chooses the backend that holds a new queue's master.
type Locator int

// Locators; LocatorUnset defers to the next level (queue argument, policy,
// then the file's queue_master_locator).
const (
	LocatorUnset Locator = iota
	LocatorMinMasters
	LocatorClientLocal
	LocatorRandom
)

var locatorNames = []string{"", "min-masters", "client-local", "random"}

func (l Locator) String() string { return enumString(locatorNames, int(l)) }

// ParseLocator parses a queue-master-locator value.
func ParseLocator(s string) (Locator, bool) {
	i, ok := enumParse(locatorNames, s)
	return Locator(i), ok
}

// MarshalText implements encoding.TextMarshaler.
func (l Locator) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// ApplyTo says which kind of object a policy applies to.
type ApplyTo int

// ApplyUnset resolves to ApplyAll, rabbitmqctl's default for --apply-to.
const (
	ApplyUnset ApplyTo = iota
	ApplyQueues
	ApplyExchanges
	ApplyAll
)

var applyToNames = []string{"", "queues", "exchanges", "all"}

func (a ApplyTo) String() string { return enumString(applyToNames, int(a)) }

// ParseApplyTo parses an apply-to value.
func ParseApplyTo(s string) (ApplyTo, bool) {
	i, ok := enumParse(applyToNames, s)
	return ApplyTo(i), ok
}

// MarshalText implements encoding.TextMarshaler.
func (a ApplyTo) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *ApplyTo) UnmarshalText(b []byte) error {
	v, ok := ParseApplyTo(string(b))
	if !ok && len(b) > 0 {
		return fmt.Errorf("apply-to: expected one of queues, exchanges, all, found %q", b)
	}
	*a = v
	return nil
}

// Matches reports whether a policy with this apply-to applies to kind.
func (a ApplyTo) Matches(kind Kind) bool {
	switch a {
	case ApplyAll, ApplyUnset:
		return kind == KindQueue || kind == KindExchange
	case ApplyQueues:
		return kind == KindQueue
	case ApplyExchanges:
		return kind == KindExchange
	}
	return false
}

// Kind is the kind of object a policy is matched against.
type Kind int

// Object kinds.
const (
	KindQueue Kind = iota
	KindExchange
)

var kindNames = []string{"queue", "exchange"}

func (k Kind) String() string { return enumString(kindNames, int(k)) }

func enumString(names []string, i int) string {
	if i < 0 || i >= len(names) {
		return fmt.Sprintf("unknown(%d)", i)
	}
	return names[i]
}

func enumParse(names []string, s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	for i, n := range names {
		if n == s {
			return i, true
		}
	}
	return 0, false
}

// expectedOneOf lists an enum's spellings for error messages.
func expectedOneOf(names []string) string {
	s := "one of "
	first := true
	for _, n := range names {
		if n == "" {
			continue
		}
		if !first {
			s += ", "
		}
		s += n
		first = false
	}
	return s
}
