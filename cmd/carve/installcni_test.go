package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-net/carve/internal/cli"
)

// fakePlugins writes executable stand-ins for names into a new directory.
func fakePlugins(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n# "+n+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestInstallCNI: carve install-cni copies carve-ipam and the reference
// plugins the conflist and the runtimes need (bridge, portmap, loopback)
// into the plugin directory, says what it did, and fails with exit 1 or 2
// and a message naming the fix when it cannot.
func TestInstallCNI(t *testing.T) {
	from := fakePlugins(t, "carve-ipam")
	refs := fakePlugins(t, "bridge", "portmap", "loopback")
	noLoopback := fakePlugins(t, "bridge", "portmap")
	bin := filepath.Join(t.TempDir(), "bin")
	bin2 := filepath.Join(t.TempDir(), "bin")
	bin3 := filepath.Join(t.TempDir(), "bin")
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		want     []string
	}{
		{"install", []string{"--bin-dir", bin, "--from", from, "--plugins-from", refs}, 0, []string{
			"installed " + filepath.Join(from, "carve-ipam") + " as " + filepath.Join(bin, "carve-ipam"),
			"installed " + filepath.Join(refs, "bridge") + " as " + filepath.Join(bin, "bridge"),
			"installed " + filepath.Join(refs, "portmap") + " as " + filepath.Join(bin, "portmap"),
			"installed " + filepath.Join(refs, "loopback") + " as " + filepath.Join(bin, "loopback"),
		}},
		{"again", []string{"--bin-dir", bin, "--from", from, "--plugins-from", refs}, 0, []string{
			"already installed", filepath.Join(bin, "loopback") + " is there already (left as it is)",
		}},
		{"the runtime's own plugin nowhere", []string{"--bin-dir", bin2, "--from", from, "--plugins-from", noLoopback}, 1, []string{
			"CNI plugin loopback is not in " + bin2 + " and none of " + noLoopback + " holds it", "apt-get install containernetworking-plugins",
		}},
		{"copying from the plugin directory itself", []string{"--bin-dir", bin3, "--from", from, "--plugins-from", bin3}, 1, []string{
			"CNI plugin bridge, portmap, loopback is not in " + bin3 + " and there is no other directory to copy from",
		}},
		{"no plugin", []string{"--bin-dir", bin, "--from", t.TempDir()}, 1, []string{"make build writes bin/carve-ipam"}},
		{"relative dir", []string{"--bin-dir", "opt/cni/bin", "--from", from}, 2, []string{"want an absolute path"}},
		{"stray argument", []string{"--bin-dir", bin, "x"}, 2, []string{"unexpected argument"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			code := cli.Report(&out, "carve install-cni", runInstallCNI(tc.args, &out))
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d; output:\n%s", code, tc.wantCode, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
	for _, n := range []string{"carve-ipam", "bridge", "portmap", "loopback"} {
		st, err := os.Stat(filepath.Join(bin, n))
		if err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("installed %s: %v, %v; want mode 0755", n, st, err)
		}
	}
}
