package cni

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// pluginDir holds carve-ipam and the reference plugins, built by TestMain:
// tests run them as a runtime does, as separate processes found in CNI_PATH.
var pluginDir string

// referencePlugins are the containernetworking/plugins binaries the tests
// chain carve-ipam with, built from the version pinned in go.mod.
var referencePlugins = []string{
	"github.com/containernetworking/plugins/plugins/main/bridge",
	"github.com/containernetworking/plugins/plugins/main/loopback",
	"github.com/containernetworking/plugins/plugins/meta/portmap",
}

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "carve-cni-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cni tests:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildPlugins(dir); err != nil {
		fmt.Fprintln(os.Stderr, "cni tests:", err)
		return 1
	}
	pluginDir = dir
	return m.Run()
}

// buildPlugins builds cmd/carve-ipam and the reference plugins into dir
// (the go build cache makes this cheap after the first run).
func buildPlugins(dir string) error {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	args := append([]string{"build", "-o", dir + string(os.PathSeparator), "github.com/carve-net/carve/cmd/carve-ipam"}, referencePlugins...)
	cmd := exec.Command(goBin, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %v: %w\n%s", args, err, out)
	}
	return nil
}
