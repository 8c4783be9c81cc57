package labproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func TestReadPIDFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		want          int
	}{
		{"plain", "1234", 1234},
		{"newline", "42\n", 42},
		{"garbage", "x1", 0},
		{"missing", "", 0},
	} {
		p := filepath.Join(dir, tc.name)
		if tc.content != "" {
			if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got := ReadPIDFile(p); got != tc.want {
			t.Errorf("%s: ReadPIDFile = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestInNamespace finds a child in this process's own mount namespace (and
// not this process), and refuses a malformed namespace.
func TestInNamespace(t *testing.T) {
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Skipf("no sleep: %v", err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	pids, err := InNamespace(ns)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, child.Process.Pid) || slices.Contains(pids, os.Getpid()) {
		t.Errorf("InNamespace(%s) = %v: want the child %d, not this process %d", ns, pids, child.Process.Pid, os.Getpid())
	}
	if !Running(child.Process.Pid) {
		t.Errorf("child %d not running", child.Process.Pid)
	}
	for _, bad := range []string{"", "mnt", ":[1]", "../x:[1]"} {
		if _, err := InNamespace(bad); err == nil {
			t.Errorf("InNamespace(%q) accepted", bad)
		}
	}
	if Running(1 << 30) {
		t.Errorf("pid %d runs", 1<<30)
	}
}
