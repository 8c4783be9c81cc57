package ipam

import (
	"net/netip"

	"github.com/carve-net/carve/api"
)

// forgetNeighbour has the agent drop the host's neighbour entry of a freed
// address on the device of its bridge (Config.ForgetNeighbour), so that the
// next container given the address is reached at its own MAC at once.
//
// Why it is needed: the host's entry names the old container's MAC and,
// when the host was the last to resolve it (traffic into the container,
// forwarded from another host or a port mapping), stays REACHABLE for 15-45 s
// after its last confirmation, then DELAY and PROBE add about 8 s. A new
// container given the address is reached only when it sends something first
// (an ARP request from it overrides the entry); its gratuitous ARP at link-up
// is dropped by the bridge, whose port is not forwarding yet. A pod that only
// listens (containerd's CRI, critest's port-mapping specs) stayed unreachable
// 12-60 s. Round-robin allocation makes such reuse rare; this makes it
// harmless. The caller holds s.mu.
func (s *Service) forgetNeighbour(network, kind string, addr netip.Addr) {
	if s.onForget == nil || s.view.Self == nil {
		return
	}
	for _, ov := range s.view.Self.Overlays {
		if ov.Info.Name != network {
			continue
		}
		br := ov.MesosBridge
		if kind == api.BridgeDocker {
			br = ov.DockerBridge
		}
		if br != nil && br.Name != "" {
			s.onForget(br.Name, addr)
		}
		return
	}
}
