// Package ratelog bounds how often a recurring event is logged: at most
// once per interval, saying how many were left out since (the event is
// still counted by its caller every time).
package ratelog

import (
	"sync"
	"time"
)

// Limiter lets an event be logged at most once per interval.
type Limiter struct {
	interval time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// New returns a limiter of one log line per interval.
func New(interval time.Duration) *Limiter { return &Limiter{interval: interval} }

// Allow tells whether the event may be logged now and, when it may, how
// many were not logged since the last that was.
func (l *Limiter) Allow() (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < l.interval {
		l.suppressed++
		return false, 0
	}
	l.last = now
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
