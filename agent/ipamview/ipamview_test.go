package ipamview

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/api"
)

// fakeIPAM holds allocations of overlay "carve" and nothing else.
type fakeIPAM struct{ allocs []api.Allocation }

func (f fakeIPAM) List(string) *api.Allocations    { return &api.Allocations{Allocations: f.allocs} }
func (fakeIPAM) Unclaimed(string) []api.Allocation { return nil }
func (fakeIPAM) Status(string) *api.IPAMStatus     { return &api.IPAMStatus{Ready: true} }
func (fakeIPAM) BridgeSubnets(string, string) (netip.Prefix, netip.Prefix, bool) {
	return netip.Prefix{}, netip.Prefix{}, false
}

// fakeLinks puts host interfaces on bridges ("": on none); an interface
// it does not name does not exist.
type fakeLinks map[string]string

func (f fakeLinks) LinkMaster(name string) (string, bool, error) {
	master, ok := f[name]
	return master, ok, nil
}

// TestAllocationsDetached: a live CNI container whose host veth (in the
// runtime's cache entry) is not on its overlay's mesos bridge is reported
// detached, with where the veth is; one on the bridge is not, and nothing
// is said when the kernel is not read.
func TestAllocationsDetached(t *testing.T) {
	cache := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cache, "results"), 0o700); err != nil {
		t.Fatal(err)
	}
	links := fakeLinks{"veth-on": "m-carve", "veth-loose": "", "veth-other": "docker0"}
	for _, veth := range []string{"veth-on", "veth-loose", "veth-other", "veth-gone"} {
		entry := map[string]any{"containerId": veth, "ifName": "eth0", "networkName": "carve",
			"result": map[string]any{"interfaces": []map[string]string{{"name": "m-carve"}, {"name": veth}, {"name": "eth0", "sandbox": "/x"}}}}
		data, err := json.Marshal(entry)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cache, "results", "carve-"+veth+"-eth0"), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{
		"veth-on":    "",
		"veth-loose": "its host veth veth-loose is on no bridge (m-carve was removed under it)",
		"veth-other": "its host veth veth-other is on docker0, not m-carve",
		"veth-gone":  "its host veth veth-gone no longer exists",
	}
	var allocs []api.Allocation
	for id := range want {
		allocs = append(allocs, api.Allocation{Network: "carve", ContainerID: id, IfName: "eth0", Bridge: api.BridgeMesos})
	}
	for _, tt := range []struct {
		name  string
		links Links
	}{{"kernel read", links}, {"kernel not read", nil}} {
		t.Run(tt.name, func(t *testing.T) {
			v := &View{AgentID: "a1", IPAM: fakeIPAM{allocs}, CNICacheDir: cache, Links: tt.links}
			got := v.Allocations("")
			if got.AgentID != "a1" || len(got.Allocations) != len(want) {
				t.Fatalf("allocations %+v", got)
			}
			for _, al := range got.Allocations {
				w := want[al.ContainerID]
				if tt.links == nil {
					w = ""
				}
				if al.Container != api.ContainerLive || al.Detached != w {
					t.Errorf("%s: %s, detached %q; want live, detached %q", al.ContainerID, al.Container, al.Detached, w)
				}
			}
		})
	}
}
