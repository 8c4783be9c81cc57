package netnslab

// Named namespaces under NetNSDir, as `ip netns` keeps them: creating and
// removing their bind mounts, and finding the ones that labs of processes
// no longer running left behind.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carve-net/carve/internal/retry"
)

// createNamed creates a network namespace and bind-mounts it at path, as
// `ip netns add` does. (plugins/pkg/ns opens namespaces and runs code in
// them, which Do uses, but creates none with a name of ours;
// pkg/testutils.NewNS names them at random, which Stale could not trace to
// their creator.) The unshare happens on a dedicated, locked OS thread
// that is never unlocked, so the Go runtime discards it afterwards and no
// other goroutine ever runs inside the new namespace by accident.
func createNamed(path string) error {
	if err := EnsureNetNSDir(); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately no UnlockOSThread: see the function comment.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// EnsureNetNSDir makes NetNSDir a shared mount point, as `ip netns add`
// and CNI's testutils.NewNS do the first time: when it is not one yet, they
// bind it onto itself, recursively. A namespace bound in the directory
// before that stays under the new mount, copied into it: the copy can be
// unmounted, the original never (its file is busy, EBUSY, for good). So
// every namespace of the lab is created after the directory is a mount
// point (`make test` makes it one before any test runs, because the test
// packages run side by side and one of them uses `ip netns add`).
func EnsureNetNSDir() error {
	if err := os.MkdirAll(NetNSDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if !errors.Is(err, unix.EINVAL) {
		return err // nil: a mount point already, now shared
	}
	if err := unix.Mount(NetNSDir, NetNSDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", NetNSDir, err)
	}
	return unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, "")
}

// RemoveMount undoes `ip netns add` (and createNamed): it detaches the
// namespace's bind mount at path and removes the file; a missing one is not
// an error. (plugins/pkg/testutils.UnmountNS fails on a missing or busy
// mount, which a cleanup after a crash must get past.)
//
// The file is busy (EBUSY) while it is still a mount point: the namespace
// was bound there more than once (each unmount detaches one); it is
// unmounted and removed again for up to removeBusyFor. (One left under a
// later mount of the directory stays busy: see EnsureNetNSDir.)
func RemoveMount(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), removeBusyFor)
	defer cancel()
	return retry.Until(ctx, 50*time.Millisecond, func() error {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return retry.Permanent(fmt.Errorf("unmount: %w", err))
		}
		err := os.Remove(path)
		switch {
		case err == nil || errors.Is(err, os.ErrNotExist):
			return nil
		case errors.Is(err, unix.EBUSY):
			return err
		}
		return retry.Permanent(err)
	})
}

// removeBusyFor bounds how long RemoveMount tries a busy namespace file.
const removeBusyFor = 2 * time.Second

// CreatorPID parses a namespace name a lab with this prefix made
// ("<prefix>-<pid>-<counter>-<suffix>") and returns the pid of the process
// that made it; false when the name is not one.
func CreatorPID(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok {
		return 0, false
	}
	fields := strings.SplitN(rest, "-", 3)
	if len(fields) != 3 {
		return 0, false
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil || pid <= 0 {
		return 0, false
	}
	if _, err := strconv.Atoi(fields[1]); err != nil {
		return 0, false
	}
	return pid, true
}

// Stale lists the namespaces (names under NetNSDir) left behind by labs of
// processes that no longer run (PIDAlive: a zombie counts as gone), e.g. a
// test binary that was killed: names of the form prefix-<pid>-<n>-... .
// prefix "" means DefaultPrefix. Names of any other form are never listed.
func Stale(prefix string) ([]string, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	entries, err := os.ReadDir(NetNSDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var stale []string
	for _, e := range entries {
		if pid, ok := CreatorPID(e.Name(), prefix); ok && !PIDAlive(pid) {
			stale = append(stale, e.Name())
		}
	}
	return stale, nil
}

// RemoveStale removes the namespaces Stale lists and returns their names. It
// never touches a namespace whose creator still runs.
func RemoveStale(prefix string) ([]string, error) {
	stale, err := Stale(prefix)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, name := range stale {
		if err := RemoveMount(filepath.Join(NetNSDir, name)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
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
