package labcluster

import (
	"context"
	"errors"
	"io"
)

// failureLogLines is how many lines of each process log With writes when
// its function fails.
const failureLogLines = 20

// With creates a cluster (New), runs fn on it and closes it, for programs
// that run a cluster once (the benchmarks): when fn fails while ctx is
// still live (not an interrupt), it first writes the tail of every process
// log to w, so that the failure can be read. The error is fn's, joined
// with New's or Close's.
func With(ctx context.Context, opts Options, w io.Writer, fn func(*Cluster) error) (err error) {
	c, err := New(opts)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && ctx.Err() == nil {
			c.DumpLogs(w, failureLogLines)
		}
		err = errors.Join(err, c.Close())
	}()
	return fn(c)
}
