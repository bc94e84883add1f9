package cluster

import (
	"log"
	"log/slog"

	"github.com/amqp-mirror/amqp-mirror/mirror/store"
)

// stdLogger is a standard logger for serf and memberlist, which log through
// the log package, writing into slog like the rest of the proxy.
func stdLogger(l *slog.Logger) *log.Logger { return log.New(store.LogWriter{Log: l}, "", 0) }
