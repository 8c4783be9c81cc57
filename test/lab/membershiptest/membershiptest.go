// Package membershiptest makes the agent records and tombstones that tests
// of package membership and of the agent gossip: as the masters render and
// sign them. It builds api values only (membership.NewPeerRecord turns a
// record into what gossip carries), so that membership's own tests can use
// it too.
package membershiptest

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"github.com/carve-net/carve/api"
)

// Key is a fresh ed25519 key pair for signing records.
func Key(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// Agent is an unsigned record of agent id at version v with underlay IP
// ip (its mesh address ip:6783), in one overlay "carve" with a subnet,
// both bridges and a VTEP.
func Agent(id string, v uint64, ip string) *api.AgentInfo {
	return &api.AgentInfo{AgentID: id, IP: ip, Version: v, MeshAddr: ip + ":6783", Overlays: []api.AgentOverlay{{
		Info:         api.OverlayNetwork{Name: "carve"},
		Subnet:       "10.128.2.0/24",
		MesosBridge:  &api.BridgeInfo{IP: "10.128.2.0/25"},
		DockerBridge: &api.BridgeInfo{IP: "10.128.2.128/25"},
		Backend:      &api.BackendInfo{VXLAN: &api.VXLANInfo{VTEPIP: "100.64.0.2/16", VTEPMAC: "70:b3:d5:40:00:02"}},
	}}}
}

// SignedAgent is the record of a second agent, "b", as the masters render
// it for netconfig.Default, signed with key for cluster (unsigned with
// a nil key); mutate changes it before it is signed.
func SignedAgent(key ed25519.PrivateKey, cluster string, mutate ...func(*api.AgentInfo)) *api.AgentInfo {
	info := &api.AgentInfo{AgentID: "b", Hostname: "unsigned-host", IP: "198.18.0.11", MeshAddr: "198.18.0.11:6783", Version: 9,
		Overlays: []api.AgentOverlay{{
			Info:         api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24},
			Subnet:       "10.128.2.0/24",
			MesosBridge:  &api.BridgeInfo{Name: "m-carve", IP: "10.128.2.0/25"},
			DockerBridge: &api.BridgeInfo{Name: "d-carve", IP: "10.128.2.128/25"},
			Backend: &api.BackendInfo{VXLAN: &api.VXLANInfo{VNI: 1024, VTEPName: "vtep1024", VTEPIP: "100.64.0.2/16",
				VTEPMAC: "70:b3:d5:40:00:02", VTEPPort: 4789, VTEPMTU: 1450}},
			State: api.OverlayState{Status: api.StatusOK},
		}}}
	for _, m := range mutate {
		m(info)
	}
	if key != nil {
		info.Signature = api.Sign(key, api.RecordSigningBytes(info, cluster))
	}
	return info
}

// SignedTombstone is the tombstone of agent id at version v, signed with
// key for cluster.
func SignedTombstone(key ed25519.PrivateKey, cluster, id string, v uint64) api.Tombstone {
	tb := api.Tombstone{AgentID: id, Version: v}
	tb.Signature = api.Sign(key, api.TombstoneSigningBytes(tb, cluster))
	return tb
}
