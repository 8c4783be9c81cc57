package agent

import (
	"fmt"
	"testing"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
)

// selfInfo is an agent's own record: overlay "carve" leased, both bridges
// (the Docker one dual-stack) and a VTEP.
func selfInfo() *api.AgentInfo {
	return &api.AgentInfo{AgentID: "self", IP: "198.18.0.10", Version: 3, Overlays: []api.AgentOverlay{{
		Info:         api.OverlayNetwork{Name: "carve"},
		Subnet:       "10.128.0.0/24",
		MesosBridge:  &api.BridgeInfo{Name: "m-carve", IP: "10.128.0.0/25"},
		DockerBridge: &api.BridgeInfo{Name: "d-carve", IP: "10.128.0.128/25", IP6: "fd00::8000:0:0:0/65"},
		Backend: &api.BackendInfo{VXLAN: &api.VXLANInfo{VNI: 1024, VTEPName: "vtep1024", VTEPIP: "100.64.0.1/16",
			VTEPMAC: "70:b3:d5:40:00:01", VTEPPort: 4789, VTEPMTU: 1450}},
		State: api.OverlayState{Status: api.StatusOK},
	}}}
}

// TestIPAMViewHasOwnLease: the IPAM serves addresses from the agent's own
// leases, which it finds among the view's peers. The agent's own record
// joins the membership only once it verifies (after the first master
// state), and a newer one may be pending there; the view carries the
// record the agent runs with in any case.
func TestIPAMViewHasOwnLease(t *testing.T) {
	self := selfInfo()
	older := membership.NewPeerRecord(self)
	older.Version, older.Overlays[0].Subnet = self.Version-1, "10.128.9.0/24"
	tests := []struct {
		name    string
		members membership.State
	}{
		{"own record not in the membership yet", membership.State{Records: []membership.PeerRecord{rec("b", 4, "198.18.0.11")}}},
		{"an older own record in the membership", membership.State{Records: []membership.PeerRecord{older, rec("b", 4, "198.18.0.11")}}},
		{"the same own record in the membership", membership.State{Records: []membership.PeerRecord{membership.NewPeerRecord(self), rec("b", 4, "198.18.0.11")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := ipamView("c1", self, nil, tt.members, 0)
			var own []string
			for _, p := range v.Peers {
				if p.ID == self.AgentID {
					own = append(own, fmt.Sprintf("%d %v", p.Version, p.Subnets))
				}
			}
			if want := fmt.Sprintf("%d [10.128.0.0/24]", self.Version); len(own) != 1 || own[0] != want {
				t.Errorf("own leases in the IPAM's view: %v, want [%s]", own, want)
			}
			if len(v.Peers) != 2 {
				t.Errorf("view peers %+v", v.Peers)
			}
		})
	}
}
