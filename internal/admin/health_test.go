package admin

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestEndpointsWithoutToken checks which endpoints answer without the
// admin token: the probes and /metrics do, and say nothing secret; every
// /api/ endpoint still refuses.
func TestEndpointsWithoutToken(t *testing.T) {
	notReady := errors.New("paused: this proxy sees a minority of the sidecar cluster")
	tests := []struct {
		name       string
		ready      func() error // nil: no WithReadiness
		path       string
		token      string
		wantStatus int
		wantBody   string // the body starts with it
	}{
		{name: "healthz", path: "/healthz", wantStatus: 200, wantBody: "ok\n"},
		{name: "healthz while not ready", ready: func() error { return notReady }, path: "/healthz", wantStatus: 200, wantBody: "ok\n"},
		{name: "readyz without a check", path: "/readyz", wantStatus: 200, wantBody: "ok\n"},
		{name: "readyz when ready", ready: func() error { return nil }, path: "/readyz", wantStatus: 200, wantBody: "ok\n"},
		{name: "readyz says why not", ready: func() error { return notReady }, path: "/readyz", wantStatus: 503, wantBody: "not ready: " + notReady.Error() + "\n"},
		{name: "metrics", path: "/metrics", wantStatus: 200, wantBody: "# HELP"},
		{name: "api without token", path: "/api/policies", wantStatus: 401, wantBody: `{"error":"missing or wrong admin token`},
		{name: "api with a wrong token", path: "/api/policies", token: "not-" + testToken, wantStatus: 401, wantBody: `{"error":"missing or wrong admin token`},
		{name: "api with the token", path: "/api/policies", token: testToken, wantStatus: 200, wantBody: "["},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var opts []Option
			if tc.ready != nil {
				opts = append(opts, WithReadiness(tc.ready))
			}
			f := newFixture(t, opts...)
			status, body := get(t, f.url+tc.path, tc.token)
			if status != tc.wantStatus || !strings.HasPrefix(body, tc.wantBody) {
				t.Errorf("GET %s: got %d %q, want %d %q...", tc.path, status, body, tc.wantStatus, tc.wantBody)
			}
			if tc.token == "" && strings.Contains(body, testToken) {
				t.Errorf("GET %s without the token shows the token: %q", tc.path, body)
			}
		})
	}
}

// get fetches url, with token as the bearer credential unless it is "",
// and returns the status and body.
func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	return resp.StatusCode, string(body)
}
