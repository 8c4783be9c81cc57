package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDemoExecsLab builds carve and runs `carve demo` next to a stand-in
// carve-lab that prints its argv: the flags arrive unchanged, in a process
// that replaced carve (same pid). Without carve-lab, carve demo says what to
// build.
func TestDemoExecsLab(t *testing.T) {
	dir := t.TempDir()
	carve := filepath.Join(dir, "carve")
	if out, err := exec.Command(goTool, "build", "-o", carve, "github.com/carve-net/carve/cmd/carve").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/carve: %v\n%s", err, out)
	}

	tests := []struct {
		name     string
		lab      string // content of carve-lab; "" for none
		mode     os.FileMode
		args     []string
		wantExit int
		want     string
	}{
		{name: "missing", args: []string{"demo"}, wantExit: 1, want: "carve demo: needs bin/carve-lab, not found at " + filepath.Join(dir, "carve-lab") + ": run make build"},
		{name: "not executable", lab: "#!/bin/sh\n", mode: 0o644, args: []string{"demo"}, wantExit: 1, want: "is not an executable file: run make build"},
		{name: "flags passed on", lab: "#!/bin/sh\necho \"pid $$ argv0 $0 args $*\"\nexit 3\n", mode: 0o755,
			args: []string{"demo", "--hosts", "2", "--keep"}, wantExit: 3, want: "argv0 " + filepath.Join(dir, "carve-lab") + " args --hosts 2 --keep"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lab := filepath.Join(dir, "carve-lab")
			_ = os.Remove(lab)
			if tc.lab != "" {
				if err := os.WriteFile(lab, []byte(tc.lab), tc.mode); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(carve, tc.args...)
			out, err := cmd.CombinedOutput()
			exit := 0
			if ee, ok := err.(*exec.ExitError); ok {
				exit = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if exit != tc.wantExit || !strings.Contains(string(out), tc.want) {
				t.Fatalf("carve %s: exit %d, output %q; want exit %d with %q", strings.Join(tc.args, " "), exit, out, tc.wantExit, tc.want)
			}
			if tc.wantExit == 3 {
				// exec, not a child: the lab runs as carve's own pid.
				if pid := cmd.ProcessState.Pid(); !strings.Contains(string(out), "pid "+strconv.Itoa(pid)+" ") {
					t.Errorf("carve-lab ran as %q, not as carve's pid %d", out, pid)
				}
			}
		})
	}
}
