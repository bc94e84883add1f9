package admin

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// TestCtlHealthCommands: check_ready and check_alive answer from the
// tokenless endpoints, with 69 and the server's reason when the proxy is
// not ready, and never send a token there.
func TestCtlHealthCommands(t *testing.T) {
	var notReady error
	store, err := config.OpenPolicyStore(t.TempDir(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	server := NewServer(store, testToken, nil, WithReadiness(func() error { return notReady }))
	var sentToken bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			sentToken = true
		}
		server.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	tokenless := &Client{BaseURL: srv.URL}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte("<html>RabbitMQ Management</html>"))
	}))
	t.Cleanup(other.Close)

	runCtlCases(t, []ctlCase{
		{name: "ready", client: tokenless, args: []string{"check_ready"}, code: ExitOK, wantStdout: "ready\n"},
		{name: "alive", client: tokenless, args: []string{"check_alive"}, code: ExitOK, wantStdout: "alive\n"},
		{name: "quiet", client: tokenless, args: []string{"check_ready", "-q"}, code: ExitOK},
		{name: "another server", client: &Client{BaseURL: other.URL}, args: []string{"check_ready"}, code: ExitUnavailable, wantStderr: "is not amqp-mirror's admin API"},
	})
	notReady = errors.New("paused: this proxy sees no majority of the cluster")
	runCtlCases(t, []ctlCase{
		{name: "not ready", client: tokenless, args: []string{"check_ready"}, code: ExitUnavailable,
			wantStderr: "Error: not ready: paused: this proxy sees no majority of the cluster"},
		{name: "alive while not ready", client: tokenless, args: []string{"check_alive"}, code: ExitOK, wantStdout: "alive\n"},
	})
	if sentToken {
		t.Error("a health command sent an Authorization header")
	}
}
