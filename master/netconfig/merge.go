package netconfig

import (
	"fmt"

	"github.com/carve-net/carve/api"
)

// merge is Merge. Its warnings and result are part of the replicated
// state machine's outcome: a change here changes what the masters commit.
func merge(cur *Network, cfg api.NetworkConfig, use InUse) (*Network, []string, error) {
	cfg = WithDefaults(cfg)
	if cur == nil {
		n, err := parseNetwork(cfg)
		return n, nil, err
	}
	var warnings []string
	if cfg.VTEPSubnet != cur.cfg.VTEPSubnet && use.VTEP {
		warnings = append(warnings, fmt.Sprintf("vtep_subnet stays %s: agents hold VTEP IPs in it (the new config says %s)", cur.cfg.VTEPSubnet, cfg.VTEPSubnet))
		cfg.VTEPSubnet = cur.cfg.VTEPSubnet
	}
	if cfg.VTEPSubnet6 != cur.cfg.VTEPSubnet6 && use.VTEP6 {
		warnings = append(warnings, fmt.Sprintf("vtep_subnet6 stays %q: agents hold IPv6 VTEP addresses in it (the new config says %q)", cur.cfg.VTEPSubnet6, cfg.VTEPSubnet6))
		cfg.VTEPSubnet6 = cur.cfg.VTEPSubnet6
	}
	leased := use.Overlays
	oldDefs := map[string]Overlay{}
	for _, d := range cur.overlays {
		oldDefs[d.cfg.Name] = d
	}
	var overlays []api.OverlayNetwork
	named := map[string]bool{}
	for _, o := range cfg.Overlays {
		named[o.Name] = true
		if old, ok := oldDefs[o.Name]; ok && leased[o.Name] &&
			(o.Subnet != old.cfg.Subnet || o.Prefix != old.cfg.Prefix || o.Subnet6 != old.cfg.Subnet6 || o.Prefix6 != old.cfg.Prefix6) {
			warnings = append(warnings, fmt.Sprintf("overlay %q keeps subnet %q/%d subnet6 %q/%d: agents hold leases in it", o.Name, old.cfg.Subnet, old.cfg.Prefix, old.cfg.Subnet6, old.cfg.Prefix6))
			kept := old.cfg
			kept.Enabled = o.Enabled
			o = kept
		}
		overlays = append(overlays, o)
	}
	var keptDropped []api.OverlayNetwork
	for _, d := range cur.overlays {
		if named[d.cfg.Name] || !leased[d.cfg.Name] {
			continue
		}
		kept := d.cfg
		kept.Enabled = new(bool)
		keptDropped = append(keptDropped, kept)
		warnings = append(warnings, fmt.Sprintf("overlay %q is no longer configured: its leases are kept, disabled", d.cfg.Name))
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
