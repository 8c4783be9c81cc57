package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-net/carve/internal/cli"
)

// TestInstallCNI: carve install-cni copies carve-ipam into the plugin
// directory, says what it did, and fails with exit 1 or 2 and a message
// naming the fix when it cannot.
func TestInstallCNI(t *testing.T) {
	from := t.TempDir()
	if err := os.WriteFile(filepath.Join(from, "carve-ipam"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "bin")
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		want     string
	}{
		{"install", []string{"--bin-dir", bin, "--from", from}, 0, "installed " + filepath.Join(from, "carve-ipam") + " as " + filepath.Join(bin, "carve-ipam")},
		{"again", []string{"--bin-dir", bin, "--from", from}, 0, "already installed"},
		{"no plugin", []string{"--bin-dir", bin, "--from", t.TempDir()}, 1, "make build writes bin/carve-ipam"},
		{"relative dir", []string{"--bin-dir", "opt/cni/bin", "--from", from}, 2, "want an absolute path"},
		{"stray argument", []string{"--bin-dir", bin, "x"}, 2, "unexpected argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			code := cli.Report(&out, "carve install-cni", runInstallCNI(tc.args, &out))
			if code != tc.wantCode || !strings.Contains(out.String(), tc.want) {
				t.Errorf("exit %d, output %q; want exit %d and %q", code, out.String(), tc.wantCode, tc.want)
			}
		})
	}
	st, err := os.Stat(filepath.Join(bin, "carve-ipam"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("installed plugin: %v, %v; want mode 0755", st, err)
	}
}
