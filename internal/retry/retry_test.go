package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestUntilBackoff: it returns as soon as fn succeeds, at once on a
// Permanent error (unwrapped), and at ctx's end with both ctx's error and
// fn's last one.
// TestUntil: Until and UntilBackoff, which share their loop, stop at the
// first success, at a Permanent error (unwrapped) and at ctx's end (with
// fn's last error).
func TestUntil(t *testing.T) {
	errNotYet, errGone := errors.New("not yet"), errors.New("gone")
	b := Backoff{First: time.Millisecond, Max: 4 * time.Millisecond}
	tests := []struct {
		name      string
		fn        func(call int) error
		timeout   time.Duration
		wantCalls int     // exact; 0: at least 2
		want      []error // errors.Is each
	}{
		{"succeeds on the third call", func(call int) error {
			if call < 3 {
				return errNotYet
			}
			return nil
		}, time.Minute, 3, nil},
		{"permanent", func(int) error { return Permanent(errGone) }, time.Minute, 1, []error{errGone}},
		{"never", func(int) error { return errNotYet }, 50 * time.Millisecond, 0, []error{context.DeadlineExceeded, errNotYet}},
	}
	untils := []struct {
		name  string
		until func(context.Context, func() error) error
	}{
		{"Until", func(ctx context.Context, fn func() error) error { return Until(ctx, time.Millisecond, fn) }},
		{"UntilBackoff", func(ctx context.Context, fn func() error) error { return UntilBackoff(ctx, b, fn) }},
	}
	for _, u := range untils {
		for _, tc := range tests {
			t.Run(u.name+"/"+tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
				defer cancel()
				calls := 0
				err := u.until(ctx, func() error { calls++; return tc.fn(calls) })
				if tc.want == nil && err != nil {
					t.Fatalf("%s = %v, want nil", u.name, err)
				}
				for _, w := range tc.want {
					if !errors.Is(err, w) {
						t.Errorf("%s = %v, want it to wrap %v", u.name, err, w)
					}
				}
				if _, perm := err.(permanentError); perm {
					t.Errorf("%s returned the Permanent wrapper: %v", u.name, err)
				}
				if tc.wantCalls != 0 && calls != tc.wantCalls || tc.wantCalls == 0 && calls < 2 {
					t.Errorf("fn called %d times, want %d (0: at least 2)", calls, tc.wantCalls)
				}
			})
		}
	}
}
