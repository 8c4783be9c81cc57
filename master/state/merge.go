package state

import (
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
)

// mergeConfig computes the configuration that results from applying cfg to
// the current state (netconfig.Merge), given what the agents hold.
func (t *LeaseTable) mergeConfig(cfg api.NetworkConfig) (*network, []string, error) {
	use := netconfig.InUse{VTEP: len(t.agents) > 0, VTEP6: t.vtep6Leased(), Overlays: t.leasedOverlays()}
	return netconfig.Merge(t.net, cfg, use)
}

// leasedOverlays names the overlays in which some agent holds a block, or
// deleted agents' space is quarantined.
func (t *LeaseTable) leasedOverlays() map[string]bool {
	out := map[string]bool{}
	for name, sp := range t.spaces {
		if (sp.v4 != nil && sp.v4.Len() > 0) || (sp.v6 != nil && sp.v6.Len() > 0) {
			out[name] = true
		}
	}
	return out
}

// vtep6Leased tells whether some agent holds an IPv6 VTEP address.
func (t *LeaseTable) vtep6Leased() bool {
	for _, rec := range t.agents {
		if rec.VTEP6.IsValid() {
			return true
		}
	}
	return false
}
