package labcluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// RunTests is the body of a TestMain for tests that use ForTest: as root, it
// cleans up what killed runs with this namespace prefix left behind
// (RemoveStale), builds the carve and carve-lab binaries and the CNI
// plugins once for the whole test binary (unless $CARVE_BINARY,
// $CARVE_LAB_BINARY and $CARVE_CNI_PATH name them already), exports their
// paths in BinaryEnv, LabBinaryEnv and CNIPathEnv, runs the tests and
// removes the builds. Without root the tests run as they
// are and skip themselves.
func RunTests(m *testing.M, prefix string) int {
	if !netnslab.IsRoot() {
		return m.Run()
	}
	if killed, removed, err := RemoveStale(prefix); err != nil || len(killed)+len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "labcluster: leftovers of killed runs: killed pids %v, removed namespaces %v, err %v\n", killed, removed, err)
	}
	if os.Getenv(BinaryEnv) != "" && os.Getenv(LabBinaryEnv) != "" && os.Getenv(CNIPathEnv) != "" {
		return m.Run()
	}
	// A test binary killed by its -timeout skips its defers: the next run
	// removes the builds of runs that are gone.
	removeStaleBuilds()
	dir, err := os.MkdirTemp("", fmt.Sprintf("carve-test-bin-%d-", os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "labcluster:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, b := range []struct {
		env   string
		build func(context.Context, string) (string, error)
	}{{BinaryEnv, BuildCarve}, {LabBinaryEnv, BuildLab}} {
		if os.Getenv(b.env) != "" {
			continue
		}
		bin, err := b.build(ctx, dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := os.Setenv(b.env, bin); err != nil {
			fmt.Fprintln(os.Stderr, "labcluster:", err)
			return 1
		}
	}
	if os.Getenv(CNIPathEnv) == "" {
		plugins, err := BuildCNIPlugins(ctx, filepath.Join(dir, "cni"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := os.Setenv(CNIPathEnv, plugins); err != nil {
			fmt.Fprintln(os.Stderr, "labcluster:", err)
			return 1
		}
	}
	cancel()
	return m.Run()
}

// ForTest creates a cluster for a test (nothing runs yet: call Start or
// StartMasters). It skips the test without root, takes the binary from
// $CARVE_BINARY when opts.Binary is empty, carve-lab from
// $CARVE_LAB_BINARY when opts.LabBinary is, and the CNI plugins from
// $CARVE_CNI_PATH when opts.CNIPath is nil, puts the work directory in
// t.TempDir, logs progress through t.Log, and registers a cleanup that, when
// the test failed, logs every host's kernel state and the tail of every
// process log, then closes the cluster.
func ForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	testutil.Require(t, netnslab.IsRoot(), "labcluster: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) to create network namespaces; run the tests as root")
	if opts.Binary == "" {
		opts.Binary = os.Getenv(BinaryEnv)
		if opts.Binary == "" {
			t.Fatalf("labcluster: no carve binary: call labcluster.RunTests from TestMain or set $%s", BinaryEnv)
		}
	}
	if opts.CNIPath == nil {
		opts.CNIPath = filepath.SplitList(os.Getenv(CNIPathEnv))
	}
	if opts.LabBinary == "" {
		opts.LabBinary = os.Getenv(LabBinaryEnv)
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			var b strings.Builder
			for _, h := range c.Hosts() {
				ks, err := c.Kernel(h)
				if err != nil {
					fmt.Fprintf(&b, "--- kernel of %s: %v\n", h.Name, err)
					continue
				}
				fmt.Fprintf(&b, "--- kernel of %s (%s):\n%s", h.Name, h.IP(), ks)
			}
			c.DumpLogs(&b, 60)
			t.Logf("test failed; cluster state and process logs:\n%s", b.String())
		}
		if err := c.Close(); err != nil {
			var b strings.Builder
			c.DumpLogs(&b, 60) // why a process did not stop
			t.Errorf("close cluster: %v\nprocess logs:\n%s", err, b.String())
		}
	})
	return c
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// removeStaleBuilds removes carve-test-bin-<pid>-* directories of test
// binaries that no longer run.
func removeStaleBuilds() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "carve-test-bin-*-*"))
	for _, d := range dirs {
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), "carve-test-bin-"), "-")
		if pid, err := strconv.Atoi(pidStr); err == nil && pid > 0 && !netnslab.PIDAlive(pid) {
			_ = os.RemoveAll(d)
		}
	}
}
