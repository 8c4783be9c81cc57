package kernel

// The desired dataplane: what the kernel is to hold for the agent's own
// record and the records of its peers.

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/vxlan"
)

// desiredState computes the dataplane this agent wants: its VTEP, its
// bridges, and an entry set for every other agent with an underlay IP. It
// also returns the peers included, with their versions. No route goes to
// the peers' subnets of the overlays in drained.
func desiredState(self *api.AgentInfo, network *api.NetworkConfig, ip netip.Addr, members membership.State, drained map[string]bool) (vxlan.Desired, map[string]uint64, error) {
	var want vxlan.Desired
	var vx *api.VXLANInfo
	for _, ov := range self.Overlays {
		if ov.Backend != nil && ov.Backend.VXLAN != nil {
			vx = ov.Backend.VXLAN
			break
		}
	}
	if vx == nil {
		return want, nil, fmt.Errorf("the masters gave this agent no VTEP (no overlay leased)")
	}
	addr, err := netip.ParsePrefix(vx.VTEPIP)
	if err != nil {
		return want, nil, fmt.Errorf("own vtep_ip %q: %w", vx.VTEPIP, err)
	}
	mac, err := net.ParseMAC(vx.VTEPMAC)
	if err != nil {
		return want, nil, fmt.Errorf("own vtep_mac %q: %w", vx.VTEPMAC, err)
	}
	want.VTEP = vxlan.VTEP{Name: vx.VTEPName, VNI: vx.VNI, Port: vx.VTEPPort, Local: ip, MAC: mac, MTU: vx.VTEPMTU, Address: addr}
	if network != nil && network.VTEPMTU > 0 {
		want.VTEP.MTU = network.VTEPMTU // the agent's own choice (WithMTUs)
	}
	if vx.VTEPIP6 != "" {
		if want.VTEP.Address6, err = netip.ParsePrefix(vx.VTEPIP6); err != nil {
			return want, nil, fmt.Errorf("own vtep_ip6 %q: %w", vx.VTEPIP6, err)
		}
		want.IPv6Forward = true
	}
	want.IPForward = true
	mtu := DefaultOverlayMTU
	if network != nil && network.OverlayMTU > 0 {
		mtu = network.OverlayMTU
	}
	for _, ov := range self.Overlays {
		if !Leased(&ov) {
			continue
		}
		for _, br := range []*api.BridgeInfo{ov.MesosBridge, ov.DockerBridge} {
			if br == nil {
				continue
			}
			b := vxlan.Bridge{Name: br.Name, MTU: mtu}
			if br.IP != "" {
				if b.Gateway, err = gatewayOf(br.IP); err != nil {
					return want, nil, fmt.Errorf("bridge %s: %w", br.Name, err)
				}
			}
			if br.IP6 != "" {
				if b.Gateway6, err = gatewayOf(br.IP6); err != nil {
					return want, nil, fmt.Errorf("bridge %s: %w", br.Name, err)
				}
				want.IPv6Forward = true
			}
			want.Bridges = append(want.Bridges, b)
		}
	}
	peers := map[string]uint64{}
	for _, r := range members.Records {
		if vtep, _ := r.VTEP(); r.ID == self.AgentID || !r.HasIP() || vtep == "" {
			continue
		}
		p, err := peerOf(peerWithout(r, drained))
		if err != nil {
			continue // validated on the way in; a record we cannot use is skipped
		}
		want.Peers = append(want.Peers, p)
		peers[r.ID] = r.Version
	}
	routedPath(&want, network)
	return want, peers, nil
}

// addGrowth adds what growth changed to the desired dataplane: a gateway on
// each bridge in every block it grew, and a route to each peer for every
// block the rings show it holds beyond its subnets (which hold the blocks
// the masters list in its record: peerOf): the grants the masters do not
// know yet. A granted block's route is longer than the donor's, so it
// wins.
func addGrowth(want *vxlan.Desired, self *api.AgentInfo, g Growth) {
	for i := range want.Bridges {
		b := &want.Bridges[i]
		for _, ov := range self.Overlays {
			switch {
			case ov.MesosBridge != nil && ov.MesosBridge.Name == b.Name:
				b.Extra = append(b.Extra, g.BridgeGateways(ov.Info.Name, api.BridgeMesos)...)
			case ov.DockerBridge != nil && ov.DockerBridge.Name == b.Name:
				b.Extra = append(b.Extra, g.BridgeGateways(ov.Info.Name, api.BridgeDocker)...)
			}
		}
	}
	known := map[string][]netip.Prefix{}
	for _, p := range want.Peers {
		known[p.ID] = slices.Clone(p.Subnets)
	}
	extra := g.PeerBlocks(known)
	for i := range want.Peers {
		p := &want.Peers[i]
		p.Subnets = append(p.Subnets, extra[p.ID]...)
	}
}

// peerOf is the dataplane's entry set of a peer's record.
func peerOf(r membership.PeerRecord) (vxlan.Peer, error) {
	ip, err := netip.ParseAddr(r.IP)
	if err != nil {
		return vxlan.Peer{}, err
	}
	vtepIP, vtepMAC := r.VTEP()
	vtep, err := netip.ParsePrefix(vtepIP)
	if err != nil {
		return vxlan.Peer{}, err
	}
	mac, err := net.ParseMAC(vtepMAC)
	if err != nil {
		return vxlan.Peer{}, err
	}
	p := vxlan.Peer{ID: r.ID, UnderlayIP: ip, VTEPIP: vtep.Addr(), VTEPMAC: mac}
	if s := r.VTEP6(); s != "" {
		vtep6, err := netip.ParsePrefix(s)
		if err != nil {
			return vxlan.Peer{}, err
		}
		p.VTEPIP6 = vtep6.Addr()
	}
	for _, s := range r.Subnets() {
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			return vxlan.Peer{}, err
		}
		p.Subnets = append(p.Subnets, pr)
	}
	return p, nil
}

// gatewayOf is the first host address of a bridge's sub-subnet, with its prefix length.
func gatewayOf(subnet string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(subnet)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(p.Masked().Addr().Next(), p.Bits()), nil
}

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
