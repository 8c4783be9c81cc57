package state

import (
	"slices"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestExhaustedOverlays (issue 27, "health is the truth"): an overlay whose
// subnets are all leased names the agents left without one; one with no
// block left to grow into is full only once every holder reported no free
// address, and not while one reports some.
func TestExhaustedOverlays(t *testing.T) {
	h := newHarness(t, cfgWith(
		api.OverlayNetwork{Name: "small", Subnet: "10.1.0.0/29", Prefix: 30}, // two /30s
		api.OverlayNetwork{Name: "big", Subnet: "10.2.0.0/16", Prefix: 24},
	))
	if got := h.table.Exhausted(); len(got) != 0 {
		t.Fatalf("an empty table: %+v, want nothing exhausted", got)
	}
	a1 := h.mustRegister("a1", "198.18.0.1")
	a2 := h.mustRegister("a2", "198.18.0.2")
	h.mustRegister("a3", "198.18.0.3")
	h.mustRegister("a4", "198.18.0.4")

	got := h.table.Exhausted()
	if len(got) != 1 || got[0].Overlay != "small" || got[0].Family != 4 || got[0].UnleasedCount != 2 || !slices.Equal(got[0].Unleased, []string{"a3", "a4"}) || got[0].Full {
		t.Fatalf("two agents without a subnet of small: %+v, want small/4 naming a3 and a4, not judged full before usage reports", got)
	}

	report := func(a *api.AgentInfo, free uint64) {
		t.Helper()
		var blocks []api.BlockUsage
		for _, b := range a.Overlay("small").Blocks {
			blocks = append(blocks, api.BlockUsage{Prefix: b.Prefix, Used: 2 - free, Free: free})
			free = 0
		}
		if _, err := h.table.RecordUsage(a.AgentID, &api.UsageReport{Overlays: []api.OverlayUsage{{Name: "small", Blocks: blocks}}}); err != nil {
			t.Fatalf("usage of %s: %v", a.AgentID, err)
		}
	}
	report(a1, 0)
	if got := h.table.Exhausted(); got[0].Full {
		t.Fatalf("one holder of two reported: %+v, want not judged full", got)
	}
	report(a2, 0)
	if got := h.table.Exhausted(); !got[0].Full || got[0].Free != 0 {
		t.Fatalf("every holder reports no free address: %+v, want full", got)
	}
	report(a2, 1)
	if got := h.table.Exhausted(); got[0].Full || got[0].Free != 1 {
		t.Fatalf("a2 reports a free address: %+v, want not full", got)
	}
}
