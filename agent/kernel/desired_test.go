package kernel

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/membershiptest"
	"github.com/carve-net/carve/vxlan"
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

// rec is an unsigned record of agent id at version v with underlay ip.
func rec(id string, v uint64, ip string) membership.PeerRecord {
	return membership.NewPeerRecord(membershiptest.Agent(id, v, ip))
}

// FuzzDecodeMembership: remote gossip never panics the decoder, and what it
// accepts merges and yields a usable desired state.
func FuzzDecodeMembership(f *testing.F) {
	good, _ := json.Marshal(membership.State{Records: []membership.PeerRecord{rec("a", 1, "198.18.0.1")},
		Tombstones: []api.Tombstone{{AgentID: "b", Version: 4}}})
	f.Add(good)
	f.Add([]byte(`{"records":[{"id":"a","v":1,"ip":"fd00::1","overlays":[{"name":"six","status":"STATUS_OK","subnet6":"fd00:1::/64","vtep":"100.64.0.3/16","mac":"70:b3:d5:40:00:03"}]}]}`))
	f.Add([]byte(`{"records":[{"id":"a","v":3,"ip":"198.18.0.1","overlays":[{"name":"carve","status":"STATUS_OK","subnet":"10.128.0.0/24","vtep":"100.64.0.1/16","mac":"70:b3:d5:40:00:01","blocks":[{"bridge":"mesos","prefix":"10.128.0.0/25","origin":"lease","version":2},{"bridge":"mesos","prefix":"10.128.9.64/26","origin":"grant","donor":"b","version":3}]}]}]}`))
	f.Add([]byte(`{"records":[{"id":"a","v":3,"overlays":[{"name":"carve","blocks":[{"bridge":"x","prefix":"10.128.0.1/25","origin":"?"}]}]}]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := membership.Decode(data)
		if err != nil {
			return
		}
		m := membership.New()
		m.Merge(st.State)
		_, _, _ = desiredState(selfInfo(), nil, netip.MustParseAddr("198.18.0.10"), m.State(), nil)
	})
}

func TestDesiredState(t *testing.T) {
	members := membership.State{Records: []membership.PeerRecord{
		membership.NewPeerRecord(selfInfo()), // self is never a peer
		rec("b", 4, "198.18.0.11"),
		{ID: "no-ip", Version: 5, Overlays: []membership.PeerOverlay{{Name: "carve", VTEPIP: "100.64.0.9/16", VTEPMAC: "70:b3:d5:40:00:09"}}}, // lost its IP: skipped
	}}
	want, peers, err := desiredState(selfInfo(), &api.NetworkConfig{OverlayMTU: 1400}, netip.MustParseAddr("198.18.0.10"), members, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want.VTEP.Name != "vtep1024" || want.VTEP.VNI != 1024 || want.VTEP.Address.String() != "100.64.0.1/16" ||
		want.VTEP.MAC.String() != "70:b3:d5:40:00:01" || want.VTEP.Local.String() != "198.18.0.10" || want.VTEP.MTU != 1450 {
		t.Errorf("vtep %+v", want.VTEP)
	}
	wantBridges := []vxlan.Bridge{
		{Name: "m-carve", Gateway: netip.MustParsePrefix("10.128.0.1/25"), MTU: 1400},
		{Name: "d-carve", Gateway: netip.MustParsePrefix("10.128.0.129/25"), Gateway6: netip.MustParsePrefix("fd00::8000:0:0:1/65"), MTU: 1400},
	}
	if !reflect.DeepEqual(want.Bridges, wantBridges) {
		t.Errorf("bridges %+v", want.Bridges)
	}
	if !want.IPForward || !want.IPv6Forward {
		t.Errorf("forwarding %v %v", want.IPForward, want.IPv6Forward)
	}
	if len(want.Peers) != 1 || want.Peers[0].ID != "b" || want.Peers[0].VTEPIP.String() != "100.64.0.2" ||
		want.Peers[0].Subnets[0].String() != "10.128.2.0/24" || peers["b"] != 4 || len(peers) != 1 {
		t.Errorf("peers %+v %v", want.Peers, peers)
	}
	if _, _, err := desiredState(&api.AgentInfo{AgentID: "x"}, nil, netip.MustParseAddr("198.18.0.10"), members, nil); err == nil {
		t.Error("a record without VTEP should be an error")
	}
}
