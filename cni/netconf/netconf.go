// Package netconf writes the CNI network configurations the agent offers to
// container runtimes: <overlay>.conflist in the CNI configuration directory
// (the bridge plugin, with carve-ipam (package cni) as its IPAM, then
// portmap), and optionally <overlay>.conf in a directory of its own for the
// Mesos CNI isolator, which reads only single-plugin files with a top-level
// "type" (the same bridge plugin and IPAM, no chain). Both are written
// atomically, never rewritten when unchanged, and pruned when their overlay
// is gone. It also chooses their spec version (version.go), says what on
// the host would keep a runtime from loading them (hostcheck.go), and
// installs carve-ipam where runtimes look for plugins (install.go): the
// host's side of CNI, for the agent and `carve install-cni`. It links
// nothing of the plugin or of libcni.
package netconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/atomicfile"
)

// PluginType is the IPAM plugin's binary name, the "type" in the ipam section.
const PluginType = "carve-ipam"

// DefaultSocket is where carve-ipam finds the agent when the configuration
// names no socket; it matches the agent's --socket default.
const DefaultSocket = "/run/carve/agent.sock"

// ConflistExt is the extension of the files carve writes; libcni loads
// .conf, .conflist and .json files, so temporary files must not end in any of them.
const ConflistExt = ".conflist"

// ConfExt is the extension of the single-plugin files written for the Mesos
// CNI isolator (WriteConf), which skips .conflist files.
const ConfExt = ".conf"

// ConfCNIVersion is the spec version of the single-plugin files: the Mesos
// CNI isolator of DC/OS speaks 0.3.x, and the bridge plugin and carve-ipam
// answer it in 0.3.1 results.
const ConfCNIVersion = "0.3.1"

// MesosBridge is the name of the bridge CNI containers of an overlay attach
// to; the agent's dataplane creates it with the gateway address.
func MesosBridge(overlay string) string { return "m-" + overlay }

// ConflistPath is where WriteConflist puts an overlay's configuration:
// <dir>/<prefix><overlay>.conflist. The prefix (e.g. "10-") orders carve's
// file among others for runtimes that load only the first one.
func ConflistPath(dir, prefix, overlay string) string {
	return filepath.Join(dir, prefix+overlay+ConflistExt)
}

// ConfPath is where WriteConf puts an overlay's single-plugin configuration.
func ConfPath(dir, overlay string) string {
	return filepath.Join(dir, overlay+ConfExt)
}

// Conflist describes one overlay's CNI network configuration.
type Conflist struct {
	// Overlay is the overlay (and CNI network) name.
	Overlay string
	// MTU is the overlay MTU (the network config's overlay_mtu), set on the
	// bridge and the container's veth.
	MTU int
	// Socket is the agent's IPAM socket; empty means DefaultSocket.
	Socket string
	// CNIVersion is the spec version the conflist declares (ValidVersion);
	// empty means BaseCNIVersion, which every runtime reads. The agent
	// chooses it once at start (ChooseVersion or --cni-version).
	CNIVersion string
	// FilePrefix starts the conflist's file name (ConflistPath); it is not
	// part of the file's content.
	FilePrefix string
}

// version is the spec version the conflist declares.
func (c Conflist) version() string {
	if c.CNIVersion == "" {
		return BaseCNIVersion
	}
	return c.CNIVersion
}

// The JSON shapes below fix the field order, so that equal inputs give equal
// bytes and an unchanged configuration is never rewritten.
type conflistJSON struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Plugins    []any  `json:"plugins"`
}

type bridgeJSON struct {
	Type        string `json:"type"`
	Bridge      string `json:"bridge"`
	IsGateway   bool   `json:"isGateway"`
	IPMasq      bool   `json:"ipMasq"`
	HairpinMode bool   `json:"hairpinMode"`
	MTU         int    `json:"mtu"`
	// Capabilities has runtimes pass requested addresses ("ips": the CRI's
	// and nerdctl's) as runtimeConfig, which bridge hands to carve-ipam
	// with the rest of its configuration.
	Capabilities map[string]bool `json:"capabilities,omitempty"`
	IPAM         ipamJSON        `json:"ipam"`
}

// confJSON is a single-plugin network configuration: the bridge plugin's
// fields at the top level, beside the version and the network's name.
type confJSON struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	bridgeJSON
}

type ipamJSON struct {
	Type    string `json:"type"`
	Network string `json:"network"`
	Bridge  string `json:"bridge"`
	Socket  string `json:"socket"`
}

type portmapJSON struct {
	Type         string          `json:"type"`
	Capabilities map[string]bool `json:"capabilities"`
}

// Validate checks what the kernel and the file system need: a name that is a
// safe file name and leaves "m-<overlay>" within the 15 bytes of an interface
// name, a positive MTU and an absolute socket path.
func (c Conflist) Validate() error {
	if err := api.ValidateOverlayName(c.Overlay); err != nil {
		return fmt.Errorf("cni: %w", err)
	}
	if c.MTU < 68 || c.MTU > 65535 {
		return fmt.Errorf("cni: overlay %s: mtu %d out of range [68, 65535]", c.Overlay, c.MTU)
	}
	if c.Socket != "" && !filepath.IsAbs(c.Socket) {
		return fmt.Errorf("cni: overlay %s: socket %q is not an absolute path", c.Overlay, c.Socket)
	}
	if err := ValidVersion(c.version()); err != nil {
		return fmt.Errorf("cni: overlay %s: %w", c.Overlay, err)
	}
	if c.FilePrefix != "" && (strings.ContainsAny(c.FilePrefix, "/\\\x00") || strings.HasPrefix(c.FilePrefix, ".")) {
		return fmt.Errorf("cni: file prefix %q: want a plain file name start (no slash, not starting with a dot)", c.FilePrefix)
	}
	return nil
}

// bridge is the bridge plugin on m-<overlay> with carve-ipam as its IPAM,
// the same in the conflist and in the single-plugin file. isGateway is off:
// the agent puts a gateway address on the bridge for every block the bridge
// holds (its first sub-subnet, then each grown or granted block), and the
// bridge plugin with isGateway refuses, on every ADD, a bridge that already
// has an IPv4 address other than the result's gateway, so that no ADD
// could land past a bridge's first block. The container's default route
// via its block's gateway comes from carve-ipam's result. (Podman's CNI
// backend reads isGateway false as an internal network, so `podman network
// inspect` says internal: true; that is its label, not something a field
// of the conflist could change without the refusal above.)
func (c Conflist) bridge() bridgeJSON {
	sock := c.Socket
	if sock == "" {
		sock = DefaultSocket
	}
	return bridgeJSON{
		Type:         "bridge",
		Bridge:       MesosBridge(c.Overlay),
		IsGateway:    false,
		IPMasq:       false,
		HairpinMode:  true,
		MTU:          c.MTU,
		Capabilities: map[string]bool{"ips": true},
		IPAM: ipamJSON{
			Type:    PluginType,
			Network: c.Overlay,
			Bridge:  api.BridgeMesos,
			Socket:  sock,
		},
	}
}

// Bytes renders the conflist: the bridge plugin on m-<overlay> with carve-ipam
// as its IPAM (and the "ips" capability), then portmap, in spec version CNIVersion. The output is
// deterministic.
func (c Conflist) Bytes() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	doc := conflistJSON{
		CNIVersion: c.version(),
		Name:       c.Overlay,
		Plugins: []any{
			c.bridge(),
			portmapJSON{Type: "portmap", Capabilities: map[string]bool{"portMappings": true}},
		},
	}
	return render(doc)
}

// ConfBytes renders the single-plugin configuration the Mesos CNI isolator
// reads: the conflist's bridge plugin, with carve-ipam as its IPAM, at the
// top level, in version ConfCNIVersion. There is no portmap: the isolator
// runs one plugin (DC/OS wraps it in its own port mapper). The output is
// deterministic.
func (c Conflist) ConfBytes() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return render(confJSON{CNIVersion: ConfCNIVersion, Name: c.Overlay, bridgeJSON: c.bridge()})
}

func render(doc any) ([]byte, error) {
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("cni: encode network configuration: %w", err)
	}
	return append(b, '\n'), nil
}

// WriteConflist writes c to ConflistPath(dir, c.FilePrefix, c.Overlay),
// atomically: a runtime that reads the directory at any moment sees the old
// file or the new one, never a partial one, also across a crash. dir is
// created if missing. A file that already holds the same bytes is left alone
// (no mtime change, which runtimes watching the directory would take as a
// new configuration). It reports whether it wrote.
func WriteConflist(dir string, c Conflist) (bool, error) {
	data, err := c.Bytes()
	if err != nil {
		return false, err
	}
	return writeIfChanged(dir, ConflistPath(dir, c.FilePrefix, c.Overlay), data)
}

// WriteConf writes <dir>/<overlay>.conf, the single-plugin configuration of
// the Mesos CNI isolator (ConfBytes), as WriteConflist writes the conflist:
// atomically, only when it changed, creating dir. It reports whether it wrote.
// Its version is always ConfCNIVersion and its name <overlay>.conf: c's
// CNIVersion and FilePrefix are the conflist's.
func WriteConf(dir string, c Conflist) (bool, error) {
	data, err := c.ConfBytes()
	if err != nil {
		return false, err
	}
	return writeIfChanged(dir, ConfPath(dir, c.Overlay), data)
}

// writeIfChanged writes data to path atomically unless the file already
// holds it; it reports whether it wrote.
func writeIfChanged(dir, path string, data []byte) (bool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("cni: create %s: %w", dir, err)
	}
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, data):
		return false, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("cni: read %s: %w", path, err)
	}
	if err := writeAtomic(path, data, 0o644); err != nil {
		return false, err
	}
	return true, nil
}

// writeAtomic writes data to path with mode, whole or not at all
// (atomicfile.Write: its temporary name is no runtime's to load).
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := atomicfile.Write(path, data, mode); err != nil {
		return fmt.Errorf("cni: %w", err)
	}
	return nil
}

// syncDir makes a rename or removal in dir durable.
func syncDir(dir string) error {
	if err := atomicfile.SyncDir(dir); err != nil {
		return fmt.Errorf("cni: %w", err)
	}
	return nil
}

// IsCarveConflist reports whether data is a network configuration that
// carve wrote: a list one of whose plugins uses carve-ipam, or a
// single-plugin configuration that uses it. Carve removes only those.
func IsCarveConflist(data []byte) bool {
	type ipam struct {
		IPAM struct {
			Type string `json:"type"`
		} `json:"ipam"`
	}
	var doc struct {
		ipam
		Plugins []ipam `json:"plugins"`
	}
	if json.Unmarshal(data, &doc) != nil {
		return false
	}
	if doc.IPAM.Type == PluginType {
		return true
	}
	for _, p := range doc.Plugins {
		if p.IPAM.Type == PluginType {
			return true
		}
	}
	return false
}

// RemoveConflist removes the overlay's configuration once the overlay went
// away, so that runtimes stop offering it. A missing file is not an error,
// and a file carve did not write (no carve-ipam in it) is left alone. It
// reports whether it removed the file.
func RemoveConflist(dir, overlay string) (bool, error) {
	if err := api.ValidateOverlayName(overlay); err != nil {
		return false, fmt.Errorf("cni: %w", err)
	}
	return removeIfCarve(dir, ConflistPath(dir, "", overlay))
}

// RemoveConf removes the overlay's single-plugin configuration, as
// RemoveConflist removes the conflist.
func RemoveConf(dir, overlay string) (bool, error) {
	if err := api.ValidateOverlayName(overlay); err != nil {
		return false, fmt.Errorf("cni: %w", err)
	}
	return removeIfCarve(dir, ConfPath(dir, overlay))
}

func removeIfCarve(dir, path string) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cni: read %s: %w", path, err)
	}
	if !IsCarveConflist(data) {
		return false, nil
	}
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("cni: remove %s: %w", path, err)
	}
	return true, syncDir(dir)
}

// PruneConflists removes every carve conflist in dir but
// <prefix><overlay>.conflist of the overlays in keep, and the temporary files
// a crash left behind; an agent calls it on start, when it cannot know which
// overlays went away while it was down. Carve's files are known by their
// content (IsCarveConflist), not their name, so that those written under an
// earlier --cni-conf-prefix go too. Files that carve did not write are left
// alone, whatever their name: other engines' (Podman's netavark.lock and
// network .json files, other plugins' conflists), directories, links and
// other temporary files (TempOf). It returns the paths removed.
func PruneConflists(dir, prefix string, keep []string) ([]string, error) {
	return prune(dir, prefix, keep, ConflistExt)
}

// PruneConfs removes every carve single-plugin configuration in dir but
// <overlay>.conf of the overlays in keep, and the temporary files a crash
// left behind, as PruneConflists does for the conflists.
func PruneConfs(dir string, keep []string) ([]string, error) {
	return prune(dir, "", keep, ConfExt)
}

// TempOf reports whether name is the name of a temporary file that
// WriteConflist or WriteConf (atomicfile.Write) creates for a file ending
// in ext, and the name of that file: "." + target + ".tmp-" + digits.
func TempOf(name, ext string) (target string, ok bool) {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return "", false
	}
	i := strings.LastIndex(rest, ".tmp-")
	if i < 0 {
		return "", false
	}
	target, digits := rest[:i], rest[i+len(".tmp-"):]
	if !strings.HasSuffix(target, ext) || target == ext || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return "", false
	}
	return target, true
}

// prune removes the carve files *<ext> of dir other than
// <prefix><overlay><ext> for an overlay in keep, and the temporary files of
// WriteConflist or WriteConf for ext that are carve's: those holding a
// carve configuration (a crash after the write, before the rename) and
// those of a file carve writes or wrote (its own name in keep, or a carve
// file of dir). A temporary file of the same shape that is neither, say
// another tool's being written, is left alone: carve removes only what it
// wrote.
func prune(dir, prefix string, keep []string, ext string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cni: read %s: %w", dir, err)
	}
	kept := make(map[string]bool, len(keep))
	for _, k := range keep {
		kept[prefix+k+ext] = true
	}
	carve := maps.Clone(kept) // the names of carve's files, kept or removed
	var removed, temps []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		if _, ok := TempOf(name, ext); ok {
			temps = append(temps, name)
			continue
		}
		if !strings.HasSuffix(name, ext) || kept[name] {
			continue
		}
		path := filepath.Join(dir, name)
		ok, err := removeIfCarve(dir, path)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			carve[name] = true
			removed = append(removed, path)
		}
	}
	for _, name := range temps {
		target, _ := TempOf(name, ext)
		path := filepath.Join(dir, name)
		if !carve[target] {
			data, err := os.ReadFile(path)
			if err != nil || !IsCarveConflist(data) {
				continue // not carve's, or gone meanwhile
			}
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cni: remove %s: %w", path, err))
		}
	}
	sort.Strings(removed)
	return removed, errors.Join(errs...)
}
