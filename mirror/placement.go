package mirror

import (
	"errors"
	"fmt"
	"slices"

	"github.com/amqp-mirror/amqp-mirror/config"
)

// Errors of master placement.
var (
	// ErrNoLiveBackend: no configured backend is live, so a new queue has
	// nowhere to go.
	ErrNoLiveBackend = errors.New("no live backend to place the queue master on")
	// ErrUnknownLocator: the x-queue-master-locator argument is not one of
	// min-masters, client-local, random. RabbitMQ refuses such a declare
	// with 406 PRECONDITION_FAILED; so should the proxy.
	ErrUnknownLocator = errors.New("unknown x-queue-master-locator")
)

// ResolveLocator returns the locator that places a new queue's master:
// the queue's x-queue-master-locator argument (argument, "" when absent)
// wins over the effective policy's queue-master-locator, which wins over the
// configured queue_master_locator; with none of them set, min-masters
// (RabbitMQ's default).
func ResolveLocator(argument string, policy config.Definition, configured config.Locator) (config.Locator, error) {
	if argument != "" {
		l, ok := config.ParseLocator(argument)
		if !ok {
			return config.LocatorUnset, fmt.Errorf("%w %q: expected min-masters, client-local or random", ErrUnknownLocator, argument)
		}
		return l, nil
	}
	if policy.QueueMasterLocator != config.LocatorUnset {
		return policy.QueueMasterLocator, nil
	}
	if configured != config.LocatorUnset {
		return configured, nil
	}
	return config.LocatorMinMasters, nil
}

// Placement is what master placement looks at. Backends are the configured
// backends in configuration order, which breaks ties and orders rings.
type Placement struct {
	Backends []string
	Live     LiveSet
	// Masters counts the queues each backend masters now (CountMasters).
	Masters map[string]int
	// ClientNode is the backend beside the proxy the client reached (the
	// config's `node`), "" when the proxy has none (drop-in mode).
	ClientNode string
	// Random returns a uniformly chosen integer in [0, n); injected so that
	// the random locator is deterministic in tests. Nil means "always 0".
	Random func(n int) int
}

// Master chooses the backend for a new queue's master with locator l:
//
//   - min-masters: the live backend with the fewest masters, ties going to
//     the one configured first;
//   - client-local: ClientNode when it is a live configured backend,
//     otherwise (drop-in mode, or the local broker down) min-masters;
//   - random: a live backend chosen by Random, uniformly.
//
// LocatorUnset is treated as min-masters. Backends that are not live are
// never chosen; with none live, ErrNoLiveBackend.
func (p Placement) Master(l config.Locator) (string, error) {
	live := 0
	for _, b := range p.Backends {
		if p.Live.Has(b) {
			live++
		}
	}
	if live == 0 {
		return "", ErrNoLiveBackend
	}
	switch l {
	case config.LocatorClientLocal:
		if p.ClientNode != "" && p.Live.Has(p.ClientNode) && slices.Contains(p.Backends, p.ClientNode) {
			return p.ClientNode, nil
		}
	case config.LocatorRandom:
		pick := 0
		if p.Random != nil {
			pick = p.Random(live)
		}
		if pick < 0 || pick >= live {
			return "", fmt.Errorf("random source returned %d, outside [0, %d)", pick, live)
		}
		for _, b := range p.Backends {
			if !p.Live.Has(b) {
				continue
			}
			if pick == 0 {
				return b, nil
			}
			pick--
		}
	}
	best, fewest := "", 0
	for _, b := range p.Backends {
		if !p.Live.Has(b) {
			continue
		}
		if n := p.Masters[b]; best == "" || n < fewest {
			best, fewest = b, n
		}
	}
	return best, nil
}

// CountMasters returns how many of the queues each backend masters, for
// Placement.Masters.
func CountMasters(queues []QueueMeta) map[string]int {
	counts := make(map[string]int)
	for i := range queues {
		counts[queues[i].Master]++
	}
	return counts
}

// ringAfter returns the configured backends in ring order after start: those
// configured after it, then those before it, without start itself. When
// start is not configured, the backends in configuration order. Slaves
// that join together join in this order, so that mirrors spread the same
// way on every proxy.
func ringAfter(backends []string, start string) []string {
	i := slices.Index(backends, start)
	if i < 0 {
		return backends
	}
	out := make([]string, 0, len(backends)-1)
	out = append(out, backends[i+1:]...)
	return append(out, backends[:i]...)
}
