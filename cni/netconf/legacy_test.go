package netconf

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/version"
)

// libcni08Versions are the spec versions libcni 0.8 (containerd 1.4 and
// 1.5, Podman 3) knows: its version.All. It refuses the result of a
// conflist in any other version (unsupported CNI result version).
var libcni08Versions = version.PluginSupports("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0")

// TestLegacyConflist: the 0.4.0 conflist is one a runtime of libcni 0.8
// reads and the reference plugins of 0.8 and later run: its version is one
// libcni 0.8 and a 0.4.0 plugin know, it names no field of a later spec
// (1.1.0's cniVersions, 1.0.0's loadOnlyInlinedPlugins), and the plugins
// are the same as at 1.0.0. The conflists written at 1.0.0 and 1.1.0 are
// not readable there: that is the reason the version exists.
func TestLegacyConflist(t *testing.T) {
	data, err := Conflist{Overlay: "old", MTU: 1450, CNIVersion: LegacyCNIVersion}.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("libcni.ConfListFromBytes: %v\n%s", err, data)
	}
	if !slices.Contains(libcni08Versions.SupportedVersions(), list.CNIVersion) {
		t.Errorf("cniVersion %s is not one libcni 0.8 knows (%v)", list.CNIVersion, libcni08Versions.SupportedVersions())
	}
	// A plugin of the reference plugins 0.8/0.9 (spec 0.4.0) takes it:
	// libcni hands every plugin the list's version, which the plugin's skel
	// checks against what it supports; CHECK exists from 0.4.0.
	confVersion, err := (&version.ConfigDecoder{}).Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := (&version.Reconciler{}).Check(confVersion, libcni08Versions); err != nil {
		t.Errorf("a 0.4.0 plugin refuses the conflist: %v", err)
	}
	if gt, err := version.GreaterThanOrEqualTo(confVersion, "0.4.0"); err != nil || !gt {
		t.Errorf("cniVersion %s: CHECK needs 0.4.0 or later (%v)", confVersion, err)
	}
	for _, p := range list.Plugins {
		var own struct {
			CNIVersion *string `json:"cniVersion"`
		}
		if err := json.Unmarshal(p.Bytes, &own); err != nil || own.CNIVersion != nil {
			t.Errorf("plugin %s names its own cniVersion (%v): libcni 0.8 would pass the list's anyway", p.Network.Type, err)
		}
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for k := range doc {
		if !slices.Contains([]string{"cniVersion", "name", "plugins"}, k) {
			t.Errorf("top-level field %q is not in the 0.4.0 spec", k)
		}
	}
	// The same plugins as at 1.0.0: only the version differs.
	base, err := Conflist{Overlay: "old", MTU: 1450, CNIVersion: BaseCNIVersion}.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	var a, b struct {
		Plugins json.RawMessage `json:"plugins"`
	}
	if json.Unmarshal(data, &a) != nil || json.Unmarshal(base, &b) != nil || string(a.Plugins) != string(b.Plugins) {
		t.Errorf("the 0.4.0 plugins differ from 1.0.0's:\n%s\n%s", data, base)
	}
	// Why 0.4.0 exists: what carve wrote before is beyond libcni 0.8.
	for _, v := range []string{BaseCNIVersion, LatestCNIVersion} {
		if (&version.Reconciler{}).Check(v, libcni08Versions) == nil {
			t.Errorf("a 0.4.0 plugin would take %s", v)
		}
	}
}
