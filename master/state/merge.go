package state

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/carve-net/carve/api"
)

// mergeConfig computes the configuration that results from applying cfg to
// the current state: overlays the new file drops but that hold leases stay,
// disabled; a leased overlay's subnets and the VTEP subnet in use never
// change under the agents; a new overlay that would overlap a kept one is
// left out. The problems are returned as warnings, never as an abort.
func (t *LeaseTable) mergeConfig(cfg api.NetworkConfig) (*network, []string, error) {
	cfg = WithDefaults(cfg)
	if t.net == nil {
		n, err := parseNetwork(cfg)
		return n, nil, err
	}
	var warnings []string
	leased := t.leasedOverlays()
	if cfg.VTEPSubnet != t.net.api.VTEPSubnet && len(t.agents) > 0 {
		warnings = append(warnings, fmt.Sprintf("vtep_subnet stays %s: agents hold VTEP IPs in it (the new config says %s)", t.net.api.VTEPSubnet, cfg.VTEPSubnet))
		cfg.VTEPSubnet = t.net.api.VTEPSubnet
	}
	if cfg.VTEPSubnet6 != t.net.api.VTEPSubnet6 && t.vtep6Leased() {
		warnings = append(warnings, fmt.Sprintf("vtep_subnet6 stays %q: agents hold IPv6 VTEP addresses in it (the new config says %q)", t.net.api.VTEPSubnet6, cfg.VTEPSubnet6))
		cfg.VTEPSubnet6 = t.net.api.VTEPSubnet6
	}
	oldDefs := map[string]overlayDef{}
	for _, d := range t.net.overlays {
		oldDefs[d.api.Name] = d
	}
	var overlays []api.OverlayNetwork
	named := map[string]bool{}
	for _, o := range cfg.Overlays {
		named[o.Name] = true
		if old, ok := oldDefs[o.Name]; ok && leased[o.Name] &&
			(o.Subnet != old.api.Subnet || o.Prefix != old.api.Prefix || o.Subnet6 != old.api.Subnet6 || o.Prefix6 != old.api.Prefix6) {
			warnings = append(warnings, fmt.Sprintf("overlay %q keeps subnet %q/%d subnet6 %q/%d: agents hold leases in it", o.Name, old.api.Subnet, old.api.Prefix, old.api.Subnet6, old.api.Prefix6))
			kept := old.api
			kept.Enabled = o.Enabled
			o = kept
		}
		overlays = append(overlays, o)
	}
	var keptDropped []api.OverlayNetwork
	for _, d := range t.net.overlays {
		if named[d.api.Name] || !leased[d.api.Name] {
			continue
		}
		kept := d.api
		kept.Enabled = new(bool)
		keptDropped = append(keptDropped, kept)
		warnings = append(warnings, fmt.Sprintf("overlay %q is no longer configured: its leases are kept, disabled", d.api.Name))
	}
	// Kept overlays win over new ones that would overlap them.
	var final []api.OverlayNetwork
	for _, o := range overlays {
		probe := cfg
		probe.Overlays = append(append([]api.OverlayNetwork{}, keptDropped...), o)
		if _, err := parseNetwork(probe); err != nil && len(keptDropped) > 0 {
			if _, alone := parseNetwork(withOverlays(cfg, o)); alone == nil {
				warnings = append(warnings, fmt.Sprintf("overlay %q left out: it overlaps an overlay whose leases are kept (%v)", o.Name, err))
				continue
			}
		}
		final = append(final, o)
	}
	cfg.Overlays = append(final, keptDropped...)
	n, err := parseNetwork(cfg)
	if err != nil {
		return nil, warnings, err
	}
	return n, warnings, nil
}

func withOverlays(cfg api.NetworkConfig, o ...api.OverlayNetwork) api.NetworkConfig {
	cfg.Overlays = o
	return cfg
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

func configEqual(a, b api.NetworkConfig) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}
