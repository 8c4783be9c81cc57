package agent

import (
	"net/netip"
	"slices"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/vxlan"
)

// routedPath sets the dataplane's routed mode from the network
// configuration (docs/design.md, "Dataplane"): on with dataplane "routed",
// and never while the network encrypts, whatever else it says: a routed
// peer's traffic is in the clear, and the masters refuse the combination
// anyway. The dataplane chooses each peer's mode from this host's underlay
// segment and the declared segments.
func routedPath(want *vxlan.Desired, network *api.NetworkConfig) {
	want.Routed, want.Segments = false, nil
	if network == nil || network.Dataplane != api.DataplaneRouted || network.Encryption != "" {
		return
	}
	want.Routed = true
	for _, s := range network.Segments {
		// Validated by the masters; one that does not parse is left out.
		if p, err := netip.ParsePrefix(s); err == nil {
			want.Segments = append(want.Segments, p.Masked())
		}
	}
}

// peerModeLocked is how the last reconcile reached a peer, for
// /overlay-agent/peers: empty for the peers it did not program (those
// reached through WireGuard among them). The caller holds a.mu.
func (a *Agent) peerModeLocked(id string) string {
	if a.lastReport == nil {
		return ""
	}
	return string(a.lastReport.Modes[id])
}

// routedForwarding is what the FORWARD accept rules need of the routed
// data path: the underlay device, and the overlays' subnets forwarding
// between it and carve's devices is accepted for. Nothing while routed
// mode is off, or while the underlay device cannot be found (then the
// dataplane reports the failure and routes no peer).
func (a *Agent) routedForwarding(want *vxlan.Desired) (string, []netip.Prefix) {
	if !want.Routed || a.dp == nil {
		return "", nil
	}
	_, dev, err := a.dp.UnderlayMTU(want.VTEP.Local)
	if err != nil {
		return "", nil
	}
	a.mu.RLock()
	network := a.network
	a.mu.RUnlock()
	var out []netip.Prefix
	if network != nil {
		for _, ov := range network.Overlays {
			for _, s := range []string{ov.Subnet, ov.Subnet6} {
				if p, err := netip.ParsePrefix(s); err == nil {
					out = append(out, p.Masked())
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return dev, out
}
