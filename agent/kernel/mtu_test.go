package kernel

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
)

func TestPlanMTUs(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00::11")
	recs := func(mtus ...int) []membership.PeerRecord {
		var out []membership.PeerRecord
		for i, m := range mtus {
			out = append(out, membership.PeerRecord{ID: "a" + string(rune('0'+i)), UnderlayMTU: m})
		}
		return out
	}
	tests := []struct {
		name          string
		network       *api.NetworkConfig
		local         netip.Addr
		own           int
		records       []membership.PeerRecord
		vtep, overlay int
		underlay      int
		conflicts     []string // fields named by the warnings
	}{
		{name: "nothing known: former defaults", local: v4, vtep: 1450, overlay: 1420},
		{name: "own underlay, IPv4", local: v4, own: 9000, vtep: 8950, overlay: 8950, underlay: 9000},
		{name: "own underlay, IPv6", local: v6, own: 9000, vtep: 8930, overlay: 8930, underlay: 9000},
		{name: "smallest record wins", local: v4, own: 9000, records: recs(9000, 1500, 0), vtep: 1450, overlay: 1450, underlay: 1500},
		{name: "own unknown, records known", local: v4, records: recs(9000, 4000), vtep: 3950, overlay: 3950, underlay: 4000},
		{name: "configured MTUs are kept", network: &api.NetworkConfig{VTEPMTU: 1400, OverlayMTU: 1380}, local: v4, own: 1500,
			vtep: 1400, overlay: 1380, underlay: 1500},
		{name: "configured VTEP MTU sets the overlay's", network: &api.NetworkConfig{VTEPMTU: 1400}, local: v4, own: 9000,
			vtep: 1400, overlay: 1400, underlay: 9000},
		{name: "configured overlay MTU, VTEP follows", network: &api.NetworkConfig{OverlayMTU: 8000}, local: v4, own: 9000,
			vtep: 8950, overlay: 8000, underlay: 9000},
		{name: "overlay MTU above what the smallest underlay leaves", network: &api.NetworkConfig{OverlayMTU: 8950}, local: v4, own: 9000,
			records: recs(1500), vtep: 1450, overlay: 8950, underlay: 1500, conflicts: []string{"overlay_mtu"}},
		{name: "both above", network: &api.NetworkConfig{VTEPMTU: 1500, OverlayMTU: 1480}, local: v4, own: 1500,
			vtep: 1500, overlay: 1480, underlay: 1500, conflicts: []string{"vtep_mtu", "overlay_mtu"}},
		// With encryption on, packets to keyed peers go through WireGuard
		// (60 bytes over IPv4, 80 over IPv6) rather than VXLAN (50, 70).
		{name: "encryption, IPv4", network: &api.NetworkConfig{Encryption: api.EncryptionWireGuard}, local: v4, own: 1500,
			vtep: 1440, overlay: 1440, underlay: 1500},
		{name: "strict encryption, IPv6, jumbo", network: &api.NetworkConfig{Encryption: api.EncryptionWireGuardStrict}, local: v6, own: 9000,
			records: recs(9000), vtep: 8920, overlay: 8920, underlay: 9000},
		{name: "encryption: a configured overlay MTU above what WireGuard leaves", network: &api.NetworkConfig{Encryption: api.EncryptionWireGuard, OverlayMTU: 1450},
			local: v4, own: 1500, vtep: 1440, overlay: 1450, underlay: 1500, conflicts: []string{"overlay_mtu"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planMTUs(tt.network, tt.local, "self", tt.own, tt.records)
			if p.VTEP != tt.vtep || p.Overlay != tt.overlay || p.Underlay != tt.underlay {
				t.Errorf("vtep %d overlay %d underlay %d, want %d %d %d", p.VTEP, p.Overlay, p.Underlay, tt.vtep, tt.overlay, tt.underlay)
			}
			if len(p.Conflicts) != len(tt.conflicts) {
				t.Fatalf("conflicts %q, want ones naming %q", p.Conflicts, tt.conflicts)
			}
			for i, field := range tt.conflicts {
				if c := p.Conflicts[i]; !strings.HasPrefix(c, field+" ") || !strings.Contains(c, "set "+field+" to at most") {
					t.Errorf("conflict %q does not name %s and its fix", c, field)
				}
			}
		})
	}
}
