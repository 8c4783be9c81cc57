package vxlan_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestForgetNeighbour: the entry the kernel learned for a freed address goes;
// entries set by hand, other addresses and missing bridges are left alone.
func TestForgetNeighbour(t *testing.T) {
	e := newEnv(t)
	must(t, e.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "m-carve"}}))
	br, err := e.nl.LinkByName("m-carve")
	must(t, err)
	must(t, e.nl.LinkSetUp(br))
	idx := br.Attrs().Index
	entries := []struct {
		ip    string
		state int
	}{
		{"10.128.1.5", unix.NUD_REACHABLE},
		{"10.128.1.6", unix.NUD_PERMANENT},
		{"10.128.1.7", unix.NUD_STALE},
		{"fd00:1::5", unix.NUD_REACHABLE},
	}
	for _, n := range entries {
		ip := net.ParseIP(n.ip)
		fam := netlink.FAMILY_V4
		if ip.To4() == nil {
			fam = netlink.FAMILY_V6
		}
		must(t, e.nl.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: fam, State: n.state, IP: ip, HardwareAddr: mustMAC("02:00:00:00:00:05")}))
	}
	tests := []struct {
		name   string
		bridge string
		addr   string
		want   bool
		kept   []string // entries still there afterwards
	}{
		{"learned entry", "m-carve", "10.128.1.5", true, []string{"10.128.1.6", "10.128.1.7", "fd00:1::5"}},
		{"again: nothing left", "m-carve", "10.128.1.5", false, []string{"10.128.1.6", "10.128.1.7", "fd00:1::5"}},
		{"set by hand", "m-carve", "10.128.1.6", false, []string{"10.128.1.6", "10.128.1.7", "fd00:1::5"}},
		{"no such entry", "m-carve", "10.128.1.9", false, []string{"10.128.1.6", "10.128.1.7", "fd00:1::5"}},
		{"no such bridge", "d-carve", "10.128.1.7", false, []string{"10.128.1.6", "10.128.1.7", "fd00:1::5"}},
		{"IPv6", "m-carve", "fd00:1::5", true, []string{"10.128.1.6", "10.128.1.7"}},
		{"stale entry", "m-carve", "10.128.1.7", true, []string{"10.128.1.6"}},
	}
	for _, tt := range tests {
		got, err := e.dp.ForgetNeighbour(tt.bridge, netip.MustParseAddr(tt.addr))
		if err != nil || got != tt.want {
			t.Fatalf("%s: ForgetNeighbour(%s, %s) = %v, %v; want %v", tt.name, tt.bridge, tt.addr, got, err, tt.want)
		}
		neighs, err := e.nl.NeighList(idx, netlink.FAMILY_ALL)
		must(t, err)
		var left []string
		for _, n := range neighs {
			if n.State&unix.NUD_NOARP == 0 && !n.IP.IsLinkLocalMulticast() && !n.IP.IsMulticast() {
				left = append(left, n.IP.String())
			}
		}
		if !sameSet(left, tt.kept) {
			t.Fatalf("%s: entries left %v, want %v", tt.name, left, tt.kept)
		}
	}
	e.dp.Close()
	if _, err := e.dp.ForgetNeighbour("m-carve", netip.MustParseAddr("10.128.1.6")); err == nil {
		t.Error("ForgetNeighbour on a closed dataplane succeeded")
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		if m[x]--; m[x] < 0 {
			return false
		}
	}
	return true
}
