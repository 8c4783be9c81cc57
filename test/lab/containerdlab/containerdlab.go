// Package containerdlab runs Debian's containerd (1.6, its CRI plugin built
// in) inside a lab host's network namespace and drives pods through its CRI
// with crictl, as a kubelet would, so that a CNI conflist is proven with
// containerd as people run it.
//
// Containment: a holder process owns a private mount namespace (the
// machine the daemon runs on: the network namespace's own /sys, the
// cgroup hierarchy bound back in, tmpfs over /run and /var/lib); containerd
// runs in it with its own root, state and sockets under a directory of the
// test's, and is started again in the same mount namespace after Kill9, as
// a crashed daemon restarts on the same machine, so that it finds its shims
// again. Pods get cgroups under a parent of their own and their network
// namespaces under containerd's state. The cleanup ends only the processes
// in that mount namespace and below (containerd, shims, pods, the holder),
// by PID, and removes the cgroups and the directory.
package containerdlab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/enginelab"
	"github.com/carve-net/carve/test/lab/netnslab"
)

// ErrCannotRun is wrapped by Start when containerd cannot run on this
// machine (a program missing, a kernel or sandbox that refuses it).
var ErrCannotRun = errors.New("containerd cannot run here")

// Binaries finds the programs a lab containerd needs (Debian's containerd
// and runc, util-linux's nsenter).
func Binaries() (map[string]string, error) {
	return enginelab.LookPaths("containerd", "containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "mount", "umount")
}

// Options configure Start.
type Options struct {
	// CNIConfDir and CNIBinDir are the CRI plugin's conf_dir (only its first
	// file in lexical order is loaded) and bin_dir (required).
	CNIConfDir, CNIBinDir string
	// Crictl is the crictl binary (required; labcluster.BuildTool builds
	// the version go.mod pins).
	Crictl string
	// Busybox is a static busybox, the pause image's root file system
	// (default enginelab.StaticBusybox()).
	Busybox string
	// CgroupParent is the cgroup of the pods (default
	// carve-lab-<pid>-<base of the directory>); the cleanup removes it.
	CgroupParent string
	// Bins are the programs (default Binaries()).
	Bins map[string]string
	// StartTimeout bounds each wait for the daemon to answer (default 60s).
	StartTimeout time.Duration
}

// Containerd is a containerd this package started. Its methods are not
// safe for concurrent use with Kill9 and Restart.
type Containerd struct {
	opts   Options
	host   *netnslab.Host
	dir    string
	mnt    *enginelab.MountNamespace
	cmd    *exec.Cmd
	waited chan error
}

// Start starts containerd inside host's network namespace, imports
// PauseImage, and waits until the CRI reports the runtime and its network
// ready (write the conflist into CNIConfDir first). t.Cleanup removes the
// pods and ends and removes everything it started, even when Start fails.
// When the daemon cannot start here, the error wraps ErrCannotRun and
// quotes the daemon's own words.
func Start(ctx context.Context, t testing.TB, host *netnslab.Host, opts Options) (*Containerd, error) {
	t.Helper()
	if opts.CNIConfDir == "" || opts.CNIBinDir == "" || opts.Crictl == "" {
		return nil, errors.New("containerdlab: Options.CNIConfDir, CNIBinDir and Crictl are required")
	}
	if opts.Bins == nil {
		bins, err := Binaries()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCannotRun, err)
		}
		opts.Bins = bins
	}
	if opts.Busybox == "" {
		bb, err := enginelab.StaticBusybox()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCannotRun, err)
		}
		opts.Busybox = bb
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	// Short: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "ctdlab-")
	if err != nil {
		return nil, fmt.Errorf("containerdlab: %w", err)
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = fmt.Sprintf("carve-lab-%d-%s", os.Getpid(), filepath.Base(dir))
	}
	c := &Containerd{opts: opts, host: host, dir: dir}
	t.Cleanup(func() {
		if err := c.cleanup(); err != nil {
			t.Errorf("containerdlab: cleanup: %v", err)
		}
	})
	if err := c.startHolder(ctx); err != nil {
		return nil, err
	}
	for name, data := range map[string]string{
		configName:    config(dir, opts),
		"crictl.yaml": fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%[1]s\ntimeout: 60\n", c.Socket()),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return nil, fmt.Errorf("containerdlab: %w", err)
		}
	}
	if err := c.startDaemon(ctx, false); err != nil {
		return nil, err
	}
	if err := c.importPause(ctx); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx, true); err != nil {
		return nil, err
	}
	return c, nil
}

// Socket is containerd's grpc socket (CRI and containerd's own API).
func (c *Containerd) Socket() string { return filepath.Join(c.dir, sockName) }

// Dir is the daemon's directory (config.toml, containerd.log, root, state).
func (c *Containerd) Dir() string { return c.dir }

// PID is the running containerd's process id.
func (c *Containerd) PID() int { return c.cmd.Process.Pid }

// startHolder starts the process that owns the private mount namespace,
// inside host's network namespace, and waits until its mounts are made.
func (c *Containerd) startHolder(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	// tmpfs over the machine's paths containerd 1.6 and libcni write to
	// regardless of the config: /run/containerd (shim sockets, under
	// PrivateMounts' /run) and /var/lib/cni (libcni's result cache).
	mnt, err := enginelab.HoldMountNamespace(wctx, c.host, c.dir, `mount -t tmpfs -o mode=0755 carve-lab /var/lib
mkdir -p /run/containerd /var/lib/cni`)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCannotRun, err)
	}
	c.mnt = mnt
	return nil
}

// startDaemon starts containerd in the holder's mount namespace and host's
// network namespace, appending to its log, and waits until its CRI answers.
func (c *Containerd) startDaemon(ctx context.Context, restart bool) error {
	log, err := os.OpenFile(filepath.Join(c.dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("containerdlab: %w", err)
	}
	defer log.Close()
	if restart {
		fmt.Fprintf(log, "--- containerdlab: restart after pid %d ---\n", c.cmd.Process.Pid)
	}
	c.cmd = exec.Command(c.opts.Bins["nsenter"], "--mount="+c.mnt.Path(), "--",
		c.opts.Bins["containerd"], "--config", filepath.Join(c.dir, configName))
	c.cmd.Dir = "/"
	c.cmd.Stdout, c.cmd.Stderr = log, log
	c.cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(c.opts.Bins["runc"])+":"+filepath.Dir(c.opts.Bins["containerd-shim-runc-v2"])+":/usr/sbin:/usr/bin:/sbin:/bin")
	if err := c.host.Start(c.cmd); err != nil {
		return fmt.Errorf("containerdlab: start containerd: %w", err)
	}
	waited := make(chan error, 1)
	c.waited = waited
	go func() { waited <- c.cmd.Wait() }()
	return c.waitReady(ctx, false)
}

// status is the part of `crictl info` waitReady reads.
type status struct {
	Status struct {
		Conditions []struct {
			Type    string `json:"type"`
			Status  bool   `json:"status"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

// waitReady waits until the CRI reports RuntimeReady, and NetworkReady too
// when network.
func (c *Containerd) waitReady(ctx context.Context, network bool) error {
	wctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	err := retry.Until(wctx, 100*time.Millisecond, func() error {
		select {
		case err := <-c.waited:
			c.waited <- err
			return retry.Permanent(fmt.Errorf("it exited (%v)", err))
		default:
		}
		pctx, pcancel := context.WithTimeout(wctx, 5*time.Second)
		defer pcancel()
		out, err := c.Crictl(pctx, "info")
		if err != nil {
			return err
		}
		var st status
		if err := json.Unmarshal(out, &st); err != nil {
			return fmt.Errorf("crictl info: %w", err)
		}
		for _, cond := range st.Status.Conditions {
			if (cond.Type == "RuntimeReady" || network && cond.Type == "NetworkReady") && !cond.Status {
				return fmt.Errorf("%s: %s %s", cond.Type, cond.Reason, cond.Message)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: %v: %s", ErrCannotRun, err, enginelab.DaemonError(filepath.Join(c.dir, logName)))
	}
	return nil
}

// importPause builds PauseImage and imports it into the CRI's namespace,
// unpacked for Snapshotter.
func (c *Containerd) importPause(ctx context.Context) error {
	layer, err := enginelab.BusyboxRootfs(c.opts.Busybox)
	if err != nil {
		return fmt.Errorf("containerdlab: %w", err)
	}
	archive, err := pauseArchive(layer)
	if err != nil {
		return fmt.Errorf("containerdlab: pause image: %w", err)
	}
	return c.importArchive(ctx, "pause", archive)
}

// importArchive imports an OCI image layout (a tar) into the CRI's
// namespace, unpacked for Snapshotter; name names its file under Dir.
func (c *Containerd) importArchive(ctx context.Context, name string, archive []byte) error {
	file := filepath.Join(c.dir, name+".tar")
	if err := os.WriteFile(file, archive, 0o644); err != nil {
		return fmt.Errorf("containerdlab: %w", err)
	}
	out, err := exec.CommandContext(ctx, c.opts.Bins["ctr"], "--address", c.Socket(), "--namespace", "k8s.io",
		"images", "import", "--snapshotter", Snapshotter, file).CombinedOutput()
	if err != nil {
		return fmt.Errorf("containerdlab: ctr images import %s: %w: %s", name, err, out)
	}
	return nil
}

// Crictl runs crictl against this containerd and returns its standard
// output; an error carries its standard error.
func (c *Containerd) Crictl(ctx context.Context, args ...string) ([]byte, error) {
	argv := append([]string{"--config", filepath.Join(c.dir, "crictl.yaml"),
		"--runtime-endpoint", "unix://" + c.Socket(), "--image-endpoint", "unix://" + c.Socket()}, args...)
	cmd := exec.CommandContext(ctx, c.opts.Crictl, argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Kill9 kills containerd with SIGKILL, as a crash would, and reaps it. Its
// shims and pods go on running.
func (c *Containerd) Kill9() error {
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("containerdlab: kill -9 containerd (pid %d): %w", c.cmd.Process.Pid, err)
	}
	err := <-c.waited
	c.waited <- err
	return nil
}

// Restart starts containerd again after Kill9, in the same mount and
// network namespaces with the same config, and waits until its CRI
// reports the runtime and its network ready.
func (c *Containerd) Restart(ctx context.Context) error {
	select {
	case <-c.waited:
	default:
		return fmt.Errorf("containerdlab: containerd (pid %d) still runs", c.cmd.Process.Pid)
	}
	if err := c.startDaemon(ctx, true); err != nil {
		return err
	}
	return c.waitReady(ctx, true)
}

// LogTail returns the end of containerd's log (for a failure).
func (c *Containerd) LogTail(max int) string {
	data, _ := os.ReadFile(filepath.Join(c.dir, logName))
	if len(data) > max {
		data = data[len(data)-max:]
	}
	return fmt.Sprintf("%s (tail):\n%s\n", logName, data)
}

// running reports whether the daemon was started and has not exited.
func (c *Containerd) running() bool {
	if c.cmd == nil {
		return false
	}
	select {
	case err := <-c.waited:
		c.waited <- err
		return false
	default:
		return true
	}
}

// cleanup removes the pods (their CNI DEL runs), stops containerd by PID
// (SIGTERM, SIGKILL after 30s), kills what is left in the mount namespace
// and below (shims, pods, the holder), and removes the cgroups and the
// directory. It returns what it could not undo.
func (c *Containerd) cleanup() error {
	var errs []error
	if c.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if _, err := c.Crictl(ctx, "rmp", "--all", "--force"); err != nil {
			errs = append(errs, err)
		}
		cancel()
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.waited:
		case <-time.After(30 * time.Second):
			errs = append(errs, fmt.Errorf("containerd (pid %d) ignored SIGTERM for 30s; killed it", c.cmd.Process.Pid))
			_ = c.cmd.Process.Kill()
			<-c.waited
		}
	}
	if c.mnt != nil {
		for _, pid := range c.mnt.Processes() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := c.mnt.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	// The mounts lived in the holder's mount namespace, gone with it.
	if err := enginelab.RemoveLeftovers(c.opts.CgroupParent, c.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
