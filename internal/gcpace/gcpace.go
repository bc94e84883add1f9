// Package gcpace paces the garbage collector of a process whose live heap
// is small next to what it allocates, as a proxy's is.
//
// Go's default (GOGC=100) starts a collection when the heap has grown by
// as much as survived the last one. A proxy that holds 15 MiB of state and
// allocates for every message it routes then collects many times a
// second. Pace lets the heap grow by at least a fixed headroom
// instead: GOGC = max(100, 100 × headroom ÷ live heap), read again every
// interval. A small heap gets the headroom; a heap larger than the
// headroom (a long backlog held by the trimmers) gets Go's default, so
// memory never grows beyond twice the live heap for it.
package gcpace

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// DefaultHeadroom is how far the heap may grow past its live bytes before
// a collection, at the least.
const DefaultHeadroom = 64 << 20

// maxPercent bounds GOGC while the live heap is tiny (before the first
// collection it reads zero).
const maxPercent = 2000

// The runtime metrics Pace reads: the heap that survived the last
// collection, and GOGC.
const (
	liveHeap = "/gc/heap/live:bytes"
	gogc     = "/gc/gogc:percent"
)

// Percent is the GOGC that lets a heap of live bytes grow by headroom
// before the next collection, never below Go's default of 100 nor above
// 2000.
func Percent(live, headroom uint64) int {
	if live == 0 {
		return maxPercent
	}
	p := headroom * 100 / live
	switch {
	case p < 100:
		return 100
	case p > maxPercent:
		return maxPercent
	}
	return int(p)
}

// Pace sets GOGC from the live heap every interval until ctx ends, then
// sets back the GOGC it found. It changes GOGC only when the new value
// differs from the one in force by more than a tenth. It is for a process
// whose operator set neither GOGC nor GOMEMLIMIT (see Wanted).
func Pace(ctx context.Context, headroom uint64, interval time.Duration) {
	original := Current()
	defer debug.SetGCPercent(original)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	sample := []metrics.Sample{{Name: liveHeap}, {Name: gogc}}
	for {
		metrics.Read(sample)
		live, current := uint64Of(sample[0]), int(uint64Of(sample[1]))
		if want := Percent(live, headroom); differs(want, current) {
			debug.SetGCPercent(want)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Current is the GOGC in force, read without changing it.
func Current() int {
	sample := []metrics.Sample{{Name: gogc}}
	metrics.Read(sample)
	return int(uint64Of(sample[0]))
}

func uint64Of(s metrics.Sample) uint64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s.Value.Uint64()
}

// Wanted reports whether Pace should run: not when the operator has set
// GOGC or GOMEMLIMIT, which then decide alone. getenv is os.Getenv.
func Wanted(getenv func(string) string) bool {
	return getenv("GOGC") == "" && getenv("GOMEMLIMIT") == ""
}

func differs(want, current int) bool {
	d := want - current
	if d < 0 {
		d = -d
	}
	return d*10 > current
}
