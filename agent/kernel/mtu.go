package kernel

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/vxlan"
	"github.com/carve-net/carve/wireguard"
)

// MTUs follow the underlay unless the network configuration fixes them
// (vtep_mtu, overlay_mtu). Every agent registers the MTU of its underlay
// device; the masters sign it into its record, and every agent programs its
// VTEP, its bridges and the CNI configurations it writes for the smallest
// underlay among the records it holds (its own included), less VXLAN's
// overhead and that of a tunnel VXLAN runs inside (tunnelOverhead). A host
// with a smaller underlay joining lowers the MTU everywhere as soon as its
// record arrives; running containers keep their interface's MTU (see
// docs/operations.md).

// mtuState is the agent's own underlay MTU as last read, the overlay MTU
// last computed, and what was last logged about the MTUs, so that the
// agreed MTUs and a conflicting configuration are said once per change.
type mtuState struct {
	mu      sync.Mutex
	own     int // this agent's underlay MTU, as last read (0: unknown)
	overlay int // the overlay MTU last computed (0: none yet)
	logged  string
	warned  string
}

// linkMTUs are the MTUs the agent programs.
type linkMTUs struct {
	// VTEP is the VTEP's MTU, Overlay the bridges' and the containers'.
	VTEP, Overlay int
	// Underlay is the smallest underlay MTU among the records held (0:
	// none known), and From the agent that has it.
	Underlay int
	From     string
	// Conflicts say which configured MTU exceeds what Underlay leaves, with
	// the fix.
	Conflicts []string
}

// tunnelOverhead is what encryption adds beyond VXLAN's own overhead.
// With encryption on, packets to a keyed peer travel in WireGuard instead
// of VXLAN (60 bytes over IPv4, 80 over IPv6, against VXLAN's 50 and 70),
// and to a peer without a key still in VXLAN: one overlay MTU must fit
// both, so it is the underlay's less WireGuard's overhead.
func tunnelOverhead(network *api.NetworkConfig, local netip.Addr) int {
	if network == nil || network.Encryption == "" {
		return 0
	}
	return wireguard.Overhead(local) - vxlan.Overhead(local)
}

// planMTUs computes the MTUs from the configuration, this agent's own
// underlay MTU (0: unknown) and the underlay MTUs in the records held.
func planMTUs(network *api.NetworkConfig, local netip.Addr, ownID string, own int, records []membership.PeerRecord) linkMTUs {
	var p linkMTUs
	if own > 0 {
		p.Underlay, p.From = own, ownID
	}
	for _, r := range records {
		if r.UnderlayMTU > 0 && (p.Underlay == 0 || r.UnderlayMTU < p.Underlay) {
			p.Underlay, p.From = r.UnderlayMTU, r.ID
		}
	}
	limit := 0 // what the smallest underlay leaves; 0: unknown
	if p.Underlay > 0 {
		limit = vxlan.VTEPMTUFor(p.Underlay, local, tunnelOverhead(network, local))
	}
	var cfgVTEP, cfgOverlay int
	if network != nil {
		cfgVTEP, cfgOverlay = network.VTEPMTU, network.OverlayMTU
	}
	switch {
	case cfgVTEP > 0:
		p.VTEP = cfgVTEP
	case limit > 0:
		p.VTEP = limit
	default: // nothing known yet: DESIGN.md's former defaults
		p.VTEP = DefaultVTEPMTU
	}
	switch {
	case cfgOverlay > 0:
		p.Overlay = cfgOverlay
	case cfgVTEP > 0 || limit > 0:
		p.Overlay = p.VTEP // bridges route into the VTEP: the same MTU fits
	default:
		p.Overlay = DefaultOverlayMTU
	}
	if limit > 0 {
		for _, c := range []struct {
			field string
			v     int
		}{{"vtep_mtu", cfgVTEP}, {"overlay_mtu", cfgOverlay}} {
			if c.v > limit {
				p.Conflicts = append(p.Conflicts, fmt.Sprintf(
					"%s %d is above the %d bytes that the smallest underlay (MTU %d, agent %s) leaves after %d bytes of encapsulation: "+
						"packets of that size are dropped between hosts; set %s to at most %d, or remove it to follow the underlay",
					c.field, c.v, limit, p.Underlay, p.From, p.Underlay-limit, c.field, limit))
			}
		}
	}
	return p
}
