// Package labproc finds and ends what a lab engine (dockerlab, podmanlab)
// left behind when it stops: the processes in one of its namespaces and
// their descendants, by PID, and the cgroups it made. It only reads /proc
// and removes cgroup directories; callers decide what to kill.
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
