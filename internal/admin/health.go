package admin

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
)

// WithReadiness makes /readyz answer 503 with ready's error while it
// returns one: the proxy cannot serve clients (paused, no metadata
// leader, its backend down). Without it /readyz answers as /healthz does.
//
// The error's text is served without a token to whoever reaches the
// port, so it must say what is wrong in words an operator acts on and
// nothing more: no URL, address or credential.
func WithReadiness(ready func() error) Option { return func(s *Server) { s.ready = ready } }

// healthz answers 200 while the process serves HTTP at all: the liveness
// probe that restarts a wedged process, nothing about its backends.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok")
}

// readyz answers 200 when the proxy can serve clients and 503 with the
// reason otherwise: the readiness probe a load balancer or Kubernetes
// uses to send clients elsewhere for a while.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if s.ready != nil {
		if err := s.ready(); err != nil {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
	}
	writeText(w, http.StatusOK, "ok")
}

// writeText answers with one line of plain text, which probes log as is;
// no-store, so that no cache in between answers for the proxy.
func writeText(w http.ResponseWriter, status int, line string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(line + "\n"))
}

// httpErrorLog takes net/http's own complaints, which would otherwise go
// to the standard logger's stderr outside the configured log format.
// Failed TLS handshakes (a port scan, a plain-HTTP request, a ctl that
// does not trust the certificate) are debug lines: anyone who reaches
// the port can cause them, and the other side is told why. The rest,
// such as a handler's panic, are warnings.
type httpErrorLog struct{ logger *slog.Logger }

func (l httpErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelWarn
	if strings.Contains(msg, "TLS handshake error") {
		level = slog.LevelDebug
	}
	l.logger.Log(context.Background(), level, "admin API: HTTP server error", "error", msg)
	return len(p), nil
}
