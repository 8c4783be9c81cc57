// Package testutil holds the test helpers every package shares. Only tests
// and the lab import it: it links package testing.
package testutil

import (
	"context"
	"testing"
	"time"

	"github.com/carve-net/carve/internal/retry"
)

// WaitLimit is the default bound of Eventually: long enough for a loaded CI
// machine, short enough that a broken test fails well before -timeout.
const WaitLimit = 30 * time.Second

// Eventually polls cond until it returns nil, and fails the test when it
// has not after timeout (WaitLimit when zero), with cond's last error. It
// polls again after 10-20 ms, backing off to 100-200 ms: a long wait must
// not load the cluster it polls. It is the one way tests wait for a condition: bounded by its own
// deadline, never by the test's context, which ends only after the test.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if timeout <= 0 {
		timeout = WaitLimit
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := retry.UntilBackoff(ctx, retry.Backoff{First: 20 * time.Millisecond, Max: 200 * time.Millisecond}, cond); err != nil {
		t.Fatalf("waiting for %s (up to %s): %v", what, timeout, err)
	}
}

// True adapts a boolean condition for Eventually: false becomes an error
// that says what was not yet true.
func True(cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return notYet{}
	}
}

type notYet struct{}

func (notYet) Error() string { return "condition not met yet" }
