package vxlan_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/vxlan"
)

func TestVTEPMTUFor(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00::11")
	tests := []struct {
		underlay int
		local    netip.Addr
		extra    int
		want     int
	}{
		{1500, v4, 0, 1450},
		{1500, v6, 0, 1430},
		{9000, v4, 0, 8950},
		{1500, v4, 60, 1390}, // inside WireGuard over IPv4
		{1500, v6, 80, 1350}, // inside WireGuard over IPv6
		{1500, netip.MustParseAddr("::ffff:198.18.0.11"), 0, 1450},
		{40, v4, 0, 0},
	}
	for _, tt := range tests {
		if got := vxlan.VTEPMTUFor(tt.underlay, tt.local, tt.extra); got != tt.want {
			t.Errorf("VTEPMTUFor(%d, %s, %d) = %d, want %d", tt.underlay, tt.local, tt.extra, got, tt.want)
		}
	}
}

// TestUnderlayMTU reads the MTU of the link carrying the underlay IP, and
// says so when no link carries it.
func TestUnderlayMTU(t *testing.T) {
	e := newEnv(t)
	if err := e.lab.SetUnderlayMTU(e.host, 9000); err != nil {
		t.Fatal(err)
	}
	mtu, link, err := e.dp.UnderlayMTU(e.host.IP.Addr())
	if err != nil || mtu != 9000 || link != netnslab.HostLink {
		t.Errorf("UnderlayMTU(%s) = %d, %q, %v; want 9000 on %s", e.host.IP.Addr(), mtu, link, err, netnslab.HostLink)
	}
	if _, _, err := e.dp.UnderlayMTU(netip.MustParseAddr("198.18.9.9")); !errors.Is(err, vxlan.ErrNoUnderlayDevice) {
		t.Errorf("UnderlayMTU of an address no link has: %v, want ErrNoUnderlayDevice", err)
	}
}
