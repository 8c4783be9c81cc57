package agent

import (
	"fmt"
	"testing"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/test/lab/membershiptest"
)

// TestIPAMViewHasOwnLease: the IPAM serves addresses from the agent's own
// leases, which it finds among the view's peers. The agent's own record
// joins the membership only once it verifies (after the first master
// state), and a newer one may be pending there; the view carries the
// record the agent runs with in any case.
func TestIPAMViewHasOwnLease(t *testing.T) {
	self := membershiptest.Agent("self", 3, "198.18.0.10")
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
			v := ipamView("c1", self, nil, tt.members, 0, 0)
			var own []string
			for _, p := range v.Peers {
				if p.ID == self.AgentID {
					own = append(own, fmt.Sprintf("%d %v", p.Version, p.Subnets))
				}
			}
			if want := fmt.Sprintf("%d [10.128.2.0/24]", self.Version); len(own) != 1 || own[0] != want {
				t.Errorf("own leases in the IPAM's view: %v, want [%s]", own, want)
			}
			if len(v.Peers) != 2 {
				t.Errorf("view peers %+v", v.Peers)
			}
		})
	}
}
