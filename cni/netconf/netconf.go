// Package netconf writes the CNI network configurations the agent offers to
// container runtimes: <overlay>.conflist in the CNI configuration directory
// (the bridge plugin, with carve-ipam (package cni) as its IPAM, then
// portmap), and optionally <overlay>.conf in a directory of its own for the
// Mesos CNI isolator, which reads only single-plugin files with a top-level
// "type" (the same bridge plugin and IPAM, no chain). Both are written
// atomically, never rewritten when unchanged, and pruned when their overlay
// is gone. It is the agent's side of CNI and links nothing of the plugin or
// of libcni.
package netconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/carve-net/carve/api"
)

// CNIVersion is the spec version of the conflists carve writes: 1.1.0 is the
// first with GC and STATUS, which carve-ipam implements.
const CNIVersion = "1.1.0"

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

// ConflistPath is where WriteConflist puts an overlay's configuration.
func ConflistPath(dir, overlay string) string {
	return filepath.Join(dir, overlay+ConflistExt)
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
}

// The JSON shapes below fix the field order, so that equal inputs give equal
// bytes and an unchanged configuration is never rewritten.
type conflistJSON struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Plugins    []any  `json:"plugins"`
}

type bridgeJSON struct {
	Type        string   `json:"type"`
	Bridge      string   `json:"bridge"`
	IsGateway   bool     `json:"isGateway"`
	IPMasq      bool     `json:"ipMasq"`
	HairpinMode bool     `json:"hairpinMode"`
	MTU         int      `json:"mtu"`
	IPAM        ipamJSON `json:"ipam"`
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
	return nil
}

// bridge is the bridge plugin on m-<overlay> with carve-ipam as its IPAM,
// the same in the conflist and in the single-plugin file. isGateway is off:
// the agent puts a gateway address on the bridge for every block the bridge
// holds (its first sub-subnet, then each grown or granted block), and the
// bridge plugin with isGateway refuses, on every ADD, a bridge that already
// has an IPv4 address other than the result's gateway, so that no ADD
// could land past a bridge's first block. The container's default route
// via its block's gateway comes from carve-ipam's result.
func (c Conflist) bridge() bridgeJSON {
	sock := c.Socket
	if sock == "" {
		sock = DefaultSocket
	}
	return bridgeJSON{
		Type:        "bridge",
		Bridge:      MesosBridge(c.Overlay),
		IsGateway:   false,
		IPMasq:      false,
		HairpinMode: true,
		MTU:         c.MTU,
		IPAM: ipamJSON{
			Type:    PluginType,
			Network: c.Overlay,
			Bridge:  api.BridgeMesos,
			Socket:  sock,
		},
	}
}

// Bytes renders the conflist: the bridge plugin on m-<overlay> with carve-ipam
// as its IPAM, then portmap. The output is deterministic.
func (c Conflist) Bytes() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	doc := conflistJSON{
		CNIVersion: CNIVersion,
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

// WriteConflist writes <dir>/<overlay>.conflist for the overlay, atomically: a
// runtime that reads the directory at any moment sees the old file or the new
// one, never a partial one, also across a crash. dir is created if missing.
// A file that already holds
// the same bytes is left alone (no mtime change, which runtimes watching the
// directory would take as a new configuration). It reports whether it wrote.
func WriteConflist(dir, overlay string, mtu int, socket string) (bool, error) {
	data, err := Conflist{Overlay: overlay, MTU: mtu, Socket: socket}.Bytes()
	if err != nil {
		return false, err
	}
	return writeIfChanged(dir, ConflistPath(dir, overlay), data)
}

// WriteConf writes <dir>/<overlay>.conf, the single-plugin configuration of
// the Mesos CNI isolator (ConfBytes), as WriteConflist writes the conflist:
// atomically, only when it changed, creating dir. It reports whether it wrote.
func WriteConf(dir, overlay string, mtu int, socket string) (bool, error) {
	data, err := Conflist{Overlay: overlay, MTU: mtu, Socket: socket}.ConfBytes()
	if err != nil {
		return false, err
	}
	return writeIfChanged(dir, ConfPath(dir, overlay), data)
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
	if err := writeAtomic(dir, path, data); err != nil {
		return false, err
	}
	return true, nil
}

// writeAtomic writes data to path through a temporary file in the same
// directory, fsynced before the rename, and fsyncs the directory after it.
func writeAtomic(dir, path string, data []byte) (err error) {
	// The temporary name starts with a dot and ends in neither .conf,
	// .conflist nor .json, so no runtime ever loads it.
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("cni: create temporary file in %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("cni: write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("cni: chmod %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("cni: fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("cni: close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("cni: rename to %s: %w", path, err)
	}
	return syncDir(dir)
}

// syncDir makes a rename or removal in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("cni: open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cni: fsync %s: %w", dir, err)
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
	return removeIfCarve(dir, ConflistPath(dir, overlay))
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

// PruneConflists removes every carve conflist in dir whose overlay is not in
// keep, and the temporary files a crash left behind; an agent calls it on
// start, when it cannot know which overlays went away while it was down.
// Files that carve did not write are left alone. It returns the paths removed.
func PruneConflists(dir string, keep []string) ([]string, error) {
	return prune(dir, keep, ConflistExt)
}

// PruneConfs removes every carve single-plugin configuration in dir whose
// overlay is not in keep, and the temporary files a crash left behind, as
// PruneConflists does for the conflists.
func PruneConfs(dir string, keep []string) ([]string, error) {
	return prune(dir, keep, ConfExt)
}

// prune removes the carve files <overlay><ext> of dir whose overlay is not
// in keep, and the temporary files of WriteConflist or WriteConf for ext.
func prune(dir string, keep []string, ext string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cni: read %s: %w", dir, err)
	}
	kept := make(map[string]bool, len(keep))
	for _, k := range keep {
		kept[k] = true
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, name)
		if strings.HasPrefix(name, ".") && strings.Contains(name, ext+".tmp-") {
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("cni: remove %s: %w", path, err))
			}
			continue
		}
		overlay, ok := strings.CutSuffix(name, ext)
		if !ok || kept[overlay] {
			continue
		}
		ok, err := removeIfCarve(dir, path)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			removed = append(removed, path)
		}
	}
	sort.Strings(removed)
	return removed, errors.Join(errs...)
}
