package blockaddr

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/carve-net/carve/ring"
)

func TestBridgeAddressOf(t *testing.T) {
	blocks := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/29"), netip.MustParsePrefix("fd00::/126")}
	for _, tc := range []struct {
		addr string
		edge bool
	}{
		{"10.0.0.0", true},  // network
		{"10.0.0.1", true},  // gateway
		{"10.0.0.7", true},  // broadcast
		{"10.0.0.2", false}, // a host
		{"fd00::1", true},   // gateway
		{"fd00::3", false},  // no broadcast in IPv6
		{"10.0.1.1", false}, // outside
	} {
		if _, edge := BridgeAddressOf(blocks, netip.MustParseAddr(tc.addr)); edge != tc.edge {
			t.Errorf("BridgeAddressOf(%s) = %v, want %v", tc.addr, edge, tc.edge)
		}
	}
}

func TestHostCountAndUncovered(t *testing.T) {
	for _, tc := range []struct {
		p    string
		want uint64
	}{
		{"10.0.0.0/30", 1}, // network, gateway, broadcast
		{"10.0.0.0/24", 253},
		{"fd00::/126", 2},
	} {
		if got := HostCount(netip.MustParsePrefix(tc.p)); got != ring.U128(tc.want) {
			t.Errorf("HostCount(%s) = %v, want %d", tc.p, got, tc.want)
		}
	}
	got := Uncovered(netip.MustParsePrefix("10.0.0.0/24"), []netip.Prefix{netip.MustParsePrefix("10.0.0.0/25")})
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.128/25")}; !slices.Equal(got, want) {
		t.Errorf("Uncovered = %v, want %v", got, want)
	}
}
