package main

// The watchers of the fan-out rows, as a set: when each got which index,
// whether each is parked, and how long until all hold an index.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// arrival is when a watcher got an answer running to index.
type arrival struct {
	index uint64
	at    time.Time
}

// watcherSet is W watchers of the changes, each its own connection.
type watcherSet struct {
	mu       []sync.Mutex
	arrivals [][]arrival
	last     []atomic.Uint64
	// parked: the watcher's request is written and not answered yet
	parked  []atomic.Bool
	bytes   atomic.Int64
	answers atomic.Int64
	// failures by kind, for the diagnosis of a run that never converges
	failMu   sync.Mutex
	failures map[string]int
}

// watchSink takes what watchers see: the watcherSet of this process, or
// the lines a watcher process writes to the bench (fanoutprocs.go).
type watchSink interface {
	record(w int, index uint64, at time.Time, n int)
	park(w int, parked bool)
	fail(kind string)
}

func (ws *watcherSet) park(w int, parked bool) { ws.parked[w].Store(parked) }

func (ws *watcherSet) fail(kind string) {
	ws.failMu.Lock()
	if ws.failures == nil {
		ws.failures = map[string]int{}
	}
	ws.failures[kind]++
	ws.failMu.Unlock()
}

func (ws *watcherSet) record(w int, index uint64, at time.Time, n int) {
	ws.mu[w].Lock()
	ws.arrivals[w] = append(ws.arrivals[w], arrival{index, at})
	ws.mu[w].Unlock()
	ws.last[w].Store(index)
	ws.bytes.Add(int64(n))
	ws.answers.Add(1)
}

// waitParked waits (at most limit) until every watcher's request is
// written and unanswered, and then for a second more (the masters read it).
func (ws *watcherSet) waitParked(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		n := 0
		for w := range ws.parked {
			if !ws.parked[w].Load() {
				n++
			}
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d of %d watchers not parked within %s", n, len(ws.parked), limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	return nil
}

// reset forgets the arrivals (before a measurement).
func (ws *watcherSet) reset() {
	for w := range ws.arrivals {
		ws.mu[w].Lock()
		ws.arrivals[w] = ws.arrivals[w][:0]
		ws.mu[w].Unlock()
	}
	ws.bytes.Store(0)
	ws.answers.Store(0)
}

// reached returns, per watcher, the time it first held index (zero: not yet).
func (ws *watcherSet) reached(index uint64) []time.Time {
	out := make([]time.Time, len(ws.arrivals))
	for w := range ws.arrivals {
		ws.mu[w].Lock()
		for _, a := range ws.arrivals[w] {
			if a.index >= index {
				out[w] = a.at
				break
			}
		}
		ws.mu[w].Unlock()
	}
	return out
}

// waitAll waits (at most limit) until every watcher holds index, and
// returns the p99 and the largest of their delays after from.
func (ws *watcherSet) waitAll(ctx context.Context, index uint64, from time.Time, limit time.Duration) (p99, slowest time.Duration, err error) {
	deadline := time.Now().Add(limit)
	for {
		ok := true
		for w := range ws.last {
			if ws.last[w].Load() < index {
				ok = false
				break
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			n, byMaster := 0, [3]int{}
			for w := range ws.last {
				if ws.last[w].Load() < index {
					n++
					byMaster[w%3]++
				}
			}
			ws.failMu.Lock()
			failures := fmt.Sprint(ws.failures)
			ws.failMu.Unlock()
			return 0, 0, fmt.Errorf("%d of %d watchers (by first master %v) never held index %d within %s; failures: %.2000s", n, len(ws.last), byMaster, index, limit, failures)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var ds []time.Duration
	byMaster := make([][]time.Duration, 3)
	for w, at := range ws.reached(index) {
		d := max(0, at.Sub(from))
		ds = append(ds, d)
		byMaster[w%3] = append(byMaster[w%3], d)
	}
	ws.failMu.Lock()
	failed := 0
	for _, n := range ws.failures {
		failed += n
	}
	ws.failMu.Unlock()
	progress("  index %d: p50 %s p99 %s; p99 by first master: %s %s %s; %d answers, %d failed requests so far", index, pct(ds, 50), pct(ds, 99), pct(byMaster[0], 99), pct(byMaster[1], 99), pct(byMaster[2], 99), ws.answers.Load(), failed)
	return pct(ds, 99), slices.Max(ds), nil
}

// newWatcherSet is the set of w watchers, each at index since.
func newWatcherSet(w int, since uint64) *watcherSet {
	ws := &watcherSet{mu: make([]sync.Mutex, w), arrivals: make([][]arrival, w), last: make([]atomic.Uint64, w), parked: make([]atomic.Bool, w)}
	for i := range w {
		ws.last[i].Store(since)
	}
	return ws
}
