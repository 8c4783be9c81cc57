// Package retry holds the tree's one retry policy (jittered exponential
// backoff) and its one bounded wait for a condition.
package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Backoff is jittered exponential backoff: each Next doubles the delay up to
// Max and draws the wait from [d/2, d], so that clients restarted together do
// not retry together. The zero value is not usable: set First and Max.
type Backoff struct {
	First, Max time.Duration
	cur        time.Duration
}

// Next returns how long to wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	if b.cur <= 0 {
		b.cur = b.First
	}
	d := b.cur
	b.cur = min(b.cur*2, b.Max)
	return d/2 + rand.N(d/2+1)
}

// Reset starts again from First (after a success).
func (b *Backoff) Reset() { b.cur = 0 }

// Sleep waits d or until ctx ends; false when ctx ended.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// permanentError stops Until: waiting longer cannot help.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that Until must not retry (a process exited,
// say), so that a wait fails at once instead of at its deadline.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// Until calls fn every interval until it returns nil, returns a Permanent
// error, or ctx ends; then it returns fn's last error with ctx's. Give ctx a
// deadline: Until is bounded by it alone.
func Until(ctx context.Context, interval time.Duration, fn func() error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	return until(ctx, fn, func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	})
}

// UntilBackoff is Until with b's waits between the calls: quick while the
// condition is about to hold, cheap when the wait is long (a poll that
// reads a cluster's state costs both sides).
func UntilBackoff(ctx context.Context, b Backoff, fn func() error) error {
	return until(ctx, fn, func() bool { return Sleep(ctx, b.Next()) })
}

// until is the loop of Until and UntilBackoff: wait blocks until the next
// call is due and reports false once ctx has ended.
func until(ctx context.Context, fn func() error, wait func() bool) error {
	for {
		err := fn()
		if err == nil {
			return nil
		}
		var perm permanentError
		if errors.As(err, &perm) {
			return perm.err
		}
		if !wait() {
			return fmt.Errorf("%w; last: %w", ctx.Err(), err)
		}
	}
}
