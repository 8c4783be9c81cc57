package labcluster

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/carve-net/carve/internal/netnslab"
	"golang.org/x/sys/unix"
)

// RemoveStale cleans up after runs with this namespace prefix whose process
// died without closing its cluster (a demo killed with SIGKILL, a test
// binary that hit its timeout). Their carve masters and agents outlive them,
// each keeping its namespace alive, so it first kills, by PID, every process
// that lives in one of those stale namespaces and whose command line is
// `carve master ...` or `carve agent ...` (the processes a cluster starts),
// then removes the namespaces. Namespaces whose creator still runs are never
// touched; a creator that is a zombie (exited, not yet reaped) counts as
// gone, which netnslab.RemoveStale, called last for anything else, does not
// know.
func RemoveStale(prefix string) (killed []int, removed []string, err error) {
	stale, err := staleNamespaces(prefix)
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	if len(stale) > 0 {
		killed, err = killIn(stale)
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range slices.Sorted(maps.Values(stale)) {
		if err := removeNamespace(filepath.Join(netnslab.NetNSDir, name)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	more, err := netnslab.RemoveStale(prefix)
	if err != nil {
		errs = append(errs, err)
	}
	return killed, append(removed, more...), errors.Join(errs...)
}

// removeNamespace undoes `ip netns add`: unmount, then remove the file.
func removeNamespace(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// PIDAlive reports whether pid runs: it exists and is not a zombie. A
// process killed with SIGKILL stays a zombie until its parent reaps it, and
// its leftovers are stale from the moment it died.
func PIDAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return true
	}
	return stat[i+2] != 'Z' && stat[i+2] != 'X'
}

// nsID identifies a namespace by the device and inode of its nsfs file.
type nsID struct{ dev, ino uint64 }

func statNS(path string) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nsID{}, err
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// staleNamespaces lists the namespaces named prefix-<pid>-<n>-... whose
// creator pid no longer runs (the rule of netnslab.RemoveStale, except that
// a zombie counts as gone).
func staleNamespaces(prefix string) (map[nsID]string, error) {
	entries, err := os.ReadDir(netnslab.NetNSDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[nsID]string{}
	for _, e := range entries {
		pid, ok := netnslab.CreatorPID(e.Name(), prefix)
		if !ok {
			continue
		}
		if PIDAlive(pid) {
			continue // its creator still runs
		}
		id, err := statNS(filepath.Join(netnslab.NetNSDir, e.Name()))
		if err != nil {
			continue // not mounted (any more)
		}
		out[id] = e.Name()
	}
	return out, nil
}

// isClusterProcess reports whether a command line is one a cluster starts.
func isClusterProcess(cmdline []byte) bool {
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	if len(args) < 2 || filepath.Base(string(args[0])) != "carve" {
		return false
	}
	return string(args[1]) == "master" || string(args[1]) == "agent"
}

// killIn SIGKILLs the cluster processes that live in one of the namespaces,
// and waits (briefly) until they are gone.
func killIn(namespaces map[nsID]string) ([]int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var killed []int
	var errs []error
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		id, err := statNS(filepath.Join("/proc", p.Name(), "ns", "net"))
		if err != nil {
			continue
		}
		if _, ok := namespaces[id]; !ok {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || !isClusterProcess(cmdline) {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill stale pid %d: %w", pid, err))
			continue
		}
		killed = append(killed, pid)
	}
	// They were orphans: init reaps them. Wait so that their namespaces are
	// really free once this returns.
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range killed {
		for time.Now().Before(deadline) {
			if !PIDAlive(pid) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return killed, errors.Join(errs...)
}
