package netconfig

import (
	"fmt"

	"github.com/carve-net/carve/api"
)

// Longest agent prefixes that leave a container address: an agent's
// subnet is cut in two bridge halves, and a half needs a network address,
// a gateway, a container and (IPv4) a broadcast address: a /30 half of a
// /29, a /126 half of a /125.
const (
	maxUsablePrefix  = 29
	maxUsablePrefix6 = 125
)

// checkUsable refuses a configuration that parses but cannot work: no
// overlay at all, an agent prefix whose bridge halves hold no container
// address, an overlay MTU the VTEP cannot carry. It checks a configuration
// an operator gives (carve master --config, ValidateConfig), not the
// replicated state machine, which must apply what older masters committed
// the way they did.
func checkUsable(cfg api.NetworkConfig) error {
	if len(cfg.Overlays) == 0 {
		return configErr("overlays", "the list is empty: give at least one overlay (deploy/examples/network.json has one; leave \"overlays\" out for the default), or set \"enabled\": false on an overlay to stop using it")
	}
	if cfg.VTEPMTU != 0 && cfg.OverlayMTU > cfg.VTEPMTU {
		return configErr("overlay_mtu", "%d is above vtep_mtu %d: containers' packets go through the VTEP, which carries at most %d bytes; set overlay_mtu to at most %d, or raise vtep_mtu (to at most the underlay MTU minus VXLAN's 50 bytes)", cfg.OverlayMTU, cfg.VTEPMTU, cfg.VTEPMTU, cfg.VTEPMTU)
	}
	for i, o := range cfg.Overlays {
		field := fmt.Sprintf("overlays[%d]", i)
		if o.Subnet != "" && o.Prefix > maxUsablePrefix {
			return configErr(field+".prefix", "%d leaves overlay %q no container address: each agent's /%d is cut into two bridge halves of /%d (network, gateway, broadcast and nothing else); use at most %d (8 addresses: one container per bridge), e.g. %d", o.Prefix, o.Name, o.Prefix, o.Prefix+1, maxUsablePrefix, 24)
		}
		if o.Subnet6 != "" && o.Prefix6 > maxUsablePrefix6 {
			return configErr(field+".prefix6", "%d leaves overlay %q no container address: each agent's /%d is cut into two bridge halves of /%d; use at most %d, e.g. %d", o.Prefix6, o.Name, o.Prefix6, o.Prefix6+1, maxUsablePrefix6, 80)
		}
	}
	return nil
}
