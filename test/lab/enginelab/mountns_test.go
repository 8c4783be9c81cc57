package enginelab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestHoldMountNamespace holds a private mount namespace in a lab host:
// the holder is in the host's network namespace and a mount namespace not
// this process's, the engine's mounts (here a tmpfs over /mnt) stay in it,
// and Close ends the holder.
func TestHoldMountNamespace(t *testing.T) {
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	host := lab.Hosts()[0]
	dir := filepath.Join(t.TempDir(), "engine")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := HoldMountNamespace(ctx, host, dir, `mount -t tmpfs carve-enginelab-test /mnt`)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	if held, err := os.Readlink(m.Path()); err != nil || held == self {
		t.Errorf("holder's mount namespace %q (%v), this process's %q: want another", held, err, self)
	}
	want, err := NetNSLink(host)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ProcessesIn("net", want), m.PID()) {
		t.Errorf("holder %d not in the host's network namespace %s", m.PID(), want)
	}
	if !slices.Contains(m.Processes(), m.PID()) {
		t.Errorf("Processes() = %v, want the holder %d", m.Processes(), m.PID())
	}
	held, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(m.PID()), "mountinfo"))
	if err != nil || !strings.Contains(string(held), "carve-enginelab-test") {
		t.Errorf("the holder's mounts lack the tmpfs over /mnt (%v)", err)
	}
	if mine, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mine), "carve-enginelab-test") {
		t.Errorf("the holder's tmpfs leaked into this mount namespace")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the namespace empty after Close", func() error {
		if left := m.Processes(); len(left) > 0 {
			return fmt.Errorf("processes %v still run", left)
		}
		return nil
	})
	if err := RemoveLeftovers("carve-enginelab-test-no-such-cgroup", dir); err != nil {
		t.Fatal(err)
	}
}
