package kernel

import (
	"slices"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
)

// An overlay disabled in the network configuration ("enabled": false) is
// drained, not torn down: the masters keep its leases and render it
// "enabled": false in each record; the IPAM takes no new container on it
// but keeps and releases the attached ones; and the agent keeps its
// bridges, its routes to the other agents' subnets of it and its conflist
// while a container of this host is attached, so that those containers
// keep their network and their runtime's DEL works. When the last one
// leaves, all of it goes. Enabled again, it is served as before.

// disabledOverlays are the overlays the configuration or this agent's
// record says are disabled.
func disabledOverlays(self *api.AgentInfo, network *api.NetworkConfig) map[string]bool {
	out := map[string]bool{}
	if network != nil {
		for _, o := range network.Overlays {
			if !o.IsEnabled() {
				out[o.Name] = true
			}
		}
	}
	for _, ov := range self.Overlays {
		if !ov.Info.IsEnabled() {
			out[ov.Info.Name] = true
		}
	}
	return out
}

// drainedOverlays are the disabled overlays with no container attached on
// this host: their bridges, routes and conflists go. attached counts a
// network's attachments here.
func drainedOverlays(self *api.AgentInfo, network *api.NetworkConfig, attached func(network string) int) map[string]bool {
	out := map[string]bool{}
	for name := range disabledOverlays(self, network) {
		if attached(name) == 0 {
			out[name] = true
		}
	}
	return out
}

// withoutOverlays is self without the overlays named in drop.
func withoutOverlays(self *api.AgentInfo, drop map[string]bool) *api.AgentInfo {
	if len(drop) == 0 {
		return self
	}
	out := *self
	out.Overlays = slices.DeleteFunc(slices.Clone(self.Overlays), func(ov api.AgentOverlay) bool { return drop[ov.Info.Name] })
	return &out
}

// peerWithout is a peer's record without the overlays named in drop: no
// route goes to its subnets of a drained overlay.
func peerWithout(r membership.PeerRecord, drop map[string]bool) membership.PeerRecord {
	if len(drop) == 0 {
		return r
	}
	r.Overlays = slices.DeleteFunc(slices.Clone(r.Overlays), func(ov membership.PeerOverlay) bool { return drop[ov.Name] })
	return r
}

// noteDrained logs, once per change, which disabled overlays this host
// still serves containers on and which it drained.
func (k *Kernel) noteDrained(self *api.AgentInfo, network *api.NetworkConfig, drained map[string]bool, attached func(network string) int) {
	for name := range disabledOverlays(self, network) {
		state := "draining"
		if drained[name] {
			state = "drained"
		}
		if k.drainLogged[name] == state {
			continue
		}
		switch state {
		case "draining":
			k.log.Warn("overlay disabled: it keeps its bridges, routes and conflist while containers are attached here, and takes no new one", "overlay", name, "attached", attached(name))
		default:
			k.log.Info("overlay disabled and drained: no container left here; its bridges, routes and conflist are removed", "overlay", name)
		}
		k.drainLogged[name] = state
	}
	for name := range k.drainLogged {
		if !disabledOverlays(self, network)[name] {
			delete(k.drainLogged, name)
		}
	}
}
