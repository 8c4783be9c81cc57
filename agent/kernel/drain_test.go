package kernel

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestDrainedOverlays: issue 20, finding 4. A disabled overlay keeps its
// bridges and the routes to the peers' subnets of it while a container of
// this host is attached, and loses them when none is.
func TestDrainedOverlays(t *testing.T) {
	self := selfInfo()
	off := false
	self.Overlays[0].Info.Enabled = &off
	peer := rec("b", 4, "198.18.0.11")
	network := &api.NetworkConfig{OverlayMTU: 1400, Overlays: []api.OverlayNetwork{{Name: "carve", Enabled: &off}}}
	for _, tc := range []struct {
		name     string
		attached int
		bridges  []string
		routes   bool
	}{
		{"containers attached: kept", 2, []string{"m-carve", "d-carve"}, true},
		{"the last one left: drained", 0, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drained := drainedOverlays(self, network, func(string) int { return tc.attached })
			here := withoutOverlays(self, drained)
			var bridges []string
			for _, ov := range here.Overlays {
				for _, br := range []*api.BridgeInfo{ov.MesosBridge, ov.DockerBridge} {
					bridges = append(bridges, br.Name)
				}
			}
			if !slices.Equal(bridges, tc.bridges) {
				t.Errorf("bridges %v, want %v", bridges, tc.bridges)
			}
			p, err := peerOf(peerWithout(peer, drained))
			routed := err == nil && slices.Contains(p.Subnets, netip.MustParsePrefix("10.128.2.0/24"))
			if routed != tc.routes {
				t.Errorf("route to the peer's subnet %v, want %v (%+v, %v)", routed, tc.routes, p, err)
			}
			if len(self.Overlays) != 1 {
				t.Fatal("withoutOverlays changed its argument")
			}
		})
	}
	// An enabled overlay is never drained, attached or not.
	if d := drainedOverlays(selfInfo(), &api.NetworkConfig{}, func(string) int { return 0 }); len(d) != 0 {
		t.Errorf("enabled overlay drained: %v", d)
	}
}
