package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/internal/cli"
)

// runInstallCNI fills a CNI runtime's plugin directory with what carve's
// conflists and the runtimes need: carve-ipam (the binary beside this
// carve, as make build and the release put both in one directory, or the
// one in --from), and the reference plugins bridge, portmap and loopback
// (containerd's CRI runs loopback for every pod), each copied from the
// first directory of --plugins-from holding it unless the plugin
// directory has it already. A reference plugin found nowhere is named,
// with where it was looked for, and the command fails.
func runInstallCNI(args []string, out io.Writer) error {
	flags := cli.NewFlagSet("carve install-cni")
	binDir := flags.String("bin-dir", netconf.DefaultBinDir, "the runtime's CNI plugin directory (containerd's CRI bin_dir and Nomad's cni_path: /opt/cni/bin; Podman on Debian: /usr/lib/cni); created if missing")
	from := flags.String("from", "", "directory holding the carve-ipam to install (default: the directory of this carve binary)")
	pluginsFrom := flags.String("plugins-from", "", "directories, colon separated, to copy the reference plugins (bridge, portmap, loopback) from when --bin-dir lacks them, the first holding one wins (default: cni/ beside this carve binary, where make cni-plugins builds them, then "+netconf.DebianBinDir+", where Debian's containernetworking-plugins installs them)")
	if err := cli.Parse(flags, args); err != nil {
		return err
	}
	if !filepath.IsAbs(*binDir) {
		return fmt.Errorf("%w: --bin-dir %q: want an absolute path (runtimes look up plugins by absolute directory)", cli.ErrUsage, *binDir)
	}
	selfDir := ""
	if self, err := os.Executable(); err == nil {
		if resolved, err := filepath.EvalSymlinks(self); err == nil {
			self = resolved
		}
		selfDir = filepath.Dir(self)
	}
	dir := *from
	if dir == "" {
		if selfDir == "" {
			return errors.New("find this carve binary: name the directory of carve-ipam with --from")
		}
		dir = selfDir
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
	report(out, in, src)
	sources := referenceSources(*pluginsFrom, selfDir, *binDir)
	var missing []string
	for _, name := range netconf.ReferencePlugins() {
		dst := filepath.Join(*binDir, name)
		if isExecutable(dst) {
			fmt.Fprintf(out, "%s is there already (left as it is)\n", dst)
			continue
		}
		src := ""
		for _, d := range sources {
			if p := filepath.Join(d, name); isExecutable(p) {
				src = p
				break
			}
		}
		if src == "" {
			missing = append(missing, name)
			continue
		}
		in, err := netconf.InstallBinary(src, *binDir, name)
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("%w: run as root (the plugin directory is root's)", err)
		}
		if err != nil {
			return err
		}
		report(out, in, src)
	}
	if len(missing) > 0 {
		looked := "there is no other directory to copy from"
		if len(sources) > 0 {
			looked = "none of " + strings.Join(sources, ":") + " holds it"
		}
		return fmt.Errorf("CNI plugin %s is not in %s and %s: runtimes fail without it; install the reference plugins (apt-get install containernetworking-plugins puts them in %s; make cni-plugins builds them into bin/cni) or name their directory with --plugins-from",
			strings.Join(missing, ", "), *binDir, looked, netconf.DebianBinDir)
	}
	fmt.Fprintf(out, "runtimes find them when %s is their CNI plugin directory; the agent checks its --cni-bin-dir for them at start\n", *binDir)
	return nil
}

// report says what InstallBinary did.
func report(out io.Writer, in netconf.Install, src string) {
	switch {
	case in.Unchanged:
		fmt.Fprintf(out, "%s is already installed from %s (unchanged)\n", in.Path, src)
	case in.Replaced:
		fmt.Fprintf(out, "replaced %s with %s (mode 0755)\n", in.Path, src)
	default:
		fmt.Fprintf(out, "installed %s as %s (mode 0755)\n", src, in.Path)
	}
}

// referenceSources are the directories the reference plugins are copied
// from: --plugins-from, else cni/ beside carve and Debian's directory;
// never the plugin directory itself.
func referenceSources(flag, selfDir, binDir string) []string {
	var dirs []string
	if flag != "" {
		dirs = filepath.SplitList(flag)
	} else {
		if selfDir != "" {
			dirs = append(dirs, filepath.Join(selfDir, "cni"))
		}
		dirs = append(dirs, netconf.DebianBinDir)
	}
	return slices.DeleteFunc(dirs, func(d string) bool { return d == "" || filepath.Clean(d) == filepath.Clean(binDir) })
}

// isExecutable tells whether path is an executable regular file (what
// libcni runs).
func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}
