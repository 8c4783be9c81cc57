package labcluster

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// permanentError stops Eventually: waiting longer cannot help.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that Eventually must not retry (a process
// exited, say), so that a wait fails at once instead of at its deadline.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// Eventually calls fn every interval until it returns nil, returns a
// Permanent error, or ctx ends; then it returns fn's last error with ctx's.
// Convergence in the lab is waited for with a deadline, never timed.
func Eventually(ctx context.Context, interval time.Duration, fn func() error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		err := fn()
		if err == nil {
			return nil
		}
		var perm permanentError
		if errors.As(err, &perm) {
			return perm.err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %w", ctx.Err(), err)
		case <-t.C:
		}
	}
}
