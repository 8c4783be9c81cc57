package kernel

// Reading a reconcile's report: which peers it programmed, and which of
// its errors concern an overlay.

import (
	"net/netip"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/vxlan"
)

// programmed are the peers of a reconcile whose entries did not fail.
func programmed(rep *vxlan.Report, peers map[string]uint64) map[string]uint64 {
	failed := map[string]bool{}
	for _, e := range rep.Errors {
		if e.Peer != "" {
			failed[e.Peer] = true
		}
	}
	out := map[string]uint64{}
	for id, v := range peers {
		if !failed[id] {
			out[id] = v
		}
	}
	return out
}

// addressOf tells whether an address (in CIDR form, as the dataplane names
// it in its errors) is one of the overlay's: its VTEP's, or a gateway
// inside one of its bridges' sub-subnets.
func addressOf(ov *api.AgentOverlay, key string) bool {
	p, err := netip.ParsePrefix(key)
	if err != nil {
		return false
	}
	var mine []string
	if ov.Backend != nil && ov.Backend.VXLAN != nil {
		mine = append(mine, ov.Backend.VXLAN.VTEPIP, ov.Backend.VXLAN.VTEPIP6)
	}
	for _, br := range []*api.BridgeInfo{ov.MesosBridge, ov.DockerBridge} {
		if br != nil {
			mine = append(mine, br.IP, br.IP6)
		}
	}
	for _, s := range mine {
		if q, err := netip.ParsePrefix(s); err == nil && q.Masked().Contains(p.Addr()) && q.Bits() == p.Bits() {
			return true
		}
	}
	return false
}
