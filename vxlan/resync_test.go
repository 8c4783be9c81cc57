package vxlan_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestResyncRepairs changes entries by hand: Apply (which trusts what it
// applied) does not see it, Resync repairs it.
func TestResyncRepairs(t *testing.T) {
	p2 := peer(2)
	ll := func(s string) *netlink.Neigh {
		return &netlink.Neigh{IP: net.ParseIP(s), State: netlink.NUD_PERMANENT}
	}
	cases := []struct {
		name   string
		change func(t *testing.T, e *env, idx int) error
	}{
		{"neighbour deleted", func(t *testing.T, e *env, idx int) error {
			n := ll(p2.VTEPIP.String())
			n.LinkIndex = idx
			return e.nl.NeighDel(n)
		}},
		{"neighbour MAC altered", func(t *testing.T, e *env, idx int) error {
			n := ll(p2.VTEPIP.String())
			n.LinkIndex, n.HardwareAddr = idx, mustMAC("02:00:00:00:00:01")
			return e.nl.NeighSet(n)
		}},
		{"neighbour made dynamic", func(t *testing.T, e *env, idx int) error {
			n := ll(p2.VTEPIP.String())
			n.LinkIndex, n.HardwareAddr, n.State = idx, p2.VTEPMAC, netlink.NUD_REACHABLE
			return e.nl.NeighSet(n)
		}},
		{"fdb deleted", func(t *testing.T, e *env, idx int) error {
			return e.nl.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
				HardwareAddr: p2.VTEPMAC, IP: net.IP(p2.UnderlayIP.AsSlice())})
		}},
		{"fdb dst altered", func(t *testing.T, e *env, idx int) error {
			return e.nl.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
				State: netlink.NUD_PERMANENT, HardwareAddr: p2.VTEPMAC, IP: net.ParseIP("198.18.7.7")})
		}},
		{"route deleted", func(t *testing.T, e *env, idx int) error {
			_, dst, _ := net.ParseCIDR(p2.Subnets[0].String())
			return e.nl.RouteDel(&netlink.Route{Dst: dst, Protocol: vxlan.Protocol})
		}},
		{"route altered by hand", func(t *testing.T, e *env, idx int) error {
			// `ip route replace` of carve's route (same prefix and metric).
			_, dst, _ := net.ParseCIDR(p2.Subnets[0].String())
			return e.nl.RouteReplace(&netlink.Route{Dst: dst, LinkIndex: idx, Gw: net.ParseIP("100.64.0.99"),
				Flags: int(netlink.FLAG_ONLINK), Protocol: unix.RTPROT_BOOT, Priority: metric(p2.VTEPIP)})
		}},
		{"bridge deleted", func(t *testing.T, e *env, idx int) error {
			l, err := e.nl.LinkByName("m-carve")
			if err != nil {
				return err
			}
			return e.nl.LinkDel(l)
		}},
		{"bridge address and MTU altered", func(t *testing.T, e *env, idx int) error {
			l, err := e.nl.LinkByName("m-carve")
			if err != nil {
				return err
			}
			a, _ := netlink.ParseAddr("10.128.1.1/25")
			if err := e.nl.AddrDel(l, a); err != nil {
				return err
			}
			b, _ := netlink.ParseAddr("10.128.1.65/26")
			if err := e.nl.AddrAdd(l, b); err != nil {
				return err
			}
			return e.nl.LinkSetMTU(l, 1300)
		}},
		{"ip_forward off", func(t *testing.T, e *env, idx int) error {
			return e.host.SetSysctl("net.ipv4.ip_forward", "0")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			d := desiredN(3)
			apply(t, e.dp, d)
			ks := readKernel(t, e.nl)
			if err := tc.change(t, e, ks.vtepIndex); err != nil {
				t.Fatalf("change by hand: %v", err)
			}
			assertNoChange(t, "Apply (does not read the kernel)", apply(t, e.dp, d))
			rep := resync(t, e.dp, d)
			if rep.Changes() == 0 {
				t.Fatal("Resync repaired nothing")
			}
			assertKernel(t, e.nl, d)
			assertAddrs(t, e.nl, "m-carve", "10.128.1.1/25")
			if br, err := e.nl.LinkByName("m-carve"); err != nil || br.Attrs().MTU != 1420 {
				t.Errorf("bridge not repaired: %v", err)
			}
			if v, _ := e.host.Sysctl("net.ipv4.ip_forward"); v != "1" {
				t.Errorf("ip_forward = %s", v)
			}
			assertNoChange(t, "second Resync", resync(t, e.dp, d))
		})
	}
}

// TestForeignEntriesSurvive: routes, neighbours, FDB entries and bridges that
// carve did not create survive reconciles, also ones removing peers.
func TestForeignEntriesSurvive(t *testing.T) {
	e := newEnv(t)
	d := desiredN(3)
	apply(t, e.dp, d)
	idx := readKernel(t, e.nl).vtepIndex

	// A device of the operator's, with an address, route and neighbour.
	if err := e.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "other0"}, PeerName: "other1"}); err != nil {
		t.Fatal(err)
	}
	other, _ := e.nl.LinkByName("other0")
	must(t, e.nl.LinkSetUp(other))
	a, _ := netlink.ParseAddr("192.168.77.1/24")
	must(t, e.nl.AddrAdd(other, a))
	_, foreignNet, _ := net.ParseCIDR("172.31.0.0/16")
	must(t, e.nl.RouteAdd(&netlink.Route{Dst: foreignNet, Gw: net.ParseIP("192.168.77.2"), LinkIndex: other.Attrs().Index}))
	must(t, e.nl.NeighAdd(&netlink.Neigh{LinkIndex: other.Attrs().Index, IP: net.ParseIP("192.168.77.2"),
		HardwareAddr: mustMAC("02:00:00:00:00:02"), State: netlink.NUD_PERMANENT}))
	// On the VTEP itself: a route and a permanent neighbour without carve's
	// mark, and the all-zero (flooding) FDB entry.
	_, vtepForeign, _ := net.ParseCIDR("10.250.0.0/16")
	must(t, e.nl.RouteAdd(&netlink.Route{Dst: vtepForeign, Gw: net.ParseIP("100.64.0.250"), LinkIndex: idx,
		Flags: int(netlink.FLAG_ONLINK), Protocol: unix.RTPROT_STATIC}))
	must(t, e.nl.NeighAdd(&netlink.Neigh{LinkIndex: idx, IP: net.ParseIP("100.64.0.250"),
		HardwareAddr: mustMAC("02:00:00:00:00:fa"), State: netlink.NUD_PERMANENT}))
	must(t, e.nl.NeighAppend(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT, HardwareAddr: make(net.HardwareAddr, 6), IP: net.ParseIP("198.18.0.250")}))
	// A bridge of the operator's.
	must(t, e.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "user-br"}}))
	// An operator's override of the route to peer 2's subnet (metric 0
	// beats carve's), on another device.
	_, p2net, _ := net.ParseCIDR(subnet(2).String())
	must(t, e.nl.RouteAdd(&netlink.Route{Dst: p2net, Gw: net.ParseIP("192.168.77.3"), LinkIndex: other.Attrs().Index}))

	smaller := desiredN(1)
	apply(t, e.dp, smaller)
	resync(t, e.dp, smaller)
	smaller.Bridges = nil
	apply(t, e.dp, smaller)
	resync(t, e.dp, smaller)

	ks := readKernel(t, e.nl)
	if _, err := e.nl.LinkByName("m-carve"); err == nil {
		t.Error("carve's bridge m-carve survived its removal from the desired state")
	}
	if _, err := e.nl.LinkByName("user-br"); err != nil {
		t.Errorf("user-br: %v", err)
	}
	routes, err := e.nl.RouteList(nil, netlink.FAMILY_V4)
	must(t, err)
	found := map[string]bool{}
	for _, r := range routes {
		if r.Dst != nil {
			found[r.Dst.String()] = true
		}
	}
	override := false
	for _, r := range routes {
		if r.Dst != nil && r.Dst.String() == subnet(2).String() && r.LinkIndex == other.Attrs().Index && r.Priority == 0 {
			override = true
		}
	}
	if !override {
		t.Error("the operator's override route was removed")
	}
	for _, want := range []string{"172.31.0.0/16", "10.250.0.0/16"} {
		if !found[want] {
			t.Errorf("foreign route %s removed", want)
		}
	}
	if ks.neigh[netip.MustParseAddr("100.64.0.250")] != "02:00:00:00:00:fa" {
		t.Error("foreign neighbour on the VTEP removed")
	}
	if ks.fdb["00:00:00:00:00:00"] != "198.18.0.250" {
		t.Errorf("flooding FDB entry removed: %v", ks.fdb)
	}
	neighs, err := e.nl.NeighList(other.Attrs().Index, netlink.FAMILY_V4)
	must(t, err)
	if len(neighs) == 0 {
		t.Error("foreign neighbour on other0 removed")
	}
	// carve's entries of the removed peers are gone, the remaining one is there
	if len(ks.routes) != 1 || ks.fdb[vtepMAC(2).String()] != underlayIP(2).String() {
		t.Errorf("carve entries: routes %v fdb %v", ks.routes, ks.fdb)
	}
}
