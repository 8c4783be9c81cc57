package enginelab

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/carve-net/carve/test/lab/netnslab"
)

func TestReadPID(t *testing.T) {
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
		if got := ReadPID(p); got != tc.want {
			t.Errorf("%s: ReadPID = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestProcessesIn finds a child in this process's own mount namespace (and
// not this process), and nothing for a kind that is no namespace.
func TestProcessesIn(t *testing.T) {
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Skipf("no sleep: %v", err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	pids := ProcessesIn("mnt", ns)
	if !slices.Contains(pids, child.Process.Pid) || slices.Contains(pids, os.Getpid()) {
		t.Errorf("ProcessesIn(mnt, %s) = %v: want the child %d, not this process %d", ns, pids, child.Process.Pid, os.Getpid())
	}
	if !netnslab.PIDAlive(child.Process.Pid) {
		t.Errorf("child %d not running", child.Process.Pid)
	}
	for _, bad := range []string{"", "../ns/mnt", "mnt/.."} {
		if pids := ProcessesIn(bad, ns); len(pids) != 0 {
			t.Errorf("ProcessesIn(%q, %s) = %v, want none", bad, ns, pids)
		}
	}
	if netnslab.PIDAlive(1 << 30) {
		t.Errorf("pid %d runs", 1<<30)
	}
}

// TestRemoveLeftovers removes a directory with no mounts under it; a
// cgroup that does not exist is no error.
func TestRemoveLeftovers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "engine")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := RemoveLeftovers("carve-enginelab-test-no-such-cgroup", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there (%v)", dir, err)
	}
}
