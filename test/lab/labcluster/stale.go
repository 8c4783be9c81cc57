package labcluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
	"golang.org/x/sys/unix"
)

// RemoveStale cleans up after runs with this namespace prefix whose process
// died without closing its cluster (a demo killed with SIGKILL, a test
// binary that hit its timeout). Their carve masters and agents outlive them,
// each keeping its namespace alive, so it first kills, by PID, every process
// that lives in one of those stale namespaces (netnslab.Stale) and whose
// command line is `carve master ...` or `carve agent ...` (the processes a
// cluster starts), then removes the namespaces (netnslab.RemoveStale).
// Namespaces whose creator still runs are never touched.
func RemoveStale(prefix string) (killed []int, removed []string, err error) {
	names, err := netnslab.Stale(prefix)
	if err != nil {
		return nil, nil, err
	}
	stale := map[nsID]string{}
	for _, name := range names {
		if id, err := statNS(filepath.Join(netnslab.NetNSDir, name)); err == nil {
			stale[id] = name
		}
	}
	var errs []error
	if len(stale) > 0 {
		if killed, err = killIn(stale); err != nil {
			errs = append(errs, err)
		}
	}
	removed, err = netnslab.RemoveStale(prefix)
	return killed, removed, errors.Join(append(errs, err)...)
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
			if !netnslab.PIDAlive(pid) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return killed, errors.Join(errs...)
}
