package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/testutil"
)

// writeCNICacheEntry writes a libcni cache entry for an attachment, as
// libcni does after a successful ADD.
func writeCNICacheEntry(t *testing.T, dir, network, containerID, ifName, netns string) {
	t.Helper()
	entry := map[string]any{"kind": "cniCacheV1", "containerId": containerID, "ifName": ifName, "networkName": network}
	if netns != "" {
		entry["netns"] = netns
	}
	data, err := json.Marshal(entry)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "results"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results", network+"-"+containerID+"-"+ifName), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestIPAMHTTPView(t *testing.T) {
	hosts, dir, m := hostsWithMaster(t, 1)
	cniCache := filepath.Join(dir, "cni-cache")
	gnet := fakegossip.New(fakegossip.Config{Seed: 1})
	t.Cleanup(gnet.Close)
	a := runAgent(t, newTestAgent(t, hosts[0], "http://"+m.HTTPAddr(), filepath.Join(dir, "a0"), gnet,
		func(c *Config) { c.CNICacheDir = cniCache }))
	testutil.Eventually(t, 0, "the agent can allocate on overlay carve", func() error {
		if st := a.IPAM().Status("carve"); !st.Ready {
			return errors.New(st.Error)
		}
		return nil
	})

	liveNS := filepath.Join(dir, "netns-live") // stands for a namespace's bind mount
	if err := os.WriteFile(liveNS, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	writeCNICacheEntry(t, cniCache, "carve", "live", "eth0", liveNS)
	writeCNICacheEntry(t, cniCache, "carve", "nons", "eth0", "")
	writeCNICacheEntry(t, cniCache, "carve", "nsgone", "eth0", filepath.Join(dir, "netns-removed"))
	writeCNICacheEntry(t, cniCache, "other", "leaked", "eth0", "") // another network's entry does not count
	want := map[string]string{
		"live": api.ContainerLive, "nons": api.ContainerLive, "nsgone": api.ContainerGone,
		"leaked": api.ContainerGone, "dock": api.ContainerUnknown,
	}
	for id := range want {
		bridge := api.BridgeMesos
		if id == "dock" {
			bridge = api.BridgeDocker
		}
		if _, err := a.IPAM().Allocate(api.IPAMRequest{Network: "carve", ContainerID: id, IfName: "eth0", Bridge: bridge}); err != nil {
			t.Fatalf("allocate %s: %v", id, err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := api.NewAgentClient("http://"+a.HTTPAddr(), nil)

	allocs, err := c.IPAMAllocations(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if allocs.AgentID != a.id || len(allocs.Allocations) != len(want) {
		t.Fatalf("allocations of %s: %+v, want %d of agent %s", allocs.AgentID, allocs.Allocations, len(want), a.id)
	}
	for _, al := range allocs.Allocations {
		if al.Container != want[al.ContainerID] {
			t.Errorf("container %s: %s (%s), want %s", al.ContainerID, al.Container, al.ContainerDetail, want[al.ContainerID])
		}
		if len(al.IPs) == 0 {
			t.Errorf("container %s: no address", al.ContainerID)
		}
	}

	st, err := c.IPAMStatus(ctx, "carve")
	if err != nil {
		t.Fatal(err)
	}
	rec := a.Overlay().Overlay("carve")
	if len(st.Networks) != 1 || st.Networks[0].Network != "carve" || !st.Networks[0].Ready || len(st.Networks[0].Bridges) != 2 {
		t.Fatalf("status: %+v", st)
	}
	for _, b := range st.Networks[0].Bridges {
		info, used := rec.MesosBridge, uint64(4)
		if b.Bridge == api.BridgeDocker {
			info, used = rec.DockerBridge, 1
		}
		p := netip.MustParsePrefix(info.IP).Masked()
		size := uint64(1) << (32 - p.Bits())
		if b.Subnet != p.String() || b.Used != used || b.Free == nil || *b.Free != size-3-used {
			t.Errorf("bridge %s: %+v (free %v), want subnet %s, used %d, free %d", b.Bridge, b, b.Free, p, used, size-3-used)
		}
	}

	for _, tc := range []struct {
		query  string
		status int
	}{
		{"/overlay-agent/ipam/status?network=Bad!", http.StatusBadRequest},
		{"/overlay-agent/ipam/allocations?netwrk=carve", http.StatusBadRequest},
		{"/overlay-agent/ipam/status?network=nope", http.StatusNotFound},
		{"/overlay-agent/ipam/allocations?network=nope", http.StatusOK},
	} {
		err := api.Call(ctx, http.DefaultClient, http.MethodGet, "http://"+a.HTTPAddr()+tc.query, nil, nil, nil)
		var ae *api.Error
		switch {
		case tc.status == http.StatusOK && err != nil:
			t.Errorf("GET %s: %v", tc.query, err)
		case tc.status != http.StatusOK && (!errors.As(err, &ae) || ae.Status != tc.status):
			t.Errorf("GET %s: %v, want HTTP %d", tc.query, err, tc.status)
		}
	}
}
