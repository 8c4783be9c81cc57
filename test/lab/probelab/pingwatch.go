package probelab

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
)

// PingWatch pings, continuously, every container from every container on
// another host, and keeps per pair the longest window in which no echo
// came back: what a change made while it runs (a rotation, a restart)
// costs the dataplane.
type PingWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	pairs map[string]*PingWindow
}

// PingWindow is one ordered pair's record.
type PingWindow struct {
	From, To string
	// Sent and Lost count single echoes (one per interval). NotSent counts
	// the pings whose echo left too late to be answered in time (the
	// pinger stalled, netnslab.ErrNotSent): neither sent nor lost.
	Sent, Lost, NotSent int
	// Longest is the longest time from the first echo lost to the next
	// echo answered (or to Stop).
	Longest time.Duration

	failingSince time.Time
}

// WatchPings starts pinging every pair of cs on different hosts, one echo
// per interval each, until Stop.
func WatchPings[E Endpoint](ctx context.Context, cs []E, interval time.Duration) *PingWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &PingWatch{cancel: cancel, pairs: map[string]*PingWindow{}}
	for _, src := range cs {
		for _, dst := range cs {
			if src.SameHost(dst) {
				continue
			}
			p := &PingWindow{From: src.Label(), To: dst.Label()}
			w.pairs[p.From+" -> "+p.To] = p
			w.wg.Add(1)
			go func() {
				defer w.wg.Done()
				t := time.NewTicker(interval)
				defer t.Stop()
				for {
					start := time.Now()
					pctx, pcancel := context.WithTimeout(ctx, interval)
					err := src.PingFrom().Ping(pctx, dst.PingAddr())
					pcancel()
					if ctx.Err() != nil {
						return
					}
					if errors.Is(err, netnslab.ErrNotSent) {
						w.notSent(p)
					} else {
						w.record(p, start, err == nil)
					}
					select {
					case <-ctx.Done():
						return
					case <-t.C:
					}
				}
			}()
		}
	}
	return w
}

// record notes an echo sent at start: answered (ok) or lost.
func (w *PingWatch) record(p *PingWindow, start time.Time, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p.Sent++
	if ok {
		p.failingSince = time.Time{}
		return
	}
	p.Lost++
	if p.failingSince.IsZero() {
		p.failingSince = start
	}
	p.Longest = max(p.Longest, time.Since(p.failingSince))
}

// notSent notes a ping whose echo was not sent in time.
func (w *PingWatch) notSent(p *PingWindow) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p.NotSent++
}

// Stop stops the pings and returns every pair's record, the longest
// window first.
func (w *PingWatch) Stop() []PingWindow {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	var out []PingWindow
	for _, p := range w.pairs {
		if !p.failingSince.IsZero() {
			p.Longest = max(p.Longest, now.Sub(p.failingSince))
		}
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Longest != out[j].Longest {
			return out[i].Longest > out[j].Longest
		}
		return out[i].From+out[i].To < out[j].From+out[j].To
	})
	return out
}

// FormatPingWindows is a table of the records, one pair a line.
func FormatPingWindows(ws []PingWindow) string {
	var b strings.Builder
	for _, p := range ws {
		fmt.Fprintf(&b, "%-28s -> %-28s sent %4d lost %3d not sent in time %3d longest window %s\n", p.From, p.To, p.Sent, p.Lost, p.NotSent, p.Longest.Round(time.Millisecond))
	}
	return b.String()
}
