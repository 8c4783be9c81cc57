package netconf

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Spec versions of the conflists carve writes. The file is the same in
// all three (cniVersion, name, and the plugins bridge with carve-ipam, then
// portmap: nothing in it is newer than 0.4.0); what differs is which
// runtimes and plugins accept it, and which commands they may send.
const (
	// LegacyCNIVersion is what libcni 0.7 and 0.8 (containerd 1.3 to 1.5,
	// Podman 2 and 3) and the reference plugins before 1.0 read: they know
	// no result version above 0.4.0, so a 1.0.0 conflist fails there
	// (unsupported CNI result version). ADD, DEL and CHECK; no STATUS, no GC.
	LegacyCNIVersion = "0.4.0"
	// BaseCNIVersion is what libcni 1.0 and 1.1 (containerd 1.6 and 1.7,
	// Podman 4's CNI backend) and Debian's plugins 1.1.1 read at most.
	BaseCNIVersion = "1.0.0"
	// LatestCNIVersion adds STATUS and GC, which carve-ipam implements;
	// containerd 2 calls STATUS, no runtime calls GC yet.
	LatestCNIVersion = "1.1.0"
)

// Versions are the spec versions carve writes conflists in, highest first.
func Versions() []string { return []string{LatestCNIVersion, BaseCNIVersion, LegacyCNIVersion} }

// ErrVersion marks a spec version carve does not write.
var ErrVersion = errors.New("unsupported CNI version")

// VersionHelp says in a line which runtimes read which version carve
// writes: the --cni-version help and the ErrVersion message.
func VersionHelp() string {
	return LegacyCNIVersion + " (libcni 0.7/0.8: containerd 1.3-1.5, Podman 2-3, plugins before 1.0; no STATUS or GC), " +
		BaseCNIVersion + " (libcni 1.0/1.1: containerd 1.6-1.7, Podman 4; not older runtimes), " +
		LatestCNIVersion + " (adds STATUS and GC; libcni 1.2 and later: containerd 2)"
}

// ValidVersion checks a --cni-version value: one of the versions carve
// writes conflists in.
func ValidVersion(v string) error {
	if !slices.Contains(Versions(), v) {
		return fmt.Errorf("%w %q: carve writes %s", ErrVersion, v, VersionHelp())
	}
	return nil
}

// ChainPlugins are the plugin binaries carve's conflist runs, in order.
func ChainPlugins() []string { return []string{"bridge", PluginType, "portmap"} }

// RuntimePlugins are the plugin binaries the runtimes run themselves,
// from the same plugin directory as the conflist's: containerd's CRI and
// CRI-O bring up every pod's lo with loopback (without it the first pod
// fails: failed to find plugin "loopback").
func RuntimePlugins() []string { return []string{"loopback"} }

// ReferencePlugins are the reference plugins a runtime's plugin directory
// needs beside carve-ipam: the conflist's and the runtimes' own.
func ReferencePlugins() []string {
	var out []string
	for _, p := range append(ChainPlugins(), RuntimePlugins()...) {
		if p != PluginType {
			out = append(out, p)
		}
	}
	return out
}

// Plugin is what the version probe learnt of one plugin of the chain.
type Plugin struct {
	// Type is the plugin's name; Path where it was found ("" if nowhere).
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
	// Versions are the spec versions it answered VERSION with.
	Versions []string `json:"versions,omitempty"`
	// Err says why the plugin could not be asked.
	Err string `json:"error,omitempty"`
}

// Runtime is a container engine found on the host whose CNI library bounds
// the spec versions it loads.
type Runtime struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Version string `json:"version"`
	// MaxCNI is the highest spec version its CNI library reads ("" when
	// carve knows no bound).
	MaxCNI string `json:"max_cni,omitempty"`
}

// VersionChoice is the spec version the agent writes its conflists in, and
// why.
type VersionChoice struct {
	Version string   `json:"version"`
	Plugins []Plugin `json:"plugins"`
	// RuntimePlugins are where RuntimePlugins were found (their versions
	// are not asked: the runtimes write their configuration).
	RuntimePlugins []Plugin  `json:"runtime_plugins,omitempty"`
	Runtimes       []Runtime `json:"runtimes,omitempty"`
	// Reason says in a sentence what decided it.
	Reason string `json:"reason"`
}

// Missing lists the plugins of the chain and the runtimes' found in none
// of the directories.
func (c VersionChoice) Missing() []string {
	var out []string
	for _, p := range append(slices.Clone(c.Plugins), c.RuntimePlugins...) {
		if p.Path == "" {
			out = append(out, p.Type)
		}
	}
	return out
}

// ChooseVersion picks the highest spec version carve writes (Versions)
// that every plugin of the chain (found in pluginDirs, first match wins as
// libcni searches) and every runtime on the host (runtimes, from
// FindRuntimes) reads. Whatever cannot be asked counts as reading
// BaseCNIVersion at most, so an unknown host gets the version every living
// consumer reads; LegacyCNIVersion is chosen only when a plugin or runtime
// is known to stop below BaseCNIVersion.
func ChooseVersion(ctx context.Context, pluginDirs []string, runtimes []Runtime) VersionChoice {
	c := VersionChoice{Version: LatestCNIVersion, Runtimes: runtimes}
	lower := func(to, why string) {
		if versionLess(to, c.Version) {
			c.Version, c.Reason = to, why
		}
	}
	for _, typ := range ChainPlugins() {
		p := probePlugin(ctx, pluginDirs, typ)
		c.Plugins = append(c.Plugins, p)
		switch {
		case p.Path == "":
			lower(BaseCNIVersion, fmt.Sprintf("plugin %s is in none of %s", typ, strings.Join(pluginDirs, ", ")))
		case p.Err != "":
			lower(BaseCNIVersion, fmt.Sprintf("plugin %s did not answer VERSION: %s", p.Path, p.Err))
		default:
			lower(readable(p.Versions), fmt.Sprintf("plugin %s supports up to %s", p.Path, highest(p.Versions)))
		}
	}
	for _, typ := range RuntimePlugins() {
		c.RuntimePlugins = append(c.RuntimePlugins, Plugin{Type: typ, Path: findPlugin(pluginDirs, typ)})
	}
	for _, r := range runtimes {
		if r.MaxCNI != "" {
			lower(atMost(r.MaxCNI), fmt.Sprintf("%s %s (%s) reads spec versions up to %s", r.Name, r.Version, r.Path, r.MaxCNI))
		}
	}
	if c.Reason == "" {
		c.Reason = fmt.Sprintf("every plugin of the chain and every runtime found supports %s", LatestCNIVersion)
	}
	return c
}

// readable is the highest version carve writes that a plugin supporting
// supported reads; LegacyCNIVersion, the lowest, when it reads none of
// them (Warnings then says the plugin cannot run carve's conflists).
func readable(supported []string) string {
	for _, v := range Versions() {
		if slices.Contains(supported, v) {
			return v
		}
	}
	return LegacyCNIVersion
}

// atMost is the highest version carve writes that is not above limit;
// LegacyCNIVersion, the lowest, when all are.
func atMost(limit string) string {
	for _, v := range Versions() {
		if !versionLess(limit, v) {
			return v
		}
	}
	return LegacyCNIVersion
}

// findPlugin is the path of typ in the first of dirs holding it as an
// executable file, as libcni searches; "" when none does.
func findPlugin(dirs []string, typ string) string {
	for _, d := range dirs {
		path := filepath.Join(d, typ)
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return path
		}
	}
	return ""
}

// probePlugin finds a plugin in dirs and asks it for its spec versions.
func probePlugin(ctx context.Context, dirs []string, typ string) Plugin {
	p := Plugin{Type: typ, Path: findPlugin(dirs, typ)}
	if p.Path == "" {
		return p
	}
	v, err := PluginVersions(ctx, p.Path)
	if err != nil {
		p.Err = err.Error()
	}
	p.Versions = v
	return p
}

// PluginVersions asks a CNI plugin binary which spec versions it supports
// (the CNI VERSION command).
func PluginVersions(ctx context.Context, path string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{"CNI_COMMAND=VERSION", "PATH=" + os.Getenv("PATH")}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"` + BaseCNIVersion + `"}`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s VERSION: %w: %s", path, err, strings.TrimSpace(stderr.String()))
	}
	var ans struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out, &ans); err != nil || len(ans.Supported) == 0 {
		return nil, fmt.Errorf("%s VERSION answered %q: want {\"supportedVersions\": [...]}", path, bytes.TrimSpace(out))
	}
	return ans.Supported, nil
}

// highest is the highest of spec versions (by number).
func highest(vs []string) string {
	best := ""
	for _, v := range vs {
		if best == "" || versionLess(best, v) {
			best = v
		}
	}
	return best
}

func versionLess(a, b string) bool {
	pa, pb := versionParts(a), versionParts(b)
	return slices.Compare(pa, pb) < 0
}

func versionParts(v string) []int {
	var out []int
	for _, f := range strings.Split(v, ".") {
		n, err := strconv.Atoi(f)
		if err != nil {
			break
		}
		out = append(out, n)
	}
	return out
}

// runtimeProbe is how FindRuntimes recognises one engine: its binary, the
// flag that prints its version, and the highest spec version its CNI
// library reads by its major and minor version ("" when not bounded below
// LatestCNIVersion).
type runtimeProbe struct {
	name, binary, flag string
	pattern            *regexp.Regexp
	maxCNI             func(major, minor int) string
}

func runtimeProbes() []runtimeProbe {
	return []runtimeProbe{
		// containerd 2.0 moved to libcni 1.2; 1.6 and 1.7 link libcni 1.1;
		// 1.3 to 1.5 link libcni 0.7 or 0.8, which know results up to 0.4.0.
		{"containerd", "containerd", "--version", regexp.MustCompile(`containerd\S*\s+\S+\s+v?(\d+)\.(\d+)\.(\d+)`), func(major, minor int) string {
			switch {
			case major >= 2:
				return ""
			case major == 1 && minor >= 6:
				return BaseCNIVersion
			default:
				return LegacyCNIVersion
			}
		}},
		// Podman 4's CNI backend links libcni 1.0 or 1.1, Podman 3's libcni
		// 0.8; Podman 5 keeps CNI only behind a build tag (netavark is its
		// backend: it does not read conflists at all).
		{"podman", "podman", "--version", regexp.MustCompile(`podman version (\d+)\.(\d+)\.(\d+)`), func(major, _ int) string {
			switch {
			case major >= 5:
				return ""
			case major == 4:
				return BaseCNIVersion
			default:
				return LegacyCNIVersion
			}
		}},
	}
}

// FindRuntimes looks up the container engines on PATH whose CNI library
// bounds the spec version (containerd, Podman) and reads their versions.
func FindRuntimes(ctx context.Context) []Runtime {
	var out []Runtime
	for _, p := range runtimeProbes() {
		path, err := exec.LookPath(p.binary)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		b, err := exec.CommandContext(cctx, path, p.flag).Output()
		cancel()
		if err != nil {
			continue
		}
		if r, ok := p.parse(path, string(b)); ok {
			out = append(out, r)
		}
	}
	return out
}

// parse reads an engine's version output.
func (p runtimeProbe) parse(path, out string) (Runtime, bool) {
	m := p.pattern.FindStringSubmatch(out)
	if m == nil {
		return Runtime{}, false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return Runtime{Name: p.name, Path: path, Version: m[1] + "." + m[2] + "." + m[3], MaxCNI: p.maxCNI(major, minor)}, true
}
