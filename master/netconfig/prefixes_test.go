package netconfig

import (
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

// withOverlay is the default configuration with the one overlay o.
func withOverlay(o api.OverlayNetwork) api.NetworkConfig {
	c := Default()
	c.Overlays = []api.OverlayNetwork{o}
	return c
}

// grow_prefix defaults to half an agent's subnet and is validated between
// the agent prefix and a host prefix; grown blocks take its size
// (master/state's TestGrowPrefixConfig grows one).
func TestGrowPrefixConfig(t *testing.T) {
	tests := []struct {
		name string
		o    api.OverlayNetwork
		want string // error substring; "" for valid
		bits int    // GrowBits(true) when valid
	}{
		{"default", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24}, "", 25},
		{"smaller blocks", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24, GrowPrefix: 28}, "", 28},
		{"a whole prefix", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24, GrowPrefix: 24}, "", 24},
		{"larger than prefix", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24, GrowPrefix: 23}, "grow_prefix: 23 must be between", 0},
		{"too long", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24, GrowPrefix: 31}, "grow_prefix: 31", 0},
		{"without subnet", api.OverlayNetwork{Name: "g", Subnet6: "fd09::/48", Prefix6: 64, GrowPrefix: 25}, "grow_prefix: set without subnet", 0},
		{"v6", api.OverlayNetwork{Name: "g", Subnet6: "fd09::/48", Prefix6: 64, GrowPrefix6: 127}, "grow_prefix6: 127", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := New(withOverlay(tt.o))
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("%v, want %q", err, tt.want)
			}
			if err == nil && n.overlays[0].GrowBits(true) != tt.bits {
				t.Errorf("grow /%d, want /%d", n.overlays[0].GrowBits(true), tt.bits)
			}
		})
	}
}

// quota_prefix defaults to 16 times an agent's subnet (never more than the
// overlay) and is validated between the subnet and the grow prefix.
func TestQuotaPrefixConfig(t *testing.T) {
	tests := []struct {
		name      string
		o         api.OverlayNetwork
		want      string // error substring; "" for valid
		bits, bt6 int
	}{
		{"default", api.OverlayNetwork{Name: "g", Subnet: "10.128.0.0/9", Prefix: 24}, "", 20, 0},
		{"default within a small overlay", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/22", Prefix: 24}, "", 22, 0},
		{"set", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24, QuotaPrefix: 23}, "", 23, 0},
		{"one grown block", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24, QuotaPrefix: 25}, "", 25, 0},
		{"v6 default", api.OverlayNetwork{Name: "g", Subnet6: "fd09::/48", Prefix6: 64}, "", 0, 60},
		{"smaller than a grown block", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24, QuotaPrefix: 26}, "quota_prefix: 26 must be between the subnet's /16 and the grow prefix /25", 0, 0},
		{"larger than the overlay", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24, QuotaPrefix: 15}, "quota_prefix: 15", 0, 0},
		{"without subnet", api.OverlayNetwork{Name: "g", Subnet6: "fd09::/48", Prefix6: 64, QuotaPrefix: 20}, "quota_prefix: set without subnet", 0, 0},
		{"v6 without subnet6", api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/16", Prefix: 24, QuotaPrefix6: 60}, "quota_prefix6: set without subnet6", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := New(withOverlay(tt.o))
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("%v, want %q", err, tt.want)
			}
			if err == nil && (n.overlays[0].QuotaBits(true) != tt.bits || n.overlays[0].QuotaBits(false) != tt.bt6) {
				t.Errorf("quota /%d and /%d, want /%d and /%d", n.overlays[0].QuotaBits(true), n.overlays[0].QuotaBits(false), tt.bits, tt.bt6)
			}
		})
	}
}
