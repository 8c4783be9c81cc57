package testutil

import (
	"fmt"
	"strings"
	"testing"
)

// stopRecorder is a testing.TB that records Skip and Fatalf instead of
// ending the goroutine, so that Require's choice can be looked at.
type stopRecorder struct {
	testing.TB
	skipped, failed string
}

func (r *stopRecorder) Skip(args ...any) { r.skipped = fmt.Sprint(args...) }

func (r *stopRecorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestRequire(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ci         string
		ok         bool
		skip, fail bool
	}{
		{name: "present, outside CI", ci: "", ok: true},
		{name: "present, under CI", ci: "true", ok: true},
		{name: "missing, outside CI", ci: "", ok: false, skip: true},
		{name: "missing, CI=false", ci: "false", ok: false, skip: true},
		{name: "missing, under CI", ci: "true", ok: false, fail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(CIEnv, tc.ci)
			r := &stopRecorder{TB: t}
			Require(r, tc.ok, "no %s here", "frobnicator")
			if got := r.skipped != ""; got != tc.skip {
				t.Errorf("skipped = %v (%q), want %v", got, r.skipped, tc.skip)
			}
			if got := r.failed != ""; got != tc.fail {
				t.Errorf("failed = %v (%q), want %v", got, r.failed, tc.fail)
			}
			for _, said := range []string{r.skipped, r.failed} {
				if said != "" && !strings.Contains(said, "no frobnicator here") {
					t.Errorf("message %q lacks the caller's words", said)
				}
			}
			if r.failed != "" && !strings.Contains(r.failed, "install-deps.sh") {
				t.Errorf("failure %q does not say how to install", r.failed)
			}
		})
	}
}
