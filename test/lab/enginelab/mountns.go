package enginelab

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// PrivateMounts is the start of an engine's shell script, run in a mount
// namespace of its own (Unshareflags CLONE_NEWNS) inside a lab network
// namespace: it sets D to dir, stops mounts from propagating, makes /sys
// the network namespace's own (the cgroup hierarchy bound back in, through
// dir/cg, which must exist) and covers /run with a tmpfs, where engines
// write whatever their flags say.
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

// MountNamespace is a private mount namespace inside a lab host's network
// namespace, the machine an engine runs on, owned by a process of its own
// (the holder) so that it outlives the engine's processes: a daemon killed
// with SIGKILL and started again in it finds its mounts, and an engine
// without a daemon (Podman) runs every command in it.
type MountNamespace struct {
	holder *exec.Cmd
	hold   *os.File // the holder's stdin: it exits when this closes
	exited chan error
	link   string // as /proc/PID/ns/mnt reads
}

// HoldMountNamespace starts the holder in host's network namespace: it
// makes PrivateMounts(dir) (creating dir/cg) and then mounts (shell
// commands, $D is dir: the machine's paths an engine writes to whatever its
// configuration says), and lives until Close, or until this process exits.
// It returns once the mounts are made; an error quotes the holder's
// standard error.
func HoldMountNamespace(ctx context.Context, host *netnslab.Host, dir, mounts string) (*MountNamespace, error) {
	if err := os.MkdirAll(filepath.Join(dir, "cg"), 0o711); err != nil {
		return nil, fmt.Errorf("enginelab: %w", err)
	}
	ready := filepath.Join(dir, "mounts.ready")
	if err := os.Remove(ready); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("enginelab: %w", err)
	}
	// The holder reads its stdin, a pipe from this process, to its end:
	// it exits on Close, and also when this process dies (the pipe's write
	// end is closed with it), so a crashed test leaves no holder behind.
	script := "set -e\n" + PrivateMounts(dir) + mounts + "\n: >\"$D/mounts.ready\"\nexec cat >/dev/null\n"
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("enginelab: %w", err)
	}
	defer r.Close()
	m := &MountNamespace{hold: w, exited: make(chan error, 1)}
	m.holder = exec.Command("/bin/sh", "-c", script)
	m.holder.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	m.holder.Stdin = r
	var stderr bytes.Buffer
	m.holder.Stdout, m.holder.Stderr = &stderr, &stderr
	if err := host.Start(m.holder); err != nil {
		w.Close()
		return nil, fmt.Errorf("enginelab: start the mount namespace's holder: %w", err)
	}
	go func() { m.exited <- m.holder.Wait() }()
	err = retry.Until(ctx, 20*time.Millisecond, func() error {
		select {
		case err := <-m.exited:
			m.exited <- err
			return retry.Permanent(fmt.Errorf("it exited (%v)", err))
		default:
		}
		_, err := os.Stat(ready)
		return err
	})
	if err == nil {
		m.link, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", m.holder.Process.Pid))
	}
	if err != nil {
		_ = m.Close()
		return nil, fmt.Errorf("enginelab: private mount namespace: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return m, nil
}

// PID is the holder's process id (`nsenter -t PID -m` enters the
// namespace).
func (m *MountNamespace) PID() int { return m.holder.Process.Pid }

// Path is the namespace's file (`nsenter --mount=PATH` enters it) while
// the holder runs.
func (m *MountNamespace) Path() string { return fmt.Sprintf("/proc/%d/ns/mnt", m.PID()) }

// Processes lists the running processes in the namespace and their
// descendants (ProcessesIn), the holder among them until Close.
func (m *MountNamespace) Processes() []int { return ProcessesIn("mnt", m.link) }

// Close ends the holder, by SIGKILL when it has not exited 10s after its
// stdin closed (an error then); calling it again does nothing. The
// namespace lives on while other processes are in it (Processes lists
// them).
func (m *MountNamespace) Close() error {
	m.hold.Close()
	select {
	case err := <-m.exited:
		m.exited <- err
		return nil
	case <-time.After(10 * time.Second):
		_ = m.holder.Process.Kill()
		m.exited <- <-m.exited
		return fmt.Errorf("enginelab: the mount namespace's holder (pid %d) outlived its stdin by 10s; killed it", m.PID())
	}
}
