package labcluster

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestWith: With hands its function a created cluster, returns the
// function's error after writing the tail of every process log, and
// closes the cluster (its processes and namespaces gone) either way; when
// New fails, the function does not run.
func TestWith(t *testing.T) {
	errBench := errors.New("bench failed")
	if err := With(context.Background(), Options{}, os.Stderr, func(*Cluster) error {
		t.Error("fn ran although New failed")
		return nil
	}); err == nil || !strings.Contains(err.Error(), "Binary") {
		t.Errorf("With without a binary: %v, want New's error naming Options.Binary", err)
	}

	testutil.Require(t, netnslab.IsRoot(), "labcluster: needs root to create network namespaces")
	for _, tt := range []struct {
		name     string
		fnErr    error
		wantLogs bool
	}{
		{"the function fails: logs, then close", errBench, true},
		{"the function succeeds: close, no logs", nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs strings.Builder
			var seen *Cluster
			opts := Options{Binary: os.Getenv(BinaryEnv), Hosts: 1, Masters: 1, Prefix: testPrefix, Dir: t.TempDir()}
			err := With(deadline(t, time.Minute), opts, &logs, func(c *Cluster) error {
				seen = c
				if err := c.StartMasters(deadline(t, time.Minute)); err != nil {
					t.Fatal(err)
				}
				return tt.fnErr
			})
			if !errors.Is(err, tt.fnErr) || (tt.fnErr == nil && err != nil) {
				t.Fatalf("With returned %v, want %v", err, tt.fnErr)
			}
			if got := strings.Contains(logs.String(), "--- m1 "); got != tt.wantLogs {
				t.Errorf("logs written %v, want %v:\n%s", got, tt.wantLogs, logs.String())
			}
			for _, h := range seen.Hosts() {
				if _, err := os.Stat(h.NS.Path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("namespace %s of %s is still there after With (stat: %v)", h.NS.Path, h.Name, err)
				}
			}
			for _, m := range seen.Masters() {
				if m.Running() {
					t.Errorf("master %s still runs after With", m.Name)
				}
			}
		})
	}
}
