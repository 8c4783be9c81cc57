// Package enginelab holds what the lab's container engines (dockerlab,
// containerdlab) share: the static busybox their images are made of, the
// reason a daemon gives in its log for failing, and the sweep of the
// processes and cgroups a daemon leaves behind when it is stopped.
package enginelab

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/carve-net/carve/internal/lab/netnslab"
)

// LookPaths finds programs on PATH; the error of a missing one says to
// install pkg (a Debian package).
func LookPaths(pkg string, names ...string) (map[string]string, error) {
	bins := map[string]string{}
	for _, b := range names {
		p, err := exec.LookPath(b)
		if err != nil {
			return nil, fmt.Errorf("%s not found (install Debian's %s): %w", b, pkg, err)
		}
		bins[b] = p
	}
	return bins, nil
}

// StaticBusybox finds a statically linked busybox (a dynamic one would need
// its libraries in the image).
func StaticBusybox() (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
		f.Close()
		if !dynamic {
			return p, nil
		}
		return "", fmt.Errorf("%s is dynamically linked (install Debian's busybox-static)", p)
	}
	return "", errors.New("no busybox in /bin or /usr/bin (install Debian's busybox-static)")
}

// BusyboxRootfs returns a root file system as an uncompressed tar (an image
// layer): /bin/busybox read from the file busybox, and /bin/sh, /bin/sleep
// and /bin/ping linked to it. No registry is reachable from a lab.
func BusyboxRootfs(busybox string) ([]byte, error) {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdrs := []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))},
	}
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bin); err != nil {
				return nil, err
			}
		}
	}
	for _, l := range []string{"sh", "sleep", "ping"} {
		if err := tw.WriteHeader(&tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// DaemonError is the reason a daemon gives in its log for failing: its last
// fatal or error line, else its last line.
func DaemonError(log string) string {
	data, _ := os.ReadFile(log)
	var last string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "level=fatal") || strings.Contains(l, "level=error") || strings.HasPrefix(l, "failed to start daemon") {
			last = l
		}
	}
	if last == "" {
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		last = lines[len(lines)-1]
	}
	return last
}

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
// process excepted. The caller's daemons started all of them.
func ProcessesIn(kind, want string) []int {
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

// MountsUnder reports whether this process's mount namespace has a mount at
// or under dir (a daemon's mounts belong in its own mount namespace).
func MountsUnder(dir string) bool {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	return err == nil && strings.Contains(string(mi), dir)
}
