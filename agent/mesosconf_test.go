package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	cni "github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestAgentWritesMesosConf: with MesosCNIConfDir the agent writes, beside
// the conflist, the Mesos CNI isolator's <overlay>.conf once the overlay is
// leased, and prunes carve's .conf of an overlay it no longer has (left
// from before a restart); files that are not carve's stay.
func TestAgentWritesMesosConf(t *testing.T) {
	t.Parallel() // its own namespaces, masters and data dirs
	hosts, dir, m := hostsWithMaster(t, 1)
	gnet := fakegossip.New(fakegossip.Config{Seed: 1, GossipInterval: 300 * time.Millisecond})
	t.Cleanup(gnet.Close)
	mesosDir := filepath.Join(dir, "mesos-cni")
	if _, err := cni.WriteConf(mesosDir, cni.Conflist{Overlay: "gone", MTU: 1420}); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(mesosDir, "other.conf")
	if err := os.WriteFile(foreign, []byte(`{"cniVersion":"0.3.1","name":"other","type":"bridge","ipam":{"type":"host-local"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "a0")
	a := runAgent(t, newTestAgent(t, hosts[0], "http://"+m.HTTPAddr(), dataDir, gnet, func(c *Config) { c.MesosCNIConfDir = mesosDir }))
	testutil.Eventually(t, 0, "the Mesos CNI conf of carve", func() error {
		_, err := os.Stat(cni.ConfPath(mesosDir, "carve"))
		return err
	})
	data, err := os.ReadFile(cni.ConfPath(mesosDir, "carve"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := cni.Conflist{Overlay: "carve", MTU: a.overlayMTU(), Socket: filepath.Join(dataDir, "agent.sock")}.ConfBytes()
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != string(want) {
		t.Errorf("carve.conf:\n%s\nwant\n%s", data, want)
	}
	testutil.Eventually(t, 0, "gone.conf pruned", testutil.True(func() bool {
		_, err := os.Stat(cni.ConfPath(mesosDir, "gone"))
		return os.IsNotExist(err)
	}))
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("a conf carve did not write was touched: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "cni", "carve.conflist")); err != nil {
		t.Errorf("the conflist: %v", err)
	}
}
