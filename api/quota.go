package api

import "net/netip"

// An agent's quota of grown and granted space in an overlay
// (OverlayNetwork.QuotaPrefix): the one rule the masters (which refuse a
// grow or a grant report beyond it) and the agents (whose donors refuse a
// space request beyond it) apply.

// DefaultQuotaShift makes the default quota: 16 (2^4) times an agent's
// subnet.
const DefaultQuotaShift = 4

// DefaultQuotaPrefix is the quota an overlay with no quota_prefix gives
// an agent: prefix-DefaultQuotaShift, but never more than the whole
// subnet.
func DefaultQuotaPrefix(subnet netip.Prefix, prefix int) int {
	return max(prefix-DefaultQuotaShift, subnet.Bits())
}

// QuotaBits is the prefix length of one agent's quota of grown and granted
// space in the overlay's IPv4 (or, with v6, IPv6) family: QuotaPrefix or
// QuotaPrefix6, else DefaultQuotaPrefix; 0 when the overlay has no valid
// subnet of that family.
func (o OverlayNetwork) QuotaBits(v6 bool) int {
	subnet, prefix, quota := o.Subnet, o.Prefix, o.QuotaPrefix
	if v6 {
		subnet, prefix, quota = o.Subnet6, o.Prefix6, o.QuotaPrefix6
	}
	p, err := netip.ParsePrefix(subnet)
	if err != nil {
		return 0
	}
	if quota != 0 {
		return quota
	}
	return DefaultQuotaPrefix(p, prefix)
}
