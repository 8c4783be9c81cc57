package state

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

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
