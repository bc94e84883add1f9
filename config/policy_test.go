package config

import (
	"reflect"
	"strings"
	"testing"
)

func mustPolicy(t *testing.T, name, vhost, pattern string, applyTo ApplyTo, priority int, def string) Policy {
	t.Helper()
	d, err := ParseDefinition([]byte(def))
	if err != nil {
		t.Fatalf("ParseDefinition(%s): %v", def, err)
	}
	p, err := Policy{Name: name, VHost: vhost, Pattern: pattern, ApplyTo: applyTo, Priority: priority, Definition: d}.Validated(false)
	if err != nil {
		t.Fatalf("Validated: %v", err)
	}
	return p
}

func TestMatch(t *testing.T) {
	all := `{"ha-mode":"all"}`
	ttl := `{"message-ttl":1000}`
	policies := []Policy{
		mustPolicy(t, "low", "/", "^queue_", ApplyQueues, 0, all),
		mustPolicy(t, "high", "/", "^queue_", ApplyAll, 5, `{"ha-mode":"exactly","ha-params":2}`),
		mustPolicy(t, "b-tie", "/", "tie", ApplyQueues, 3, all),
		mustPolicy(t, "a-tie", "/", "tie", ApplyQueues, 3, all),
		mustPolicy(t, "exchanges", "/", "^amq", ApplyExchanges, 9, ttl),
		mustPolicy(t, "other-vhost", "prod", "^queue_", ApplyQueues, 100, all),
		mustPolicy(t, "ttl", "/", "excl", ApplyQueues, 0, ttl),
		mustPolicy(t, "ha-excl", "/", "excl", ApplyQueues, 10, all),
		mustPolicy(t, "unanchored", "/", "middle", ApplyAll, 0, all),
	}
	tests := []struct {
		name      string
		vhost     string
		object    string
		kind      Kind
		exclusive bool
		want      string // winner, "" for none
	}{
		{"highest priority wins", "/", "queue_1", KindQueue, false, "high"},
		{"tie broken by name", "/", "tie", KindQueue, false, "a-tie"},
		{"apply-to queues skips exchanges", "/", "tie", KindExchange, false, ""},
		{"apply-to exchanges", "/", "amq.direct", KindExchange, false, "exchanges"},
		{"apply-to exchanges skips queues", "/", "amq.gen-1", KindQueue, false, ""},
		{"apply-to all covers exchanges", "/", "queue_x", KindExchange, false, "high"},
		{"vhost separates", "prod", "queue_1", KindQueue, false, "other-vhost"},
		{"unknown vhost", "dev", "queue_1", KindQueue, false, ""},
		{"no match", "/", "orders", KindQueue, false, ""},
		{"pattern unanchored", "/", "the_middle_one", KindQueue, false, "unanchored"},
		{"exclusive skips HA policies", "/", "excl", KindQueue, true, "ttl"},
		{"non-exclusive takes the HA policy", "/", "excl", KindQueue, false, "ha-excl"},
		{"exclusive with only HA policies", "/", "queue_1", KindQueue, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ex := Match(policies, tc.vhost, tc.object, tc.kind, tc.exclusive)
			gotName := ""
			if got != nil {
				gotName = got.Name
			}
			if gotName != tc.want {
				t.Errorf("Match: got %q, want %q; explanation %+v", gotName, tc.want, ex)
			}
			if ex.Winner != tc.want {
				t.Errorf("explanation winner: got %q, want %q", ex.Winner, tc.want)
			}
			fast := matchFast(policies, tc.vhost, tc.object, tc.kind, tc.exclusive)
			if fast != got {
				t.Errorf("matchFast: got %v, want the same as Match (%v)", fast, got)
			}
		})
	}
}

func TestMatchTieIsIndependentOfOrder(t *testing.T) {
	a := mustPolicy(t, "a", "/", ".", ApplyAll, 1, `{"ha-mode":"all"}`)
	b := mustPolicy(t, "b", "/", ".", ApplyAll, 1, `{"ha-mode":"all"}`)
	for _, order := range [][]Policy{{a, b}, {b, a}} {
		got, _ := Match(order, "/", "q", KindQueue, false)
		if got.Name != "a" {
			t.Errorf("order %s,%s: got %q, want a", order[0].Name, order[1].Name, got.Name)
		}
	}
}

func TestParseDefinition(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		want    Definition
		wantErr string
	}{
		{"exactly", `{"ha-mode":"exactly","ha-params":2}`, Definition{HAMode: HAExactly, HAParams: HAParams{Count: 2}}, ""},
		{"all with sync", `{"ha-mode":"all","ha-sync-mode":"automatic"}`, Definition{HAMode: HAAll, SyncMode: SyncAutomatic}, ""},
		{"nodes", `{"ha-mode":"nodes","ha-params":["rabbit1","rabbit2"]}`, Definition{HAMode: HANodes, HAParams: HAParams{Nodes: []string{"rabbit1", "rabbit2"}}}, ""},
		{"every ha key", `{"ha-mode":"all","ha-sync-batch-size":10,"ha-promote-on-shutdown":"always","ha-promote-on-failure":"when-synced","queue-master-locator":"random"}`,
			Definition{HAMode: HAAll, SyncBatchSize: 10, PromoteOnShutdown: PromoteAlways, PromoteOnFailure: PromoteWhenSynced, QueueMasterLocator: LocatorRandom}, ""},
		{"other keys", `{"max-length":5,"dead-letter-exchange":"dlx"}`, Definition{Other: map[string]any{"max-length": int64(5), "dead-letter-exchange": "dlx"}}, ""},
		{"params as float", `{"ha-mode":"exactly","ha-params":2.0}`, Definition{}, "ha-params: ha-mode \"exactly\" takes a positive integer, found 2.0"},
		{"params as string", `{"ha-mode":"exactly","ha-params":"2"}`, Definition{}, "found \"2\" (string)"},
		{"nodes with numbers", `{"ha-mode":"nodes","ha-params":[1]}`, Definition{}, "ha-params[0]: expected a backend name"},
		{"all with params", `{"ha-mode":"all","ha-params":1}`, Definition{}, "does not take ha-params"},
		{"sync without mode", `{"ha-sync-mode":"automatic"}`, Definition{}, "ha-mode must be specified"},
		{"unknown key", `{"ha-mode":"all","ha-foo":1}`, Definition{}, "definition.ha-foo: unknown key"},
		{"not an object", `[1,2]`, Definition{}, "expected a mapping"},
		{"not json", `{ha-mode: all}`, Definition{}, "expected a JSON object"},
		{"trailing data", `{"ha-mode":"all"} x`, Definition{}, "trailing data"},
		{"empty", `{}`, Definition{}, "at least one policy key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDefinition([]byte(tc.json))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error: got %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v, want %#v", got, tc.want)
			}
			back, err := ParseDefinition([]byte(got.String()))
			if err != nil || !reflect.DeepEqual(back, got) {
				t.Errorf("round trip through %s: got %#v, %v", got, back, err)
			}
		})
	}
}

func TestParseOperatorDefinition(t *testing.T) {
	if _, err := ParseOperatorDefinition([]byte(`{"ha-mode":"exactly","ha-params":2,"max-length":10}`)); err != nil {
		t.Errorf("allowed operator keys: %v", err)
	}
	for _, def := range []string{`{"ha-mode":"all","ha-promote-on-failure":"always"}`, `{"dead-letter-exchange":"x"}`, `{"queue-master-locator":"random"}`} {
		if _, err := ParseOperatorDefinition([]byte(def)); err == nil || !strings.Contains(err.Error(), "unknown key") {
			t.Errorf("%s: got %v, want an unknown key error", def, err)
		}
	}
}

func TestEffective(t *testing.T) {
	pol := func(def string) *Policy {
		p := mustPolicy(t, "p", "/", ".", ApplyAll, 0, def)
		return &p
	}
	defaults := Definition{SyncMode: SyncManual, SyncBatchSize: 4096, PromoteOnShutdown: PromoteWhenSynced, PromoteOnFailure: PromoteAlways}
	with := func(d Definition) Definition {
		d.SyncMode, d.SyncBatchSize, d.PromoteOnShutdown, d.PromoteOnFailure = defaults.SyncMode, defaults.SyncBatchSize, defaults.PromoteOnShutdown, defaults.PromoteOnFailure
		return d
	}
	tests := []struct {
		name           string
		user, operator *Policy
		want           Definition
	}{
		{"neither", nil, nil, Definition{}},
		{"user only", pol(`{"ha-mode":"exactly","ha-params":2}`), nil, with(Definition{HAMode: HAExactly, HAParams: HAParams{Count: 2}})},
		{"operator only", nil, pol(`{"ha-mode":"all"}`), with(Definition{HAMode: HAAll})},
		{"all beats exactly (operator)", pol(`{"ha-mode":"exactly","ha-params":2}`), pol(`{"ha-mode":"all"}`), with(Definition{HAMode: HAAll})},
		{"all beats exactly (user)", pol(`{"ha-mode":"all"}`), pol(`{"ha-mode":"exactly","ha-params":3}`), with(Definition{HAMode: HAAll})},
		{"exactly beats nodes", pol(`{"ha-mode":"nodes","ha-params":["a","b","c"]}`), pol(`{"ha-mode":"exactly","ha-params":2}`), with(Definition{HAMode: HAExactly, HAParams: HAParams{Count: 2}})},
		{"exactly (user) beats nodes", pol(`{"ha-mode":"exactly","ha-params":2}`), pol(`{"ha-mode":"nodes","ha-params":["a"]}`), with(Definition{HAMode: HAExactly, HAParams: HAParams{Count: 2}})},
		{"larger count (operator)", pol(`{"ha-mode":"exactly","ha-params":2}`), pol(`{"ha-mode":"exactly","ha-params":3}`), with(Definition{HAMode: HAExactly, HAParams: HAParams{Count: 3}})},
		{"larger count (user)", pol(`{"ha-mode":"exactly","ha-params":4}`), pol(`{"ha-mode":"exactly","ha-params":3}`), with(Definition{HAMode: HAExactly, HAParams: HAParams{Count: 4}})},
		{"longer node list", pol(`{"ha-mode":"nodes","ha-params":["a"]}`), pol(`{"ha-mode":"nodes","ha-params":["b","c"]}`), with(Definition{HAMode: HANodes, HAParams: HAParams{Nodes: []string{"b", "c"}}})},
		{"equal node lists: operator", pol(`{"ha-mode":"nodes","ha-params":["a"]}`), pol(`{"ha-mode":"nodes","ha-params":["b"]}`), with(Definition{HAMode: HANodes, HAParams: HAParams{Nodes: []string{"b"}}})},
		{"operator sync mode wins", pol(`{"ha-mode":"all","ha-sync-mode":"automatic"}`), pol(`{"ha-mode":"all","ha-sync-mode":"manual"}`), with(Definition{HAMode: HAAll})},
		{"user sync mode kept", pol(`{"ha-mode":"all","ha-sync-mode":"automatic"}`), pol(`{"max-length":5}`),
			func() Definition {
				d := with(Definition{HAMode: HAAll, Other: map[string]any{"max-length": int64(5)}})
				d.SyncMode = SyncAutomatic
				return d
			}()},
		{"smaller max-length", pol(`{"max-length":10,"expires":100}`), pol(`{"max-length":5,"expires":1000}`), Definition{Other: map[string]any{"max-length": int64(5), "expires": int64(100)}}},
		{"user-only keys kept", pol(`{"ha-mode":"all","ha-promote-on-failure":"when-synced"}`), pol(`{"ha-mode":"exactly","ha-params":2}`),
			func() Definition {
				d := with(Definition{HAMode: HAAll})
				d.PromoteOnFailure = PromoteWhenSynced
				return d
			}()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Effective(tc.user, tc.operator)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

func TestExplain(t *testing.T) {
	policies := []Policy{
		mustPolicy(t, "ha-all", "/", "^queue_", ApplyQueues, 1, `{"ha-mode":"all"}`),
		mustPolicy(t, "ha-two", "/", "^queue_", ApplyQueues, 0, `{"ha-mode":"exactly","ha-params":2}`),
		mustPolicy(t, "exch", "/", ".", ApplyExchanges, 0, `{"alternate-exchange":"ae"}`),
	}
	op, err := Policy{Name: "cap", Pattern: ".", Definition: Definition{Other: map[string]any{"max-length": int64(100)}}}.Validated(true)
	if err != nil {
		t.Fatal(err)
	}
	r := Explain(policies, []Policy{op}, "/", "queue_1", KindQueue, false)
	out := r.String()
	for _, want := range []string{
		`queue "queue_1" in vhost "/"`,
		"* ha-all\tpriority 1",
		`priority 0 is below "ha-all"'s 1`,
		"apply-to exchanges does not cover a queue",
		"applies: policy ha-all, operator policy cap",
		`effective definition: {"ha-mode":"all","ha-promote-on-failure":"always","ha-promote-on-shutdown":"when-synced","ha-sync-batch-size":4096,"ha-sync-mode":"manual","max-length":100}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explanation lacks %q:\n%s", want, out)
		}
	}
}
