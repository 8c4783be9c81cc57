package record

import (
	"net/netip"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
)

// TestCovers: a lease covers a prefix inside one of its blocks, or split
// over several of them, and nothing with a gap.
func TestCovers(t *testing.T) {
	l := Lease{Blocks: []Block{
		{Prefix: netip.MustParsePrefix("10.0.0.0/25")},
		{Prefix: netip.MustParsePrefix("10.0.0.128/26")},
		{Prefix: netip.MustParsePrefix("10.0.0.192/26")},
		{Prefix: netip.MustParsePrefix("10.0.2.0/24")},
	}}
	tests := []struct {
		prefix string
		want   bool
	}{
		{"10.0.0.0/25", true},
		{"10.0.0.64/26", true},
		{"10.0.0.0/24", true}, // three blocks
		{"10.0.0.255/32", true},
		{"10.0.1.0/24", false},
		{"10.0.0.0/23", false}, // 10.0.1.0/24 is not held
		{"10.0.0.0/22", false},
		{"fd00::/64", false},
	}
	for _, tt := range tests {
		if got := l.Covers(netip.MustParsePrefix(tt.prefix)); got != tt.want {
			t.Errorf("Covers(%s) = %v, want %v", tt.prefix, got, tt.want)
		}
	}
}

// TestCloneIsCopyOnWrite: a clone's leases map is its own; Equal sees
// every field but the version.
func TestCloneIsCopyOnWrite(t *testing.T) {
	rec := &Agent{ID: "a1", Version: 3, Leases: map[string]Lease{"carve": {Subnet: netip.MustParsePrefix("10.0.0.0/24")}}}
	c := rec.Clone()
	c.Version = 9
	if !rec.Equal(c) {
		t.Error("a clone with another version is not Equal")
	}
	c.Leases["other"] = Lease{Failed: "x"}
	if _, ok := rec.Leases["other"]; ok || rec.Equal(c) {
		t.Error("changing a clone's leases changed the record, or Equal missed it")
	}
	if c := (&Agent{ID: "a2"}).Clone(); c.Leases == nil {
		t.Error("a clone of a record without leases has a nil map")
	}
}

// TestRenderOverlays: enabled leased overlays are listed with their
// blocks and bridges, a disabled one without a lease is named in
// not_leased, a draining one (disabled, still leased) is listed with
// "enabled": false, and a failure is named; no configuration renders the
// bare record.
func TestRenderOverlays(t *testing.T) {
	cfg := netconfig.WithDefaults(api.NetworkConfig{Overlays: []api.OverlayNetwork{
		{Name: "on", Subnet: "10.1.0.0/16", Prefix: 24},
		{Name: "off", Subnet: "10.2.0.0/16", Prefix: 24, Enabled: new(false)},
		{Name: "drain", Subnet: "10.3.0.0/16", Prefix: 24, Enabled: new(false)},
		{Name: "full", Subnet: "10.4.0.0/23", Prefix: 24},
	}})
	n, err := netconfig.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lease := func(s string) Lease {
		p := netip.MustParsePrefix(s)
		return Lease{Subnet: p, Blocks: []Block{{Bridge: api.BridgeMesos, Prefix: p, Origin: api.BlockLeased, Home: p, Version: 2}}}
	}
	rec := &Agent{ID: "a1", IP: netip.MustParseAddr("198.18.0.1"), VTEP: netip.MustParseAddr("100.64.0.1"), Version: 2,
		Bridges: api.AgentNetworkConfig{MesosBridge: true},
		Leases:  map[string]Lease{"on": lease("10.1.0.0/24"), "drain": lease("10.3.0.0/24"), "full": {Failed: "exhausted"}}}
	info := Render(n, rec)
	var listed []string
	for _, ov := range info.Overlays {
		listed = append(listed, ov.Info.Name)
		if ov.Info.Name == "drain" && (ov.Info.Enabled == nil || *ov.Info.Enabled) {
			t.Errorf("draining overlay shows enabled %v", ov.Info.Enabled)
		}
		if ov.Info.Name == "on" && (ov.MesosBridge == nil || ov.MesosBridge.IP != "10.1.0.0/25" || ov.DockerBridge != nil || len(ov.Blocks) != 1 || ov.Backend.VXLAN.VTEPIP != "100.64.0.1/16") {
			t.Errorf("overlay on: %+v", ov)
		}
	}
	if want := []string{"on", "drain"}; len(listed) != 2 || listed[0] != want[0] || listed[1] != want[1] {
		t.Errorf("listed %q, want %q", listed, want)
	}
	if len(info.NotLeased) != 2 || info.NotLeased[0].Name != "off" || info.NotLeased[1].Name != "full" || info.NotLeased[1].Reason != "exhausted" {
		t.Errorf("not leased %+v", info.NotLeased)
	}
	if bare := Render(nil, rec); bare.IP != "198.18.0.1" || len(bare.Overlays) != 0 {
		t.Errorf("without a configuration: %+v", bare)
	}
}
