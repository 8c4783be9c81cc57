package netconf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/test/lab/testutil"
)

// pluginDir links the named plugin binaries into a directory of their own,
// as a runtime's plugin directory holds them.
func pluginDir(t *testing.T, plugins map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, path := range plugins {
		if err := os.Symlink(path, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// realPlugins returns the paths of the real plugins the tests ask:
// Debian's 1.1.1 (/usr/lib/cni), the reference plugins 1.9.1 built from
// go.mod (bin/cni, make cni-plugins) and carve-ipam (bin/carve-ipam).
func realPlugins(t *testing.T) (debian, reference, carveIPAM string) {
	t.Helper()
	top, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	root := strings.TrimSpace(string(top))
	debian, reference, carveIPAM = "/usr/lib/cni", filepath.Join(root, "bin", "cni"), filepath.Join(root, "bin", "carve-ipam")
	for _, p := range []string{filepath.Join(debian, "bridge"), filepath.Join(reference, "bridge"), carveIPAM} {
		_, err := os.Stat(p)
		testutil.Require(t, err == nil, "%s is missing: make build cni-plugins builds carve-ipam and the reference plugins; deploy/install-deps.sh installs Debian's containernetworking-plugins", p)
	}
	return debian, reference, carveIPAM
}

func TestChooseVersionAsksThePlugins(t *testing.T) {
	debian, reference, ipam := realPlugins(t)
	ctx := context.Background()
	containerd16 := Runtime{Name: "containerd", Path: "/usr/bin/containerd", Version: "1.6.20", MaxCNI: BaseCNIVersion}
	containerd2 := Runtime{Name: "containerd", Path: "/usr/bin/containerd", Version: "2.1.0"}
	containerd15 := Runtime{Name: "containerd", Path: "/usr/local/bin/containerd", Version: "1.5.11", MaxCNI: LegacyCNIVersion}
	oldBridge := fakePlugin(t, "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0")
	for _, tc := range []struct {
		name     string
		plugins  map[string]string
		runtimes []Runtime
		want     string
		reason   string
	}{
		{"Debian's plugins 1.1.1", map[string]string{"bridge": debian + "/bridge", "portmap": debian + "/portmap", PluginType: ipam}, nil,
			BaseCNIVersion, "supports up to 1.0.0"},
		{"reference plugins 1.9.1", map[string]string{"bridge": reference + "/bridge", "portmap": reference + "/portmap", PluginType: ipam}, nil,
			LatestCNIVersion, "every plugin"},
		{"reference plugins under containerd 2", map[string]string{"bridge": reference + "/bridge", "portmap": reference + "/portmap", PluginType: ipam}, []Runtime{containerd2},
			LatestCNIVersion, "every plugin"},
		{"reference plugins under containerd 1.6", map[string]string{"bridge": reference + "/bridge", "portmap": reference + "/portmap", PluginType: ipam}, []Runtime{containerd16},
			BaseCNIVersion, "containerd 1.6.20"},
		{"carve-ipam not installed", map[string]string{"bridge": reference + "/bridge", "portmap": reference + "/portmap"}, nil,
			BaseCNIVersion, "plugin carve-ipam is in none of"},
		{"a plugin that is not one", map[string]string{"bridge": "/bin/true", "portmap": reference + "/portmap", PluginType: ipam}, nil,
			BaseCNIVersion, "did not answer VERSION"},
		{"reference plugins under containerd 1.5", map[string]string{"bridge": reference + "/bridge", "portmap": reference + "/portmap", PluginType: ipam}, []Runtime{containerd15},
			LegacyCNIVersion, "containerd 1.5.11"},
		{"a bridge of plugins 0.9", map[string]string{"bridge": oldBridge, "portmap": reference + "/portmap", PluginType: ipam}, nil,
			LegacyCNIVersion, "supports up to 0.4.0"},
		{"containerd 1.6 and 1.5 on one host", map[string]string{"bridge": reference + "/bridge", "portmap": reference + "/portmap", PluginType: ipam}, []Runtime{containerd16, containerd15},
			LegacyCNIVersion, "containerd 1.5.11"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := pluginDir(t, tc.plugins)
			c := ChooseVersion(ctx, []string{dir}, tc.runtimes)
			if c.Version != tc.want || !strings.Contains(c.Reason, tc.reason) {
				t.Errorf("chose %s (%s), want %s with a reason naming %q", c.Version, c.Reason, tc.want, tc.reason)
			}
			if err := ValidVersion(c.Version); err != nil {
				t.Error(err)
			}
		})
	}
}

// fakePlugin is a plugin binary that answers VERSION with versions, as the
// reference plugins before 1.0 (0.8, 0.9) answer it.
func fakePlugin(t *testing.T, versions ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "plugin")
	script := fmt.Sprintf("#!/bin/sh\necho '{\"cniVersion\":\"0.4.0\",\"supportedVersions\":[\"%s\"]}'\n", strings.Join(versions, `","`))
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// The first directory that holds a plugin is the one asked, as libcni
// searches its path.
func TestChooseVersionFirstDirectoryWins(t *testing.T) {
	debian, reference, ipam := realPlugins(t)
	old := pluginDir(t, map[string]string{"bridge": debian + "/bridge"})
	cur := pluginDir(t, map[string]string{"bridge": reference + "/bridge", "portmap": reference + "/portmap", PluginType: ipam, "loopback": reference + "/loopback"})
	c := ChooseVersion(context.Background(), []string{old, cur}, nil)
	if c.Version != BaseCNIVersion || c.Plugins[0].Path != filepath.Join(old, "bridge") {
		t.Errorf("chose %s with bridge %s, want %s with the first directory's bridge", c.Version, c.Plugins[0].Path, BaseCNIVersion)
	}
	if got := c.Missing(); len(got) != 0 {
		t.Errorf("missing %v", got)
	}
}

// The runtimes' own plugin (loopback, which containerd's CRI runs for
// every pod) is looked for in the same directories; its absence is
// Missing, and its version does not bound the conflists'.
func TestChooseVersionLooksForLoopback(t *testing.T) {
	_, reference, ipam := realPlugins(t)
	chain := map[string]string{"bridge": reference + "/bridge", "portmap": reference + "/portmap", PluginType: ipam}
	without := pluginDir(t, chain)
	c := ChooseVersion(context.Background(), []string{without}, nil)
	if got := c.Missing(); !slices.Equal(got, []string{"loopback"}) || c.Version != LatestCNIVersion {
		t.Errorf("without loopback: missing %v, version %s; want [loopback], %s", got, c.Version, LatestCNIVersion)
	}
	withDir := pluginDir(t, map[string]string{"loopback": reference + "/loopback"})
	c = ChooseVersion(context.Background(), []string{without, withDir}, nil)
	if got := c.Missing(); len(got) != 0 || len(c.RuntimePlugins) != 1 || c.RuntimePlugins[0].Path != filepath.Join(withDir, "loopback") {
		t.Errorf("with loopback in the second directory: missing %v, runtime plugins %+v", got, c.RuntimePlugins)
	}
}

func TestRuntimeVersions(t *testing.T) {
	probes := runtimeProbes()
	for _, tc := range []struct {
		probe int
		out   string
		want  Runtime
	}{
		{0, "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n", Runtime{Name: "containerd", Version: "1.6.20", MaxCNI: BaseCNIVersion}},
		{0, "containerd github.com/containerd/containerd v1.7.24 61f9fd88f79f081d64d6fa3bb1a0dc71ec870523\n", Runtime{Name: "containerd", Version: "1.7.24", MaxCNI: BaseCNIVersion}},
		{0, "containerd github.com/containerd/containerd/v2 v2.0.5 fb4c30d4ede3531652d86197bf3fc9515e5276d9\n", Runtime{Name: "containerd", Version: "2.0.5"}},
		{1, "podman version 4.3.1\n", Runtime{Name: "podman", Version: "4.3.1", MaxCNI: BaseCNIVersion}},
		{1, "podman version 5.4.0\n", Runtime{Name: "podman", Version: "5.4.0"}},
		// libcni 0.8 knows no result version above 0.4.0.
		{0, "containerd containerd.io 1.5.11 3df54a852345ae127d1fa3092b95168e4a88e2f8\n", Runtime{Name: "containerd", Version: "1.5.11", MaxCNI: LegacyCNIVersion}},
		{0, "containerd github.com/containerd/containerd v1.4.13 9cc61520f4cd876b86e77edfeb88fbcd536d1f9d\n", Runtime{Name: "containerd", Version: "1.4.13", MaxCNI: LegacyCNIVersion}},
		{1, "podman version 3.4.4\n", Runtime{Name: "podman", Version: "3.4.4", MaxCNI: LegacyCNIVersion}},
	} {
		got, ok := probes[tc.probe].parse("", tc.out)
		if !ok || got != tc.want {
			t.Errorf("%q: got %+v (%v), want %+v", tc.out, got, ok, tc.want)
		}
	}
	if _, ok := probes[0].parse("", "garbage"); ok {
		t.Error("garbage parsed as a containerd version")
	}
}

// The engines installed on this machine (Debian's containerd and Podman)
// are found and bound the version to 1.0.0.
func TestFindRuntimesOnThisHost(t *testing.T) {
	_, errC := exec.LookPath("containerd")
	_, errP := exec.LookPath("podman")
	testutil.Require(t, errC == nil && errP == nil, "containerd and podman are not installed: deploy/install-deps.sh installs Debian's packages")
	rs := FindRuntimes(context.Background())
	names := []string{}
	for _, r := range rs {
		names = append(names, r.Name)
		if r.MaxCNI != BaseCNIVersion {
			t.Errorf("%s %s: bound %q, want %s (Debian bookworm's engines link libcni 1.1)", r.Name, r.Version, r.MaxCNI, BaseCNIVersion)
		}
	}
	if !slices.Contains(names, "containerd") || !slices.Contains(names, "podman") {
		t.Errorf("found %v, want containerd and podman", names)
	}
}

func TestValidVersion(t *testing.T) {
	for _, v := range []string{"0.3.1", "1.2.0", "", "latest"} {
		err := ValidVersion(v)
		if !errors.Is(err, ErrVersion) {
			t.Errorf("ValidVersion(%q) = %v, want ErrVersion", v, err)
			continue
		}
		// The refusal says which runtimes read which version.
		for _, want := range []string{"0.4.0 (libcni 0.7/0.8: containerd 1.3-1.5", "1.0.0 (libcni 1.0/1.1: containerd 1.6-1.7, Podman 4", "1.1.0 (adds STATUS and GC"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("ValidVersion(%q) = %q, want it to say %q", v, err, want)
			}
		}
	}
	for _, v := range []string{LegacyCNIVersion, BaseCNIVersion, LatestCNIVersion} {
		if err := ValidVersion(v); err != nil {
			t.Errorf("ValidVersion(%q) = %v", v, err)
		}
	}
}
