package netconf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Where the engines look for CNI configurations and plugins by default (see
// docs/operations.md, "CNI runtimes").
const (
	// DefaultConfDir is containerd's CRI conf_dir, CRI-O's and Podman's
	// network_config_dir.
	DefaultConfDir = "/etc/cni/net.d"
	// NomadConfDir is Nomad's cni_config_dir.
	NomadConfDir = "/opt/cni/config"
	// DefaultBinDir is containerd's CRI bin_dir, Nomad's cni_path and
	// go-cni's default.
	DefaultBinDir = "/opt/cni/bin"
	// DebianBinDir is where Debian's containernetworking-plugins installs,
	// the first of Podman's cni_plugin_dirs.
	DebianBinDir = "/usr/lib/cni"
)

// DefaultBinDirs is the agent's --cni-bin-dir default: where runtimes look
// for plugins, as a CNI_PATH.
func DefaultBinDirs() []string { return []string{DefaultBinDir, DebianBinDir} }

// Warnings says, one sentence each with the fix, why a runtime on this host
// may fail to load the conflists written in version into confDir: a plugin of
// the chain in none of the plugin directories, not answering VERSION or
// older than every version carve writes, a version some plugin or runtime
// does not read (a --cni-version override; choice is what detection found),
// a directory no runtime reads by default. The agent logs them once at start.
func Warnings(choice VersionChoice, version, confDir string, binDirs []string) []string {
	var out []string
	dirs := strings.Join(binDirs, ":")
	if dirs == "" {
		dirs = "(no --cni-bin-dir)"
	}
	first := DefaultBinDir
	if len(binDirs) > 0 {
		first = binDirs[0]
	}
	for _, p := range choice.Plugins {
		switch {
		case p.Path == "" && p.Type == PluginType:
			out = append(out, fmt.Sprintf("CNI plugin %s is in none of %s: runtimes cannot run carve's conflists; run `carve install-cni --bin-dir %s`", p.Type, dirs, first))
		case p.Path == "":
			out = append(out, fmt.Sprintf("CNI plugin %s is in none of %s: runtimes cannot run carve's conflists; %s", p.Type, dirs, referenceFix(first)))
		case p.Err != "":
			out = append(out, fmt.Sprintf("CNI plugin %s did not answer VERSION (%s): runtimes may fail to run it; reinstall it", p.Path, p.Err))
		case versionLess(highest(p.Versions), LegacyCNIVersion):
			out = append(out, fmt.Sprintf("CNI plugin %s supports up to %s, below every version carve writes: ADDs will fail; replace it with the reference plugins 0.8 or later, which read %s", p.Path, highest(p.Versions), LegacyCNIVersion))
		case versionLess(highest(p.Versions), version):
			out = append(out, fmt.Sprintf("--cni-version %s, but CNI plugin %s supports up to %s: ADDs will fail; use --cni-version auto or %s", version, p.Path, highest(p.Versions), readable(p.Versions)))
		}
	}
	for _, p := range choice.RuntimePlugins {
		if p.Path == "" {
			out = append(out, fmt.Sprintf("CNI plugin %s is in none of %s: containerd's CRI and CRI-O run it for every pod and fail without it (failed to find plugin %q); %s", p.Type, dirs, p.Type, referenceFix(first)))
		}
	}
	for _, r := range choice.Runtimes {
		if r.MaxCNI != "" && versionLess(r.MaxCNI, version) {
			out = append(out, fmt.Sprintf("--cni-version %s, but %s %s (%s) reads spec versions up to %s: it will not load carve's conflists; use --cni-version auto or %s", version, r.Name, r.Version, r.Path, r.MaxCNI, atMost(r.MaxCNI)))
		}
	}
	if c := filepath.Clean(confDir); c != DefaultConfDir && c != NomadConfDir {
		out = append(out, fmt.Sprintf("--cni-conf-dir %s is read by no runtime by default (containerd, CRI-O and Podman read %s, Nomad %s): point the runtime's CNI configuration directory at it", confDir, DefaultConfDir, NomadConfDir))
	}
	return out
}

// referenceFix says how a missing reference plugin gets into dir.
func referenceFix(dir string) string {
	return fmt.Sprintf("run `carve install-cni --bin-dir %s` (it copies the reference plugins from %s, where `apt-get install containernetworking-plugins` puts them, or from --plugins-from)", dir, DebianBinDir)
}

// configExts are the extensions libcni loads from a configuration directory.
var configExts = []string{".conf", ".conflist", ".json"}

// FirstConfig is the file of dir that a runtime loading only the first
// configuration in lexical order (containerd's CRI with max_conf_num = 1,
// CRI-O) uses, and whether carve wrote it; "" when dir holds none.
func FirstConfig(dir string) (name string, carve bool, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("cni: read %s: %w", dir, err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && slices.Contains(configExts, filepath.Ext(e.Name())) {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return "", false, nil
	}
	sort.Strings(names)
	data, err := os.ReadFile(filepath.Join(dir, names[0]))
	if err != nil {
		return names[0], false, fmt.Errorf("cni: read %s: %w", filepath.Join(dir, names[0]), err)
	}
	return names[0], IsCarveConflist(data), nil
}
