package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
)

// FieldError is one problem with one key. Source names where the value came
// from (the config file, an environment variable, a flag, or a set_policy
// request), Path the key path inside it (policies[1].definition.ha-params),
// and Message what was expected and what was found.
type FieldError struct {
	Source  string
	Path    string
	Message string
}

func (e *FieldError) Error() string {
	switch {
	case e.Source != "" && e.Path != "":
		return e.Source + ": " + e.Path + ": " + e.Message
	case e.Source != "":
		return e.Source + ": " + e.Message
	case e.Path != "":
		return e.Path + ": " + e.Message
	}
	return e.Message
}

// problems collects every FieldError of one parse so they are reported
// together (errors.Join) rather than one per attempt.
type problems struct {
	source string
	errs   []error
	seen   map[string]bool // sections already checked
}

// once reports whether key is seen for the first time.
func (p *problems) once(key string) bool {
	if p.seen[key] {
		return false
	}
	if p.seen == nil {
		p.seen = make(map[string]bool)
	}
	p.seen[key] = true
	return true
}

func (p *problems) add(path, format string, args ...any) {
	p.errs = append(p.errs, &FieldError{Source: p.source, Path: path, Message: fmt.Sprintf(format, args...)})
}

func (p *problems) err() error { return errors.Join(p.errs...) }

// join builds a key path: join("policies[1]", "definition") = "policies[1].definition".
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

// describe renders a found value for "expected X, found Y" messages.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "nothing (null)"
	case string:
		return fmt.Sprintf("%q (string)", x)
	case bool:
		return fmt.Sprintf("%v (boolean)", x)
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprintf("%v (integer)", x)
	case float32, float64:
		return fmt.Sprintf("%v (number)", x)
	case json.Number:
		return fmt.Sprintf("%s (number)", x)
	case []any:
		return fmt.Sprintf("a list of %d items", len(x))
	case []string:
		return fmt.Sprintf("a list of %d items", len(x))
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("%v (%T)", v, v)
}

// kind names the type of a found value without showing the value: "an
// integer", "a string", "a list of 2 items".
func kind(v any) string {
	switch x := v.(type) {
	case nil:
		return "nothing (null)"
	case string:
		if x == "" {
			return "an empty string"
		}
		return "a string"
	case bool:
		return "a boolean"
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return "an integer"
	case float32, float64, json.Number:
		return "a number"
	case []any:
		return fmt.Sprintf("a list of %d items", len(x))
	case []string:
		return fmt.Sprintf("a list of %d items", len(x))
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("a value of type %T", v)
}

// secretKind is what a problem with a secret key says it found: the type
// only, and why the value is not shown.
func secretKind(key string, v any) string {
	if v == nil {
		return kind(v)
	}
	return kind(v) + " (value not shown: " + key + " is a secret)"
}

// asInt converts the integer representations produced by the YAML and JSON
// decoders; floats are refused, like RabbitMQ's is_integer guards.
func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case int32:
		return int64(x), true
	case uint64:
		if x > 1<<62 {
			return 0, false
		}
		return int64(x), true
	case uint32:
		return int64(x), true
	case json.Number:
		n, err := x.Int64()
		return n, err == nil
	}
	return 0, false
}

// unknownKeys reports every key of m that is not in known, sorted so the
// report is stable.
func (p *problems) unknownKeys(path string, m map[string]any, known []string, what string) {
	var bad []string
	for k := range m {
		found := false
		for _, n := range known {
			if k == n {
				found = true
				break
			}
		}
		if !found {
			bad = append(bad, k)
		}
	}
	sort.Strings(bad)
	for _, k := range bad {
		p.add(join(path, k), "unknown key; expected one of the %s keys: %v", what, known)
	}
}
