package agent

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	cni "github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestAgentLeavesForeignFilesInConfDir: the agent's conflist directory is
// shared (Podman in netavark mode wrote netavark.lock into /etc/cni/net.d),
// so the agent writes its conflist and prunes carve's conflist of an
// overlay it no longer has, and leaves every other file as it was, without
// an error: another engine's lock, network .json, conflist and temporary
// file, a conflist that is not JSON.
func TestAgentLeavesForeignFilesInConfDir(t *testing.T) {
	t.Parallel() // its own namespaces, masters and data dirs
	hosts, dir, m := hostsWithMaster(t, 1)
	gnet := fakegossip.New(fakegossip.Config{Seed: 1, GossipInterval: 300 * time.Millisecond})
	t.Cleanup(gnet.Close)
	dataDir := filepath.Join(dir, "a0")
	confDir := filepath.Join(dataDir, "cni")
	if _, err := cni.WriteConflist(confDir, cni.Conflist{Overlay: "gone", MTU: 1420}); err != nil {
		t.Fatal(err)
	}
	foreign := map[string]string{
		"netavark.lock":              "",
		"cni.lock":                   "",
		"podman.json":                `{"name":"podman","driver":"bridge","network_interface":"podman0"}`,
		"87-podman-bridge.conflist":  `{"cniVersion":"0.4.0","name":"podman","plugins":[{"type":"bridge","ipam":{"type":"host-local"}}]}`,
		".podman.conflist.tmp-12345": `{"cniVersion":"0.4.0","name":"podman","plugins":[]}`,
		"broken.conflist":            "{",
	}
	for name, data := range foreign {
		if err := os.WriteFile(filepath.Join(confDir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logs testutil.Logs
	a := runAgent(t, newTestAgent(t, hosts[0], "http://"+m.HTTPAddr(), dataDir, gnet, func(c *Config) { c.Logger = logs.Logger() }))
	testutil.Eventually(t, 0, "carve.conflist written and gone.conflist pruned", func() error {
		if _, err := os.Stat(cni.ConflistPath(confDir, "", "carve")); err != nil {
			return err
		}
		if _, err := os.Stat(cni.ConflistPath(confDir, "", "gone")); !os.IsNotExist(err) {
			return fmt.Errorf("gone.conflist: %v", err)
		}
		return nil
	})
	// Another reconcile (a full resync every second) sees the same files.
	done := reconcileCount(t, a.Agent, "resync")
	testutil.Eventually(t, 0, "another resync", testutil.True(func() bool { return reconcileCount(t, a.Agent, "resync") > done }))
	for name, data := range foreign {
		got, err := os.ReadFile(filepath.Join(confDir, name))
		if err != nil || string(got) != data {
			t.Errorf("%s was touched: %v %q", name, err, got)
		}
	}
	if logs.Has(slog.LevelError, "CNI config") {
		t.Error("the agent logged an error about its CNI configs")
	}
}
