package cni

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// labPrefix starts the names of the tests' network namespaces.
const labPrefix = "carvecnitest"

// TestMain builds carve, carve-ipam and the reference plugins once for the
// whole package (labcluster.RunTests): the tests run real agents, and run
// carve-ipam as a runtime does, as a binary found in CNI_PATH.
func TestMain(m *testing.M) { os.Exit(labcluster.RunTests(m, labPrefix)) }

// pluginPath is the CNI_PATH holding carve-ipam and the reference plugins
// RunTests built (it builds them as root; without, the test is skipped).
func pluginPath(t testing.TB) []string {
	t.Helper()
	path := filepath.SplitList(os.Getenv(labcluster.CNIPathEnv))
	testutil.Require(t, len(path) > 0, "no CNI plugins: labcluster.RunTests builds them as root, or set $%s", labcluster.CNIPathEnv)
	return path
}

// bounded is a context for the blocking calls of one test, ended by its
// cleanup or after two minutes, whichever comes first.
func bounded(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
