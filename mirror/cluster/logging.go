package cluster

import (
	"context"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// logWriter turns the log lines of serf, memberlist and raft's transport
// (which write "[LEVEL] text" through the standard log package or hclog)
// into slog records: errors and warnings keep their level, the rest is
// debug, so a healthy cluster is quiet at info.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelDebug
	switch {
	case strings.Contains(line, "use of closed network connection"):
		// raft's transport and memberlist report their own sockets closed
		// at shutdown as errors.
	case strings.HasPrefix(line, "[ERR"):
		level = slog.LevelError
	case strings.HasPrefix(line, "[WARN"):
		level = slog.LevelWarn
	}
	w.log.Log(context.Background(), level, line)
	return len(p), nil
}

func stdLogger(l *slog.Logger) *log.Logger { return log.New(logWriter{l}, "", 0) }

func hcLogger(l *slog.Logger, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        name,
		Level:       hclog.Info,
		Output:      logWriter{l},
		DisableTime: true,
	})
}
