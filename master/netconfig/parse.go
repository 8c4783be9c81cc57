package netconfig

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/carve-net/carve/api"
)

func configErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
}

// parseNetwork validates every rule the lease table applies and returns
// the parsed form (New).
func parseNetwork(cfg api.NetworkConfig) (*Network, error) {
	n := &Network{cfg: cfg}
	var err error
	n.vtepNet, err = parseCanonicalPrefix(cfg.VTEPSubnet)
	if err != nil {
		return nil, configErr("vtep_subnet", "%v", err)
	}
	if !n.vtepNet.Addr().Is4() {
		return nil, configErr("vtep_subnet", "%s is not an IPv4 subnet", cfg.VTEPSubnet)
	}
	if n.vtepNet.Bits() < 8 {
		return nil, configErr("vtep_subnet", "prefix length /%d is shorter than /8 (the VTEP MAC takes the VTEP IP's low 24 bits)", n.vtepNet.Bits())
	}
	if n.vtepNet.Bits() > 30 {
		return nil, configErr("vtep_subnet", "prefix length /%d leaves no room for VTEP addresses (at most /30)", n.vtepNet.Bits())
	}
	if cfg.VTEPSubnet6 != "" {
		if n.vtepNet6, err = parseCanonicalPrefix(cfg.VTEPSubnet6); err != nil {
			return nil, configErr("vtep_subnet6", "%v", err)
		}
		if n.vtepNet6.Addr().Is4() {
			return nil, configErr("vtep_subnet6", "%s is not an IPv6 subnet", cfg.VTEPSubnet6)
		}
		if n.vtepNet6.Bits() > 126 {
			return nil, configErr("vtep_subnet6", "prefix length /%d leaves no room for VTEP addresses (at most /126)", n.vtepNet6.Bits())
		}
	}
	mac, err := net.ParseMAC(cfg.VTEPMACOUI)
	if err != nil || len(mac) != 6 {
		return nil, configErr("vtep_mac_oui", "%q is not a MAC address like 70:B3:D5:00:00:00", cfg.VTEPMACOUI)
	}
	if mac[3] != 0 || mac[4] != 0 || mac[5] != 0 {
		return nil, configErr("vtep_mac_oui", "%s: the three low bytes must be zero", cfg.VTEPMACOUI)
	}
	if mac[0]&1 == 1 {
		return nil, configErr("vtep_mac_oui", "%s is a multicast address", cfg.VTEPMACOUI)
	}
	copy(n.oui[:], mac[:3])
	if err := api.ValidateIfName(cfg.VTEPName); err != nil {
		return nil, configErr("vtep_name", "%v", err)
	}
	if cfg.VNI < 1 || cfg.VNI > 1<<24-1 {
		return nil, configErr("vni", "%d is outside 1-16777215", cfg.VNI)
	}
	if cfg.VTEPPort == 0 {
		return nil, configErr("vtep_port", "must be 1-65535")
	}
	minMTU := 552
	for _, o := range cfg.Overlays {
		if o.Subnet6 != "" {
			minMTU = 1280
		}
	}
	if cfg.VTEPSubnet6 != "" {
		minMTU = 1280
	}
	// 0 (absent): the agents follow the underlay.
	if cfg.VTEPMTU != 0 && (cfg.VTEPMTU < minMTU || cfg.VTEPMTU > 65535) {
		return nil, configErr("vtep_mtu", "%d is outside %d-65535 (or leave it out to follow the underlay)", cfg.VTEPMTU, minMTU)
	}
	if cfg.OverlayMTU != 0 && (cfg.OverlayMTU < minMTU || cfg.OverlayMTU > 65535) {
		return nil, configErr("overlay_mtu", "%d is outside %d-65535 (or leave it out to follow the underlay)", cfg.OverlayMTU, minMTU)
	}
	if err := validateEncryption(cfg); err != nil {
		return nil, err
	}
	if err := validateDataplane(cfg); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, o := range cfg.Overlays {
		field := fmt.Sprintf("overlays[%d]", i)
		if err := api.ValidateOverlayName(o.Name); err != nil {
			return nil, configErr(field+".name", "%v", err)
		}
		if seen[o.Name] {
			return nil, configErr(field+".name", "%q is used twice", o.Name)
		}
		seen[o.Name] = true
		def := Overlay{cfg: o, enabled: o.IsEnabled()}
		if o.Subnet == "" && o.Subnet6 == "" {
			return nil, configErr(field, "overlay %q has neither subnet nor subnet6", o.Name)
		}
		if o.Subnet != "" {
			def.subnet, err = parseCanonicalPrefix(o.Subnet)
			if err != nil {
				return nil, configErr(field+".subnet", "%v", err)
			}
			if !def.subnet.Addr().Is4() {
				return nil, configErr(field+".subnet", "%s is not IPv4 (IPv6 goes in subnet6)", o.Subnet)
			}
			if o.Prefix <= def.subnet.Bits() || o.Prefix > 30 {
				return nil, configErr(field+".prefix", "%d must be longer than the subnet's /%d and at most 30", o.Prefix, def.subnet.Bits())
			}
			def.prefix = o.Prefix
			if def.growPrefix, err = growPrefix(field+".grow_prefix", o.GrowPrefix, o.Prefix, 30); err != nil {
				return nil, err
			}
			if def.quotaPrefix, err = quotaPrefix(field+".quota_prefix", o.QuotaPrefix, def.subnet, o.Prefix, def.growPrefix); err != nil {
				return nil, err
			}
		} else if o.QuotaPrefix != 0 {
			return nil, configErr(field+".quota_prefix", "set without subnet")
		} else if o.Prefix != 0 {
			return nil, configErr(field+".prefix", "set without subnet")
		} else if o.GrowPrefix != 0 {
			return nil, configErr(field+".grow_prefix", "set without subnet")
		}
		if o.Subnet6 != "" {
			def.subnet6, err = parseCanonicalPrefix(o.Subnet6)
			if err != nil {
				return nil, configErr(field+".subnet6", "%v", err)
			}
			if def.subnet6.Addr().Is4() {
				return nil, configErr(field+".subnet6", "%s is not IPv6", o.Subnet6)
			}
			if o.Prefix6 <= def.subnet6.Bits() || o.Prefix6 > 126 {
				return nil, configErr(field+".prefix6", "%d must be longer than the subnet6's /%d and at most 126", o.Prefix6, def.subnet6.Bits())
			}
			def.prefix6 = o.Prefix6
			if def.growPrefix6, err = growPrefix(field+".grow_prefix6", o.GrowPrefix6, o.Prefix6, 126); err != nil {
				return nil, err
			}
			if def.quotaPrefix6, err = quotaPrefix(field+".quota_prefix6", o.QuotaPrefix6, def.subnet6, o.Prefix6, def.growPrefix6); err != nil {
				return nil, err
			}
		} else if o.QuotaPrefix6 != 0 {
			return nil, configErr(field+".quota_prefix6", "set without subnet6")
		} else if o.Prefix6 != 0 {
			return nil, configErr(field+".prefix6", "set without subnet6")
		} else if o.GrowPrefix6 != 0 {
			return nil, configErr(field+".grow_prefix6", "set without subnet6")
		}
		if def.subnet.IsValid() && def.subnet.Overlaps(n.vtepNet) {
			return nil, configErr(field+".subnet", "%s overlaps vtep_subnet %s", def.subnet, n.vtepNet)
		}
		if def.subnet6.IsValid() && n.vtepNet6.IsValid() && def.subnet6.Overlaps(n.vtepNet6) {
			return nil, configErr(field+".subnet6", "%s overlaps vtep_subnet6 %s", def.subnet6, n.vtepNet6)
		}
		for j, prev := range n.overlays {
			if def.subnet.IsValid() && prev.subnet.IsValid() && def.subnet.Overlaps(prev.subnet) {
				return nil, configErr(field+".subnet", "%s overlaps overlays[%d] (%s) subnet %s", def.subnet, j, prev.cfg.Name, prev.subnet)
			}
			if def.subnet6.IsValid() && prev.subnet6.IsValid() && def.subnet6.Overlaps(prev.subnet6) {
				return nil, configErr(field+".subnet6", "%s overlaps overlays[%d] (%s) subnet6 %s", def.subnet6, j, prev.cfg.Name, prev.subnet6)
			}
		}
		n.overlays = append(n.overlays, def)
	}
	return n, nil
}

// growPrefix validates a grow_prefix: 0 means a bridge's first sub-subnet
// (prefix+1); else at least prefix (a grown block is never larger than an
// agent's first lease) and at most maxBits.
func growPrefix(field string, grow, prefix, maxBits int) (int, error) {
	if grow == 0 {
		return prefix + 1, nil
	}
	if grow < prefix || grow > maxBits {
		return 0, configErr(field, "%d must be between the prefix /%d and /%d", grow, prefix, maxBits)
	}
	return grow, nil
}

// quotaPrefix validates a quota_prefix: 0 means the default (prefix-4,
// never shorter than the subnet's); else between the subnet's length (the
// whole overlay) and the grow prefix (at least one grown block).
func quotaPrefix(field string, quota int, subnet netip.Prefix, prefix, grow int) (int, error) {
	if quota == 0 {
		return api.DefaultQuotaPrefix(subnet, prefix), nil
	}
	if quota < subnet.Bits() || quota > grow {
		return 0, configErr(field, "%d must be between the subnet's /%d and the grow prefix /%d (one grown block)", quota, subnet.Bits(), grow)
	}
	return quota, nil
}

// validateDataplane checks dataplane and segments: a known mode, segments
// only with the routed one, each a canonical prefix, and never routed with
// encryption (a routed peer's traffic is in the clear).
func validateDataplane(cfg api.NetworkConfig) error {
	if !slices.Contains(api.DataplaneModes, cfg.Dataplane) {
		return configErr("dataplane", "%q: want %q, %q, or absent (vxlan)", cfg.Dataplane, api.DataplaneVXLAN, api.DataplaneRouted)
	}
	if cfg.Dataplane == api.DataplaneRouted && cfg.Encryption != "" {
		return configErr("dataplane", "%q with encryption %q: encrypted traffic is never routed in the clear; remove one of the two", cfg.Dataplane, cfg.Encryption)
	}
	if len(cfg.Segments) > 0 && cfg.Dataplane != api.DataplaneRouted {
		return configErr("segments", "only the routed dataplane uses segments: set \"dataplane\": %q or remove them", api.DataplaneRouted)
	}
	for i, s := range cfg.Segments {
		if _, err := parseCanonicalPrefix(s); err != nil {
			return configErr(fmt.Sprintf("segments[%d]", i), "%v", err)
		}
	}
	return nil
}

// parseCanonicalPrefix is CanonicalPrefix.
func parseCanonicalPrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR subnet", s)
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q: zones are not allowed", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set (did you mean %s?)", s, p.Masked())
	}
	return p, nil
}
