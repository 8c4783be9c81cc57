package testutil

import (
	"fmt"
	"os"
	"testing"
)

// CIEnv is the environment variable that says a test runs under CI: "true"
// there (as .ci/run's caller sets it, and most CI systems do).
const CIEnv = "CI"

// Require stops a test whose prerequisite on this machine is missing (root,
// a Docker engine, a tool such as ip or systemd-analyze) when ok is false;
// format and args say what is missing and how to get it. Outside CI the test
// is skipped with that message. Under CI ($CI is "true") it fails instead:
// CI's machine is meant to have every prerequisite (make deps installs
// them), and a silent skip there would pass a run that tested nothing.
// Not for testing.Short: a short run is a choice, not a missing prerequisite.
func Require(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(CIEnv) == "true" {
		t.Fatalf("missing prerequisite under CI ($%s=true): %s (deploy/install-deps.sh, run by make deps as root, installs the packages; run the tests as root)", CIEnv, msg)
		return
	}
	t.Skip("missing prerequisite: " + msg)
}
