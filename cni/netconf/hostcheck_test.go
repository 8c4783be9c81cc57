package netconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWarnings: each way a runtime could fail to load carve's conflists is
// one warning naming its fix, and a host where everything fits gets none.
func TestWarnings(t *testing.T) {
	all := func(versions ...string) []Plugin {
		var ps []Plugin
		for _, typ := range ChainPlugins() {
			ps = append(ps, Plugin{Type: typ, Path: "/opt/cni/bin/" + typ, Versions: versions})
		}
		return ps
	}
	latest := all(BaseCNIVersion, LatestCNIVersion)
	loopback := []Plugin{{Type: "loopback", Path: "/opt/cni/bin/loopback"}}
	containerd16 := Runtime{Name: "containerd", Path: "/usr/bin/containerd", Version: "1.6.20", MaxCNI: BaseCNIVersion}
	containerd15 := Runtime{Name: "containerd", Path: "/usr/bin/containerd", Version: "1.5.11", MaxCNI: LegacyCNIVersion}
	for _, tc := range []struct {
		name    string
		choice  VersionChoice
		version string
		confDir string
		want    []string // a fragment of each warning, in order
	}{
		{"all fine", VersionChoice{Plugins: latest, RuntimePlugins: loopback}, LatestCNIVersion, DefaultConfDir, nil},
		{"loopback missing", VersionChoice{Plugins: latest, RuntimePlugins: []Plugin{{Type: "loopback"}}}, BaseCNIVersion, DefaultConfDir,
			[]string{`CNI plugin loopback is in none of /opt/cni/bin:/usr/lib/cni: containerd's CRI and CRI-O run it for every pod and fail without it (failed to find plugin "loopback"); run ` + "`carve install-cni --bin-dir /opt/cni/bin`"}},
		{"Nomad's directory", VersionChoice{Plugins: latest}, BaseCNIVersion, NomadConfDir + "/", nil},
		{"carve-ipam missing", VersionChoice{Plugins: []Plugin{latest[0], {Type: PluginType}, latest[2]}}, BaseCNIVersion, DefaultConfDir,
			[]string{"carve install-cni --bin-dir /opt/cni/bin"}},
		{"bridge missing", VersionChoice{Plugins: []Plugin{{Type: "bridge"}, latest[1], latest[2]}}, BaseCNIVersion, DefaultConfDir,
			[]string{"CNI plugin bridge is in none of /opt/cni/bin:/usr/lib/cni: runtimes cannot run carve's conflists; run `carve install-cni --bin-dir /opt/cni/bin`"}},
		{"plugin broken", VersionChoice{Plugins: []Plugin{latest[0], latest[1], {Type: "portmap", Path: "/x/portmap", Err: "exit 1"}}}, BaseCNIVersion, DefaultConfDir,
			[]string{"/x/portmap did not answer VERSION"}},
		{"forced 1.1.0 over old plugins", VersionChoice{Plugins: all(BaseCNIVersion)}, LatestCNIVersion, DefaultConfDir,
			[]string{"bridge supports up to 1.0.0", "carve-ipam supports up to 1.0.0", "portmap supports up to 1.0.0"}},
		{"forced 1.1.0 over containerd 1.6", VersionChoice{Plugins: latest, Runtimes: []Runtime{containerd16}}, LatestCNIVersion, DefaultConfDir,
			[]string{"containerd 1.6.20 (/usr/bin/containerd) reads spec versions up to 1.0.0"}},
		{"containerd 1.6 at 1.0.0", VersionChoice{Plugins: latest, Runtimes: []Runtime{containerd16}}, BaseCNIVersion, DefaultConfDir, nil},
		{"forced 1.0.0 over containerd 1.5", VersionChoice{Plugins: latest, Runtimes: []Runtime{containerd15}}, BaseCNIVersion, DefaultConfDir,
			[]string{"containerd 1.5.11 (/usr/bin/containerd) reads spec versions up to 0.4.0: it will not load carve's conflists; use --cni-version auto or 0.4.0"}},
		{"plugins older than 0.4.0", VersionChoice{Plugins: []Plugin{{Type: "bridge", Path: "/opt/cni/bin/bridge", Versions: []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1"}}, latest[1], latest[2]}}, LegacyCNIVersion, DefaultConfDir,
			[]string{"CNI plugin /opt/cni/bin/bridge supports up to 0.3.1, below every version carve writes: ADDs will fail; replace it with the reference plugins 0.8 or later"}},
		{"containerd 1.5 at 0.4.0", VersionChoice{Plugins: latest, Runtimes: []Runtime{containerd15, containerd16}}, LegacyCNIVersion, DefaultConfDir, nil},
		{"forced 1.0.0 over plugins 0.9", VersionChoice{Plugins: all("0.3.1", LegacyCNIVersion)}, BaseCNIVersion, DefaultConfDir,
			[]string{"bridge supports up to 0.4.0: ADDs will fail; use --cni-version auto or 0.4.0", "carve-ipam supports up to 0.4.0", "portmap supports up to 0.4.0"}},
		{"a directory of its own", VersionChoice{Plugins: latest}, BaseCNIVersion, "/srv/cni",
			[]string{"--cni-conf-dir /srv/cni is read by no runtime"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Warnings(tc.choice, tc.version, tc.confDir, DefaultBinDirs())
			if len(got) != len(tc.want) {
				t.Fatalf("warnings:\n%s\nwant %d: %q", strings.Join(got, "\n"), len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %d = %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}

// TestFirstConfig finds the file a runtime loading only the first
// configuration uses, by libcni's extensions in lexical order.
func TestFirstConfig(t *testing.T) {
	carve, err := Conflist{Overlay: "carve", MTU: 1420}.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	foreign := []byte(`{"cniVersion":"1.0.0","name":"f","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`)
	for _, tc := range []struct {
		name      string
		files     map[string][]byte
		wantName  string
		wantCarve bool
	}{
		{"empty", nil, "", false},
		{"carve's only", map[string][]byte{"carve.conflist": carve, "README": foreign, ".x.conflist.tmp-1": foreign}, "carve.conflist", true},
		{"a foreign file first", map[string][]byte{"carve.conflist": carve, "87-podman.conflist": foreign}, "87-podman.conflist", false},
		{"a prefix puts carve's first", map[string][]byte{"10-carve.conflist": carve, "87-podman.json": foreign}, "10-carve.conflist", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			name, isCarve, err := FirstConfig(dir)
			if err != nil || name != tc.wantName || isCarve != tc.wantCarve {
				t.Errorf("FirstConfig = %q, %v, %v; want %q, %v", name, isCarve, err, tc.wantName, tc.wantCarve)
			}
		})
	}
	if name, _, err := FirstConfig(filepath.Join(t.TempDir(), "missing")); err != nil || name != "" {
		t.Errorf("FirstConfig(missing dir) = %q, %v", name, err)
	}
}
