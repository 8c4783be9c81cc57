package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/internal/cli"
)

// runInstallCNI installs carve-ipam into a CNI runtime's plugin directory:
// the binary beside this carve (make build and the release put both in
// one directory), or the one in --from.
func runInstallCNI(args []string, out io.Writer) error {
	flags := cli.NewFlagSet("carve install-cni")
	binDir := flags.String("bin-dir", netconf.DefaultBinDir, "the runtime's CNI plugin directory (containerd's CRI bin_dir and Nomad's cni_path: /opt/cni/bin; Podman on Debian: /usr/lib/cni); created if missing")
	from := flags.String("from", "", "directory holding the carve-ipam to install (default: the directory of this carve binary)")
	if err := cli.Parse(flags, args); err != nil {
		return err
	}
	if !filepath.IsAbs(*binDir) {
		return fmt.Errorf("%w: --bin-dir %q: want an absolute path (runtimes look up plugins by absolute directory)", cli.ErrUsage, *binDir)
	}
	dir := *from
	if dir == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this carve binary: %w (name the directory of carve-ipam with --from)", err)
		}
		if resolved, err := filepath.EvalSymlinks(self); err == nil {
			self = resolved
		}
		dir = filepath.Dir(self)
	}
	src := filepath.Join(dir, netconf.PluginType)
	in, err := netconf.InstallPlugin(src, *binDir)
	switch {
	case errors.Is(err, netconf.ErrNoPlugin):
		return fmt.Errorf("%w: build it (make build writes bin/carve-ipam beside bin/carve) or name its directory with --from", err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: run as root (the plugin directory is root's)", err)
	case err != nil:
		return err
	}
	switch {
	case in.Unchanged:
		fmt.Fprintf(out, "%s is already installed from %s (unchanged)\n", in.Path, src)
	case in.Replaced:
		fmt.Fprintf(out, "replaced %s with %s (mode 0755)\n", in.Path, src)
	default:
		fmt.Fprintf(out, "installed %s as %s (mode 0755)\n", src, in.Path)
	}
	fmt.Fprintf(out, "runtimes find it when %s is their CNI plugin directory; the agent checks its --cni-bin-dir for it at start\n", *binDir)
	return nil
}
