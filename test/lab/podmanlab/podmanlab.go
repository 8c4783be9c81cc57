// Package podmanlab runs Debian's rootful Podman (4.3, CNI backend) inside a
// lab host's network namespace, for tests of carve under Podman: containers
// run from a local busybox root file system (enginelab.BusyboxRootfsDir), on
// CNI networks that the test writes into a configuration directory of its
// own.
//
// Podman is no daemon: every command is a process, and conmon (one per
// container) outlives it. All of them run inside one private mount
// namespace (enginelab.HoldMountNamespace) in the host's network
// namespace. In it, the machine's paths that Podman and
// libcni write to whatever their configuration says are covered by
// directories of the lab: /run (a tmpfs: Podman's runroot and tmp_dir, the
// containers' netns files in /run/netns), /dev/shm (a tmpfs: Podman's SHM
// locks), /var/lib (Dir/varlib: libcni's result cache /var/lib/cni and
// host-local's default data directory, both fixed paths) and /etc/containers.
// Podman reads only the lab's containers.conf (CONTAINERS_CONF) and
// storage.conf (CONTAINERS_STORAGE_CONF). The cleanup removes the
// containers (CNI DEL), kills what is left in that mount namespace by PID,
// removes the cgroups and the directory.
package podmanlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
	"golang.org/x/sys/unix"
)

// runRoot and tmpDir are Podman's runroot and tmp_dir (its defaults),
// inside the lab's private /run.
const (
	runRoot = "/run/containers/storage"
	tmpDir  = "/run/libpod"
)

// DebianCNIPluginDir is where Debian's containernetworking-plugins installs
// the reference plugins (bridge, host-local, ...).
const DebianCNIPluginDir = "/usr/lib/cni"

// Options configure New. The zero value runs Debian's plugins on networks
// found in a fresh directory (ConfDir).
type Options struct {
	// CNIPluginDirs are where Podman looks for CNI plugins, in order
	// (default DebianCNIPluginDir).
	CNIPluginDirs []string
	// CNIConfDir is where Podman finds networks (conflists) by name; the
	// caller writes them (default a fresh directory under Dir).
	CNIConfDir string
	// Dir holds Podman's storage, state, configuration and logs (default
	// t.TempDir()).
	Dir string
	// Env is added to every Podman command's environment (CNI_ARGS set here
	// reach the plugins: Podman appends them to its own).
	Env []string
}

// Podman runs podman commands inside one lab host, with a private
// configuration and storage. Its methods are safe for concurrent use.
type Podman struct {
	opts   Options
	host   *netnslab.Host
	bins   map[string]string
	rootfs string
	cgroup string
	mnt    *enginelab.MountNamespace
}

// Binaries finds the programs the lab runs: Debian's podman, its conmon and
// OCI runtime (crun or runc), and util-linux's nsenter.
func Binaries() (map[string]string, error) {
	bins, err := enginelab.LookPaths("podman", "podman", "conmon", "nsenter", "mount", "umount")
	if err != nil {
		return nil, err
	}
	for _, rt := range []string{"crun", "runc"} {
		if p, err := exec.LookPath(rt); err == nil {
			bins["runtime"] = p
			return bins, nil
		}
	}
	return nil, errors.New("neither crun nor runc found (install Debian's podman)")
}

// New starts the lab's Podman in host for a test, and registers its
// cleanup. A missing prerequisite (root, podman, a static busybox, a plugin
// directory) skips the test, or fails it when $CI is "true".
func New(t testing.TB, host *netnslab.Host, opts Options) *Podman {
	t.Helper()
	testutil.Require(t, netnslab.IsRoot(), "podmanlab: rootful Podman needs root; run the tests as root")
	_, err := Binaries()
	testutil.Require(t, err == nil, "podmanlab: %v", err)
	_, err = enginelab.StaticBusybox()
	testutil.Require(t, err == nil, "podmanlab: %v", err)
	if len(opts.CNIPluginDirs) == 0 {
		opts.CNIPluginDirs = []string{DebianCNIPluginDir}
	}
	for _, d := range opts.CNIPluginDirs {
		_, err := os.Stat(d)
		testutil.Require(t, err == nil, "podmanlab: CNI plugin directory %s: %v (install Debian's containernetworking-plugins)", d, err)
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	p, err := Start(host, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("podmanlab: cleanup: %v", err)
		}
	})
	return p
}

// Start starts the lab's Podman in host outside a test (the demo): Close
// removes it. opts.Dir is required; it fails when a prerequisite is
// missing, naming it.
func Start(host *netnslab.Host, opts Options) (*Podman, error) {
	if opts.Dir == "" {
		return nil, errors.New("podmanlab: Options.Dir is required")
	}
	bins, err := Binaries()
	if err != nil {
		return nil, fmt.Errorf("podmanlab: %w", err)
	}
	busybox, err := enginelab.StaticBusybox()
	if err != nil {
		return nil, fmt.Errorf("podmanlab: %w", err)
	}
	if len(opts.CNIPluginDirs) == 0 {
		opts.CNIPluginDirs = []string{DebianCNIPluginDir}
	}
	if opts.CNIConfDir == "" {
		opts.CNIConfDir = filepath.Join(opts.Dir, "net.d")
	}
	p := &Podman{
		opts: opts, host: host, bins: bins,
		rootfs: filepath.Join(opts.Dir, "rootfs"),
		cgroup: fmt.Sprintf("carve-podman-%d-%s", os.Getpid(), filepath.Base(opts.Dir)),
	}
	if err := p.prepare(busybox); err != nil {
		return nil, fmt.Errorf("podmanlab: %w", err)
	}
	if err := p.holdMounts(); err != nil {
		return nil, fmt.Errorf("podmanlab: %w", err)
	}
	return p, nil
}

// ConfDir is where Podman finds networks by name: write conflists there.
func (p *Podman) ConfDir() string { return p.opts.CNIConfDir }

// Dir is the lab's directory (events.log, the storage, the configuration).
func (p *Podman) Dir() string { return p.opts.Dir }

// VarLib is what Podman and its plugins see as /var/lib: libcni's cache is
// VarLib()/cni/results, host-local's default data directory
// VarLib()/cni/networks/NETWORK.
func (p *Podman) VarLib() string { return filepath.Join(p.opts.Dir, "varlib") }

// Rootfs is the busybox root file system containers run from.
func (p *Podman) Rootfs() string { return p.rootfs }

// prepare writes the directories, the root file system and the two
// configuration files.
func (p *Podman) prepare(busybox string) error {
	d := p.opts.Dir
	for _, sub := range []string{"storage", "tmp", "varlib", "etc-containers", "volumes"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o711); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(p.opts.CNIConfDir, 0o755); err != nil {
		return err
	}
	if err := enginelab.BusyboxRootfsDir(p.rootfs, busybox); err != nil {
		return err
	}
	runtime := filepath.Base(p.bins["runtime"])
	// Rootful Podman raises a container's RLIMIT_NOFILE and RLIMIT_NPROC to
	// 1048576 unless default_ulimits names them; without CAP_SYS_RESOURCE
	// (a sandboxed machine) runc cannot. So nofile stays at this process's
	// hard limit, and nproc at what Podman lowers its own to when it starts
	// (pid_max, when that is below the hard limit).
	var nofile, nproc unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		return err
	}
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &nproc); err != nil {
		return err
	}
	if data, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if max, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64); err == nil && max < nproc.Max {
			nproc.Max = max
		}
	}
	// Debian's /usr/share/containers/containers.conf sets the capabilities
	// and the ping sysctl; CONTAINERS_CONF replaces that file, so they are
	// repeated here to run containers as Debian does, with NET_RAW added:
	// busybox's ping opens only raw sockets (no ICMP datagram socket, which
	// ping_group_range would allow).
	conf := fmt.Sprintf(`[containers]
default_capabilities = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]
default_sysctls = ["net.ipv4.ping_group_range=0 0"]
default_ulimits = ["nofile=%[1]d:%[1]d", "nproc=%[8]d:%[8]d"]
log_driver = "k8s-file"

[network]
network_backend = "cni"
cni_plugin_dirs = %[2]s
network_config_dir = %[3]q

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %[4]q
tmp_dir = %[5]q
volume_path = %[6]q
runtime = %[7]q
`, nofile.Max, tomlStrings(p.opts.CNIPluginDirs), p.opts.CNIConfDir, filepath.Join(d, "events.log"),
		tmpDir, filepath.Join(d, "volumes"), runtime, nproc.Max)
	if err := os.WriteFile(filepath.Join(d, "containers.conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	// vfs: the containers' root file system is the --rootfs directory, so
	// the driver holds only Podman's per-container files; vfs needs no
	// kernel support and makes no mounts. The runroot is Podman's default,
	// in the lab's private /run: conmon's exit command (`podman container
	// cleanup`, which calls CNI DEL when a container ends by itself) gets
	// it as --runroot, which Podman refuses when longer than 50 bytes.
	storage := fmt.Sprintf("[storage]\ndriver = \"vfs\"\ngraphroot = %q\nrunroot = %q\n",
		filepath.Join(d, "storage"), runRoot)
	return os.WriteFile(filepath.Join(d, "storage.conf"), []byte(storage), 0o644)
}

func tomlStrings(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// holdMounts starts the private mount namespace (enginelab's: the
// network namespace's own /sys, a tmpfs over /run) in host's network
// namespace with the lab's directories over the machine's.
func (p *Podman) holdMounts() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mnt, err := enginelab.HoldMountNamespace(ctx, p.host, p.opts.Dir, `mount -t tmpfs -o mode=1777 carve-lab /dev/shm
mount --bind "$D/varlib" /var/lib
if [ -d /etc/containers ]; then mount --bind "$D/etc-containers" /etc/containers; fi`)
	if err != nil {
		return err
	}
	p.mnt = mnt
	return nil
}

// Command runs podman with args inside the lab (its network and mount
// namespaces, its configuration) and returns its standard output; an error
// quotes its standard error.
func (p *Podman) Command(ctx context.Context, args ...string) ([]byte, error) {
	argv := append([]string{"-t", strconv.Itoa(p.mnt.PID()), "-m", "-n", "--", p.bins["podman"]}, args...)
	cmd := exec.CommandContext(ctx, p.bins["nsenter"], argv...)
	cmd.Env = append([]string{
		"PATH=" + filepath.Dir(p.bins["runtime"]) + ":/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + p.opts.Dir,
		"CONTAINERS_CONF=" + filepath.Join(p.opts.Dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(p.opts.Dir, "storage.conf"),
		"TMPDIR=" + filepath.Join(p.opts.Dir, "tmp"),
	}, p.opts.Env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &CommandError{Args: args, Err: err, Stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.Bytes(), nil
}

// CommandError is a podman command that failed.
type CommandError struct {
	Args   []string
	Err    error // an *exec.ExitError when podman ran and failed
	Stderr string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("podman %s: %v: %s", strings.Join(e.Args, " "), e.Err, e.Stderr)
}

func (e *CommandError) Unwrap() error { return e.Err }

// Close removes every container (Podman calls CNI DEL for each), kills
// what is left in the lab's mount namespace by PID (conmon, containers,
// the holder), and removes the cgroups and the directory.
func (p *Podman) Close() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := p.Command(ctx, "rm", "--all", "--force", "--time", "0"); err != nil {
		errs = append(errs, err)
	}
	if err := p.mnt.Close(); err != nil {
		errs = append(errs, err)
	}
	// Only this package's processes are in the mount namespace: conmon
	// (reparented when it daemonized), the containers below it, and the
	// `podman container cleanup` that conmon starts when a container ends,
	// which may still run when rm returns: wait for them to end on their
	// own, then kill what is left by PID.
	var left []int
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := retry.Until(wctx, 50*time.Millisecond, func() error {
		left = p.mnt.Processes()
		if len(left) > 0 {
			return fmt.Errorf("processes %v still run", left)
		}
		return nil
	})
	wcancel()
	if len(left) > 0 {
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		errs = append(errs, fmt.Errorf("processes outlived `podman rm --all` by 10s, killed: %v", left))
	} else if err != nil {
		errs = append(errs, err)
	}
	// Every mount lived in the holder's namespace, gone with its processes.
	if err := enginelab.RemoveLeftovers(p.cgroup, p.opts.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
