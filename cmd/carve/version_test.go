package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestVersionStampedByBuild: a carve built with make build's -ldflags (read
// from the Makefile with make -n, the values given as make build gets them
// from deploy/version.sh) prints that version, commit and date in carve
// version and carve version --json; carve_build_info carries the same
// buildinfo.Get (internal/buildinfo's TestCollector).
func TestVersionStampedByBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds carve")
	}
	const (
		version = "v0.4.0-3-gabcdef1"
		commit  = "abcdef1234567890abcdef1234567890abcdef12"
		date    = "2026-11-29T05:29:52+00:00"
	)
	ldflags := makeLDFlags(t, "VERSION="+version, "COMMIT="+commit, "BUILD_DATE="+date)
	carve := filepath.Join(t.TempDir(), "carve")
	if out, err := exec.Command(goTool, "build", "-ldflags", ldflags, "-o", carve, "github.com/carve-net/carve/cmd/carve").CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags %q: %v\n%s", ldflags, err, out)
	}
	out, err := exec.Command(carve, "version").Output()
	if err != nil {
		t.Fatalf("carve version: %v", err)
	}
	want := regexp.MustCompile(`^carve ` + regexp.QuoteMeta(version) + ` \(commit ` + commit + `, go1\.[0-9.]+, built ` + regexp.QuoteMeta(date) + `\)\n$`)
	if !want.Match(out) {
		t.Errorf("carve version printed %q, want %s", out, want)
	}
	out, err = exec.Command(carve, "version", "--json").Output()
	if err != nil {
		t.Fatalf("carve version --json: %v", err)
	}
	var info struct {
		Version   string `json:"version"`
		Commit    string `json:"commit"`
		BuildDate string `json:"build_date"`
	}
	if err := json.Unmarshal(out, &info); err != nil || info.Version != version || info.Commit != commit || info.BuildDate != date {
		t.Errorf("carve version --json printed %s (%v), want version %s, commit %s, build_date %s", out, err, version, commit, date)
	}
}

// makeLDFlags is the -ldflags make build passes to go build for bin/carve
// with the given make variables.
func makeLDFlags(t *testing.T, vars ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	cmd := exec.Command("make", append([]string{"-s", "-n", "build"}, vars...)...)
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)build -ldflags "([^"]*)" -o bin/carve \./cmd/carve$`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("make -n build has no go build of bin/carve with -ldflags:\n%s", out)
	}
	flags := string(m[1])
	for _, v := range vars {
		if _, value, _ := strings.Cut(v, "="); !strings.Contains(flags, value) {
			t.Fatalf("make build's -ldflags %q do not carry %s", flags, v)
		}
	}
	return flags
}
