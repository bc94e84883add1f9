package store

import (
	"context"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// LogWriter turns the log lines of the hashicorp libraries (raft, serf,
// memberlist, which write "[LEVEL] text" through hclog or the standard log
// package) into slog records: errors and warnings keep their level, the rest
// is debug, so a healthy proxy is quiet at info.
type LogWriter struct{ Log *slog.Logger }

func (w LogWriter) Write(p []byte) (int, error) {
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
	w.Log.Log(context.Background(), level, line)
	return len(p), nil
}

// HCLogger is an hclog.Logger that writes through LogWriter.
func HCLogger(l *slog.Logger, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        name,
		Level:       hclog.Info,
		Output:      LogWriter{l},
		DisableTime: true,
	})
}
