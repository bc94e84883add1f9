package admin

import (
	"context"
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// The health commands ask the endpoints that need no token, so that a
// container's health check or a script can run them with nothing but the
// admin address: the image has no shell and no curl.
var (
	checkReadyCommand = command{
		usage: "check_ready",
		brief: "exits 0 when the proxy can serve clients, 69 with the reason when it cannot (/readyz)",
		summary: "Asks /readyz whether the proxy can serve clients: not paused for want of a majority,\n" +
			"its metadata caught up, its home backend up. Prints \"ready\" and exits 0, or prints the\n" +
			"reason and exits 69. Needs no token: for container health checks and load balancers.",
		tokenless: true,
		run: func(ctx context.Context, c *Client, o *ctlOptions, _ []string) error {
			if err := c.Probe(ctx, "/readyz"); err != nil {
				return err
			}
			o.say("ready")
			return nil
		},
	}
	checkAliveCommand = command{
		usage: "check_alive",
		brief: "exits 0 while the proxy's process serves (/healthz)",
		summary: "Asks /healthz whether the proxy's process serves at all, whatever its backends: the\n" +
			"liveness probe that restarts a wedged process. Prints \"alive\" and exits 0. Needs no token.",
		tokenless: true,
		run: func(ctx context.Context, c *Client, o *ctlOptions, _ []string) error {
			if err := c.Probe(ctx, "/healthz"); err != nil {
				return err
			}
			o.say("alive")
			return nil
		},
	}
)

// NotReadyError is /readyz's 503: the proxy serves HTTP but cannot serve
// clients, for Reason.
type NotReadyError struct{ Reason string }

func (e *NotReadyError) Error() string { return e.Reason }

// Probe asks a health endpoint (/healthz or /readyz), which needs no
// token and is sent none: nil on 200, a *NotReadyError on 503.
func (c *Client) Probe(ctx context.Context, path string) error {
	resp, data, err := c.roundTrip(ctx, http.MethodGet, path, nil, nil, 4<<10)
	if err != nil {
		return err
	}
	if media, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); media != "text/plain" {
		return &NotAdminAPIError{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Server: resp.Header.Get("Server")}
	}
	line := strings.TrimSpace(string(data))
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusServiceUnavailable:
		return &NotReadyError{Reason: line}
	}
	return fmt.Errorf("admin API %s: %s: %s", path, resp.Status, line)
}
