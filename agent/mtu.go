package agent

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

// mtuState is the agent's own underlay MTU as last read, and what was last
// logged about the MTUs, so that the agreed MTUs and a conflicting
// configuration are said once per change.
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
		p.VTEP = defaultVTEPMTU
	}
	switch {
	case cfgOverlay > 0:
		p.Overlay = cfgOverlay
	case cfgVTEP > 0 || limit > 0:
		p.Overlay = p.VTEP // bridges route into the VTEP: the same MTU fits
	default:
		p.Overlay = defaultOverlayMTU
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

// refreshUnderlayMTU reads the MTU of this agent's underlay device, the
// one it registers, and remembers it (0 when it cannot be read: the MTUs
// then follow the other agents' records).
func (a *Agent) refreshUnderlayMTU() int {
	mtu, link, err := a.dp.UnderlayMTU(a.ip)
	switch {
	case err != nil:
		a.log.Warn("cannot read the underlay MTU; the MTUs follow the other agents' records", "ip", a.ip, "err", err)
		mtu = 0
	case api.ValidateUnderlayMTU(mtu) != nil:
		a.log.Warn("underlay MTU out of range: not registered", "link", link, "mtu", mtu)
		mtu = 0
	}
	a.mtu.mu.Lock()
	a.mtu.own = mtu
	a.mtu.mu.Unlock()
	return mtu
}

// withMTUs returns a copy of network whose vtep_mtu and overlay_mtu are the
// ones to program (logging the agreed MTUs and any conflict when they
// change), so that the VTEP, the bridges, the conflists and the IPAM all
// read them from one place.
func (a *Agent) withMTUs(network *api.NetworkConfig, members membership.State) *api.NetworkConfig {
	p := planMTUs(network, a.ip, a.id, a.ownUnderlayMTU(), members.Records)
	var out api.NetworkConfig
	if network != nil {
		out = *network
	}
	out.VTEPMTU, out.OverlayMTU = p.VTEP, p.Overlay
	a.mtu.mu.Lock()
	defer a.mtu.mu.Unlock()
	a.mtu.overlay = p.Overlay
	if s := fmt.Sprint(p.VTEP, p.Overlay, p.Underlay, p.From); s != a.mtu.logged {
		a.mtu.logged = s
		a.log.Info("MTUs", "vtep", p.VTEP, "overlay", p.Overlay, "smallest_underlay", p.Underlay, "of_agent", p.From)
	}
	if s := fmt.Sprint(p.Conflicts); s != a.mtu.warned {
		a.mtu.warned = s
		for _, c := range p.Conflicts {
			a.log.Warn("network configuration: " + c)
		}
	}
	return &out
}

// ownUnderlayMTU is this agent's underlay MTU as last read (see
// refreshUnderlayMTU).
func (a *Agent) ownUnderlayMTU() int {
	a.mtu.mu.Lock()
	own := a.mtu.own
	a.mtu.mu.Unlock()
	return own
}
