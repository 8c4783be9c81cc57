package enginelab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/carve-net/carve/test/lab/netnslab"
)

// ReadPID reads a pid file; 0 when there is none.
func ReadPID(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// ProcessesIn lists the running processes whose namespace of the given kind
// ("net", "mnt": a name under /proc/PID/ns) is want (as the link reads,
// e.g. "net:[4026532281]"), and their descendants (containers live in
// namespaces of their own, under shims that live in the daemon's), this
// process excepted. The caller's daemons started all of them. A kind that
// names no entry of /proc/PID/ns (empty, or holding a /) finds none.
func ProcessesIn(kind, want string) []int {
	if kind == "" || strings.Contains(kind, "/") {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, kind)); err == nil && l == want && netnslab.PIDAlive(pid) {
			out = append(out, pid)
		}
		if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
			if len(f) > 1 {
				parent[pid], _ = strconv.Atoi(f[1])
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for pid, ppid := range parent {
			if slices.Contains(out, ppid) && !slices.Contains(out, pid) && netnslab.PIDAlive(pid) {
				out = append(out, pid)
				changed = true
			}
		}
	}
	return out
}

// NetNSLink is how /proc/PID/ns/net reads for a process in host's network
// namespace, the want of ProcessesIn("net", ...).
func NetNSLink(host *netnslab.Host) (string, error) {
	ino, err := host.Inode()
	if err != nil {
		return "", fmt.Errorf("enginelab: namespace inode: %w", err)
	}
	return fmt.Sprintf("net:[%d]", ino), nil
}

// RemoveCgroups removes the cgroup called parent (a path below a
// hierarchy's root) from every hierarchy, children first, and returns what
// it could not remove.
func RemoveCgroups(parent string) error {
	var errs []error
	for _, pattern := range []string{"/sys/fs/cgroup/" + parent, "/sys/fs/cgroup/*/" + parent} {
		matches, _ := filepath.Glob(pattern)
		for _, m := range matches {
			errs = append(errs, removeCgroup(m))
		}
	}
	return errors.Join(errs...)
}

// removeCgroup removes a cgroup directory, children first.
func removeCgroup(dir string) error {
	entries, _ := os.ReadDir(dir)
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeCgroup(filepath.Join(dir, e.Name())))
		}
	}
	if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// RemoveLeftovers removes an engine's cgroups (RemoveCgroups of
// cgroupParent) and then its directory dir, unless something under dir is
// mounted in this mount namespace: the engine's mounts belong in a mount
// namespace of its own, gone with its processes, and removing a directory
// through a leaked mount would reach into what is mounted there. It returns
// what it could not remove.
func RemoveLeftovers(cgroupParent, dir string) error {
	var errs []error
	if err := RemoveCgroups(cgroupParent); err != nil {
		errs = append(errs, err)
	}
	if mountsUnder(dir) {
		return errors.Join(append(errs, fmt.Errorf("mounts under %s leaked into this mount namespace", dir))...)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mountsUnder reports whether this process's mount namespace has a mount at
// or under dir.
func mountsUnder(dir string) bool {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	return err == nil && strings.Contains(string(mi), dir)
}
