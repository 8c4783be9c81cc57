package proclab

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// newInLab is a Process in a namespace of a lab the test removes.
func newInLab(t *testing.T, name string) *Process {
	t.Helper()
	testutil.Require(t, netnslab.IsRoot(), "proclab: needs root (network namespaces)")
	lab, err := netnslab.New(netnslab.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	ns, err := lab.AddNamespace(name)
	if err != nil {
		t.Fatal(err)
	}
	p := New(name, filepath.Join(t.TempDir(), name+".log"), ns)
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

// TestProcessLifecycle starts a process, refuses a second start while it
// runs, stops it with SIGTERM (no error), starts it again on the same log,
// and kills one that ignores SIGTERM (an error saying so).
func TestProcessLifecycle(t *testing.T) {
	tests := []struct {
		name    string
		script  string
		wantErr bool
	}{
		{"stops on SIGTERM", "echo up-$$; exec sleep 1000", false},
		// An ignored signal stays ignored across exec: the PID that ignores
		// SIGTERM is the one SIGKILL ends, and nothing is left behind.
		{"killed when SIGTERM is ignored", "trap '' TERM; echo up-$$; exec sleep 1000", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newInLab(t, "p")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for run := 1; run <= 2; run++ {
				if err := p.Start("/bin/sh", []string{"-c", tc.script}); err != nil {
					t.Fatalf("run %d: %v", run, err)
				}
				if !p.Running() || p.PID() == 0 {
					t.Fatalf("run %d: running %v, pid %d", run, p.Running(), p.PID())
				}
				if err := p.Start("/bin/sh", []string{"-c", tc.script}); err == nil {
					t.Fatalf("run %d: a second start while it runs: want an error", run)
				}
				// The script prints its PID once its trap is set.
				up := "up-" + strconv.Itoa(p.PID())
				testutil.Eventually(t, 30*time.Second, "the script is up", func() error {
					if !strings.Contains(p.Tail(100), up) {
						return errors.New("no " + up + " in the log yet")
					}
					return nil
				})
				err := p.Stop(ctx, 200*time.Millisecond)
				if (err != nil) != tc.wantErr {
					t.Fatalf("run %d: Stop = %v, want error %v", run, err, tc.wantErr)
				}
				if p.Running() {
					t.Fatalf("run %d: still running after Stop", run)
				}
				select {
				case <-p.Done():
				default:
					t.Fatalf("run %d: Done not closed after Stop", run)
				}
			}
			log, err := os.ReadFile(p.LogPath)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(log), "=== "); n != 4 {
				t.Fatalf("log has %d start and exit lines, want 4:\n%s", n, log)
			}
		})
	}
}
