// Package labproc holds what the lab's engines (dockerlab, podmanlab) share
// about their processes: the private mount namespace they start in, and
// finding and ending what they left behind when they stop (the processes in
// one of their namespaces and their descendants, by PID, their cgroups and
// their directory). It only reads /proc and removes directories; callers
// decide what to kill.
package labproc

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
)

// PrivateMounts is the start of an engine's shell script, run in a mount
// namespace of its own (Unshareflags CLONE_NEWNS) inside a lab network
// namespace: mounts stop propagating, /sys becomes that network
// namespace's own (the cgroup hierarchy bound back in, through dir/cg,
// which must exist), and a tmpfs covers /run, where engines write whatever
// their flags say.
func PrivateMounts(dir string) string {
	return fmt.Sprintf(`D=%q
mount --make-rprivate /
mount --rbind /sys/fs/cgroup "$D/cg"
mount -t sysfs sysfs /sys
mount --rbind "$D/cg" /sys/fs/cgroup
umount -l "$D/cg"
mount -t tmpfs -o mode=0755 carve-lab /run
`, dir)
}

// ReadPIDFile reads a pid file; 0 when it is missing or malformed.
func ReadPIDFile(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// Running reports whether pid is a live process (a zombie, state Z, has
// exited; its parent has yet to reap it).
func Running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// InNamespace lists the live processes whose namespace is ns, as
// /proc/PID/ns/<kind> reads ("net:[4026532001]", "mnt:[4026532002]"), and
// their descendants (containers live in namespaces of their own, under
// monitors that live in the engine's), this process excepted.
func InNamespace(ns string) ([]int, error) {
	kind, _, ok := strings.Cut(ns, ":")
	if !ok || kind == "" || strings.Contains(kind, "/") {
		return nil, fmt.Errorf("labproc: %q is not a namespace as /proc/PID/ns shows one", ns)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("labproc: %w", err)
	}
	parent := map[int]int{}
	var roots []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, kind)); err == nil && l == ns && Running(pid) {
			roots = append(roots, pid)
		}
		if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
			if len(f) > 1 {
				parent[pid], _ = strconv.Atoi(f[1])
			}
		}
	}
	out := slices.Clone(roots)
	for changed := true; changed; {
		changed = false
		for pid, ppid := range parent {
			if slices.Contains(out, ppid) && !slices.Contains(out, pid) && Running(pid) {
				out = append(out, pid)
				changed = true
			}
		}
	}
	return out, nil
}

// RemoveCgroups removes the cgroup named parent (a path below the root of
// a hierarchy) from the unified hierarchy and every v1 one, children first.
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

// RemoveLeftovers removes an engine's cgroups (RemoveCgroups) and then its
// directory, unless something under the directory is mounted in this mount
// namespace: the engine's mounts belong in a mount namespace of its own,
// gone with its processes, and removing a directory through a leaked mount
// would reach into what is mounted there.
func RemoveLeftovers(cgroupParent, dir string) error {
	var errs []error
	if err := RemoveCgroups(cgroupParent); err != nil {
		errs = append(errs, err)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), dir) {
		return errors.Join(append(errs, fmt.Errorf("mounts under %s leaked into this mount namespace", dir))...)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
