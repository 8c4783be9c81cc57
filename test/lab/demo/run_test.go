package demo

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestRemoveStaleDirs removes the work directories of demos whose process is
// gone, and keeps those of running ones and whatever is not a demo's.
func TestRemoveStaleDirs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]bool{ // name -> kept
		"carve-demo-" + strconv.Itoa(exited.Process.Pid) + "-1": false,
		"carve-demo-" + strconv.Itoa(os.Getppid()) + "-2":       true,
		"carve-demo-" + strconv.Itoa(os.Getpid()) + "-3":        true,
		"carve-demo-x-4": true,
		"other-1-2":      true,
	}
	for d := range dirs {
		if err := os.MkdirAll(filepath.Join(tmp, d, "logs"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	removeStaleDirs(io.Discard)
	for d, kept := range dirs {
		_, err := os.Stat(filepath.Join(tmp, d))
		if (err == nil) != kept {
			t.Errorf("%s exists = %v, want %v", d, err == nil, kept)
		}
	}
}
