package state

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

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
			n, err := parseNetwork(cfgWith(tt.o))
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("%v, want %q", err, tt.want)
			}
			if err == nil && (n.overlays[0].quotaPrefix != tt.bits || n.overlays[0].quotaPrefix6 != tt.bt6) {
				t.Errorf("quota /%d and /%d, want /%d and /%d", n.overlays[0].quotaPrefix, n.overlays[0].quotaPrefix6, tt.bits, tt.bt6)
			}
		})
	}
}

// An agent grows and receives grants up to its quota; beyond it the grow
// or grant is refused with ErrQuota naming the cap, and changes nothing.
// Its origin lease does not count; returning space makes room again.
func TestQuota(t *testing.T) {
	// A /24 per agent, /25 grown blocks, a quota of a /24: two grown blocks.
	h := newHarness(t, cfgWith(api.OverlayNetwork{Name: "g", Subnet: "10.9.0.0/20", Prefix: 24, QuotaPrefix: 24}))
	h.mustRegister("a1", "198.18.0.1")
	h.mustRegister("a2", "198.18.0.2")
	grow := func(id string) Result {
		return h.apply(command{Op: opGrow, Grow: &growCmd{AgentID: id, Overlay: "g", Bridge: api.BridgeMesos, Family: 4}})
	}
	for i := range 2 {
		if res := grow("a1"); res.Err != nil {
			t.Fatalf("grow %d within the quota: %v", i+1, res.Err)
		}
	}
	before := blocksOf(t, h, "a1")
	res := grow("a1")
	if !errors.Is(res.Err, ErrQuota) || !strings.Contains(res.Err.Error(), "beyond its quota of a /24 (256 addresses)") || !strings.Contains(res.Err.Error(), "quota_prefix") {
		t.Fatalf("grow beyond the quota: %v", res.Err)
	}
	if after := blocksOf(t, h, "a1"); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Errorf("a refused grow changed a1's blocks: %q, was %q", after, before)
	}
	// A grant to a1, full, is refused too; a2 (empty) takes it.
	grant := func(p, donor, recip string) Result {
		return h.apply(command{Op: opGrant, Grant: &grantCmd{Overlay: "g", Prefix: netip.MustParsePrefix(p), Donor: donor, Recipient: recip}})
	}
	a2Lease := agentOf(t, h, "a2").Overlay("g").Subnet
	first := netip.MustParsePrefix(a2Lease).Addr()
	piece := netip.PrefixFrom(first, 27).String()
	if res := grant(piece, "a2", "a1"); !errors.Is(res.Err, ErrQuota) {
		t.Fatalf("grant to a full agent: %v", res.Err)
	}
	checkTable(t, h.table)
	// a1 returns a grown block: room for one more.
	var grown string
	for _, b := range agentOf(t, h, "a1").Overlay("g").Blocks {
		if b.Origin == api.BlockGrown {
			grown = b.Prefix
		}
	}
	if res := h.apply(command{Op: opReturn, Return: &returnCmd{AgentID: "a1", Overlay: "g", Prefix: netip.MustParsePrefix(grown)}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if res := grant(piece, "a2", "a1"); res.Err != nil {
		t.Fatalf("grant after a return: %v", res.Err)
	}
	checkTable(t, h.table)
}

// agentOf is id's record in the harness's table.
func agentOf(t *testing.T, h *tableHarness, id string) *api.AgentInfo {
	t.Helper()
	a, ok := h.table.Agent(id)
	if !ok {
		t.Fatalf("no agent %s", id)
	}
	return a
}
