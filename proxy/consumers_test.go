package proxy

import "testing"

// TestClientCancels: the client's cancel finds a consumer that consumes and
// an orphan alike, each with the link it consumed on, and ends an orphan's
// wait for a new master.
func TestClientCancels(t *testing.T) {
	for _, tc := range []struct {
		name      string
		tag       string
		wantKnown bool
		wantLink  int
	}{
		{name: "consuming", tag: "live", wantKnown: true, wantLink: 1},
		{name: "orphan", tag: "waiting", wantKnown: true, wantLink: 2},
		{name: "unknown", tag: "never"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := channelConsumers{
				byTag:    map[string]consumer{"live": {link: 1}},
				orphaned: map[string]consumer{"waiting": {link: 2}},
			}
			cons, known := cs.clientCancels(tc.tag)
			if known != tc.wantKnown || known && cons.link != tc.wantLink {
				t.Fatalf("clientCancels(%q) = link %d, %v; want link %d, %v", tc.tag, cons.link, known, tc.wantLink, tc.wantKnown)
			}
			if cs.isOrphan(tc.tag) {
				t.Errorf("%q is still an orphan after the client cancelled it", tc.tag)
			}
		})
	}
}
