package engine

import "github.com/amqp-mirror/amqp-mirror/mirror/controllink"

// BackendDown reports whether the watcher counts backend down: the proxy
// drops its client links to it, as the engine promotes away from it.
// Unknown (no verdict yet) is not down.
func (e *Engine) BackendDown(backend string) bool {
	return e.opts.Watcher.State(backend) == controllink.Down
}
