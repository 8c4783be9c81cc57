package containerdlab

import (
	"fmt"
	"path/filepath"
)

// Paths under a Containerd's directory.
const (
	sockName    = "c.sock"
	configName  = "config.toml"
	logName     = "containerd.log"
	rootName    = "root"
	stateName   = "state"
	podsDirName = "pods"
)

// config is containerd's config.toml for a lab daemon under dir. Every path
// it writes is under dir (root, state, sockets; the CRI plugin's netns
// mounts under its state), except what containerd 1.6 fixes regardless of
// its config (the shims' sockets under /run/containerd/s, libcni's cache
// under /var/lib/cni), which the private mount namespace covers with
// tmpfs. The plugins that would write elsewhere are disabled: opt (it
// creates /opt/containerd) and the snapshotters this lab does not use.
func config(dir string, opts Options) string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # Each pod's network namespace is bind-mounted under state, not under
  # the machine's /var/run/netns.
  netns_mounts_under_state_dir = true
  # No profile loaded into the machine's AppArmor (a machine-wide change).
  disable_apparmor = true
  # cgroupfs (the lab's parent cgroup per pod), not systemd's.
  systemd_cgroup = false
  enable_selinux = false
  # The pause container asks for oom_score_adj -998, which a process without
  # CAP_SYS_RESOURCE (this sandbox, nested and rootless setups) may not set:
  # runc fails with "failed to update /proc/self/oom_score_adj: Permission
  # denied". Restricted, it gets no less than containerd's own.
  restrict_oom_score_adj = true
  # The streaming server (exec, attach) on the lab host's loopback.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    # Only the first file of conf_dir in lexical order, as kubelets' nodes run.
    max_conf_num = 1
    conf_template = ""

  [plugins."io.containerd.grpc.v1.cri".containerd]
    # native: plain copies, on any file system (overlayfs on an overlay root
    # or in a nested sandbox is refused).
    snapshotter = %q
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`, filepath.Join(dir, rootName), filepath.Join(dir, stateName),
		filepath.Join(dir, sockName), filepath.Join(dir, sockName+".ttrpc"),
		PauseImage, opts.CNIBinDir, opts.CNIConfDir, Snapshotter)
}
