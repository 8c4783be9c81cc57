package vxlan_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestCreate(t *testing.T) {
	e := newEnv(t)
	rootForward, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	d := desiredN(3)
	rep := apply(t, e.dp, d)
	if !rep.Full {
		t.Error("first Apply should be a full reconcile")
	}
	want := map[string]vxlan.Counts{
		"vtep": {Added: 1}, "neighbours": {Added: 3}, "fdb": {Added: 3}, "routes": {Added: 3},
		"bridges": {Added: 1}, "sysctls": {Updated: 1},
	}
	got := map[string]vxlan.Counts{
		"vtep": rep.VTEP, "neighbours": rep.Neighbours, "fdb": rep.FDB, "routes": rep.Routes,
		"bridges": rep.Bridges, "sysctls": rep.Sysctls,
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("report %s = %+v, want %+v", k, got[k], w)
		}
	}
	assertKernel(t, e.nl, d)

	// The VTEP as DESIGN.md describes it.
	l, err := e.nl.LinkByName(vtepName)
	if err != nil {
		t.Fatal(err)
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		t.Fatalf("VTEP is a %s", l.Type())
	}
	if vx.VxlanId != 1024 || vx.Port != 4789 || vx.Learning || !vx.SrcAddr.Equal(net.IP(d.VTEP.Local.AsSlice())) ||
		vx.HardwareAddr.String() != d.VTEP.MAC.String() || vx.MTU != 1450 || vx.Flags&net.FlagUp == 0 || vx.Alias != vxlan.OwnerAlias {
		t.Errorf("VTEP = id %d port %d learning %v local %s mac %s mtu %d flags %v alias %q",
			vx.VxlanId, vx.Port, vx.Learning, vx.SrcAddr, vx.HardwareAddr, vx.MTU, vx.Flags, vx.Alias)
	}
	assertAddrs(t, e.nl, vtepName, "100.64.0.1/16")

	br, err := e.nl.LinkByName("m-carve")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := br.(*netlink.Bridge); !ok || br.Attrs().MTU != 1420 || br.Attrs().Flags&net.FlagUp == 0 || br.Attrs().Alias != vxlan.OwnerAlias {
		t.Errorf("bridge = %s mtu %d flags %v alias %q", br.Type(), br.Attrs().MTU, br.Attrs().Flags, br.Attrs().Alias)
	}
	assertAddrs(t, e.nl, "m-carve", "10.128.1.1/25")

	if v, err := e.host.Sysctl("net.ipv4.ip_forward"); err != nil || v != "1" {
		t.Errorf("ip_forward in the namespace = %q, %v; want 1", v, err)
	}
	rootAfter, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	if string(rootAfter) != string(rootForward) {
		t.Errorf("root namespace ip_forward changed from %q to %q", rootForward, rootAfter)
	}
}

func assertAddrs(t *testing.T, nh *netlink.Handle, link string, want ...string) {
	t.Helper()
	l, err := nh.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := nh.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		if a.Scope == unix.RT_SCOPE_UNIVERSE {
			got = append(got, a.IPNet.String())
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("addresses of %s = %v, want %v", link, got, want)
	}
}

// TestIdempotent: a second Apply and a Resync change nothing, keep the VTEP
// (same ifindex) and do not flush its neighbours: not a single netlink
// notification is emitted.
func TestIdempotent(t *testing.T) {
	e := newEnv(t)
	d := desiredN(50)
	apply(t, e.dp, d)
	before := assertKernel(t, e.nl, d)

	w := newWatch(t, e.host)
	assertNoChange(t, "second Apply", apply(t, e.dp, d))
	rep := resync(t, e.dp, d)
	assertNoChange(t, "Resync", rep)
	if !rep.Full {
		t.Error("Resync should report Full")
	}
	assertNoChange(t, "second Resync", resync(t, e.dp, d))
	w.assertQuiet(t)

	after := assertKernel(t, e.nl, d)
	if after.vtepIndex != before.vtepIndex {
		t.Fatalf("VTEP ifindex %d -> %d: it was replaced", before.vtepIndex, after.vtepIndex)
	}

	// A new Dataplane (an agent restart) starts with a full pass that also
	// finds nothing to do.
	dp2, err := vxlan.New(vxlan.Options{NetNS: e.host.NsHandle(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer dp2.Close()
	assertNoChange(t, "Apply after restart", apply(t, dp2, d))
	w.assertQuiet(t)
}

// TestPeerChanges applies membership changes incrementally; after each, the
// kernel matches and a Resync finds nothing left to fix.
func TestPeerChanges(t *testing.T) {
	mutate := func(f func(d *vxlan.Desired)) func() vxlan.Desired {
		return func() vxlan.Desired { d := desiredN(4); f(&d); return d }
	}
	cases := []struct {
		name string
		next func() vxlan.Desired
		want vxlan.Report // only the entry counts are compared
	}{
		{"add peer", func() vxlan.Desired { return desiredN(5) },
			vxlan.Report{Neighbours: vxlan.Counts{Added: 1}, FDB: vxlan.Counts{Added: 1}, Routes: vxlan.Counts{Added: 1}}},
		{"remove peer", func() vxlan.Desired { return desiredN(3) },
			vxlan.Report{Neighbours: vxlan.Counts{Removed: 1}, FDB: vxlan.Counts{Removed: 1}, Routes: vxlan.Counts{Removed: 1}}},
		{"remove all", func() vxlan.Desired { return desiredN(0) },
			vxlan.Report{Neighbours: vxlan.Counts{Removed: 4}, FDB: vxlan.Counts{Removed: 4}, Routes: vxlan.Counts{Removed: 4}}},
		{"MAC change", mutate(func(d *vxlan.Desired) { d.Peers[1].VTEPMAC = mustMAC("70:b3:d5:41:00:03") }),
			vxlan.Report{Neighbours: vxlan.Counts{Updated: 1}, FDB: vxlan.Counts{Added: 1, Removed: 1}}},
		{"underlay IP change", mutate(func(d *vxlan.Desired) { d.Peers[1].UnderlayIP = netip.MustParseAddr("198.18.1.3") }),
			vxlan.Report{FDB: vxlan.Counts{Updated: 1}}},
		{"VTEP IP change", mutate(func(d *vxlan.Desired) { d.Peers[1].VTEPIP = netip.MustParseAddr("100.64.9.9") }),
			vxlan.Report{Neighbours: vxlan.Counts{Added: 1, Removed: 1}, Routes: vxlan.Counts{Updated: 1}}},
		{"lost its IP", mutate(func(d *vxlan.Desired) { d.Peers[1].UnderlayIP = netip.Addr{} }),
			vxlan.Report{Neighbours: vxlan.Counts{Removed: 1}, FDB: vxlan.Counts{Removed: 1}, Routes: vxlan.Counts{Removed: 1}}},
		{"second subnet", mutate(func(d *vxlan.Desired) {
			d.Peers[1].Subnets = append(d.Peers[1].Subnets, netip.MustParsePrefix("10.200.0.0/24"))
		}), vxlan.Report{Routes: vxlan.Counts{Added: 1}}},
		{"subnet moves to another peer", mutate(func(d *vxlan.Desired) {
			d.Peers[1].Subnets, d.Peers[2].Subnets = nil, append(d.Peers[2].Subnets, d.Peers[1].Subnets...)
		}), vxlan.Report{Routes: vxlan.Counts{Updated: 1}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			start := desiredN(4)
			apply(t, e.dp, start)
			next := tc.next()
			rep := apply(t, e.dp, next)
			if rep.Full {
				t.Error("incremental Apply read the kernel back")
			}
			if rep.Neighbours != tc.want.Neighbours || rep.FDB != tc.want.FDB || rep.Routes != tc.want.Routes {
				t.Errorf("counts neigh %+v fdb %+v routes %+v; want %+v %+v %+v",
					rep.Neighbours, rep.FDB, rep.Routes, tc.want.Neighbours, tc.want.FDB, tc.want.Routes)
			}
			assertKernel(t, e.nl, next)
			assertNoChange(t, "Resync after incremental change", resync(t, e.dp, next))
			// and back again
			apply(t, e.dp, start)
			assertKernel(t, e.nl, start)
			assertNoChange(t, "Resync after change back", resync(t, e.dp, start))
		})
	}
}

// TestDeviceMismatch changes the VTEP by hand. Identity parameters get the
// device replaced (new ifindex) and everything on it re-added; MTU and up
// state are fixed in place without disturbing its entries.
func TestDeviceMismatch(t *testing.T) {
	recreate := func(f func(vx *netlink.Vxlan)) func(t *testing.T, e *env) {
		return func(t *testing.T, e *env) {
			t.Helper()
			l, err := e.nl.LinkByName(vtepName)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.nl.LinkDel(l); err != nil {
				t.Fatal(err)
			}
			vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: vtepName, MTU: 1450, HardwareAddr: vtepMAC(1)},
				VxlanId: 1024, Port: 4789, SrcAddr: net.IP(underlayIP(1).AsSlice())}
			f(vx)
			if err := e.nl.LinkAdd(vx); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name     string
		change   func(t *testing.T, e *env)
		replaced bool
	}{
		{"VNI", recreate(func(vx *netlink.Vxlan) { vx.VxlanId = 7 }), true},
		{"port", recreate(func(vx *netlink.Vxlan) { vx.Port = 8472 }), true},
		{"local", recreate(func(vx *netlink.Vxlan) { vx.SrcAddr = net.ParseIP("198.18.0.99") }), true},
		{"learning", recreate(func(vx *netlink.Vxlan) { vx.Learning = true }), true},
		{"MAC", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkSetHardwareAddr(l, mustMAC("70:b3:d5:40:ff:ff")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"not vxlan", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkDel(l); err != nil {
				t.Fatal(err)
			}
			if err := e.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: vtepName}}); err != nil {
				t.Fatal(err)
			}
			d, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkSetAlias(d, vxlan.OwnerAlias); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"deleted", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkDel(l); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"MTU", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkSetMTU(l, 1300); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"down", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			if err := e.nl.LinkSetDown(l); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"address", func(t *testing.T, e *env) {
			l, _ := e.nl.LinkByName(vtepName)
			a, _ := netlink.ParseAddr("100.64.0.1/16")
			if err := e.nl.AddrDel(l, a); err != nil {
				t.Fatal(err)
			}
			b, _ := netlink.ParseAddr("100.64.0.77/24")
			if err := e.nl.AddrAdd(l, b); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tc := range cases {
		for _, entry := range []string{"Apply", "Resync"} {
			t.Run(tc.name+"/"+entry, func(t *testing.T) {
				e := newEnv(t)
				d := desiredN(3)
				apply(t, e.dp, d)
				before := readKernel(t, e.nl)
				tc.change(t, e)
				var rep vxlan.Report
				var err error
				if entry == "Apply" {
					rep, err = e.dp.Apply(context.Background(), d)
				} else {
					rep, err = e.dp.Resync(context.Background(), d)
				}
				if err != nil {
					t.Fatal(err)
				}
				if rep.Changes() == 0 {
					t.Fatal("nothing was repaired")
				}
				after := assertKernel(t, e.nl, d)
				if replaced := after.vtepIndex != before.vtepIndex; replaced != tc.replaced {
					t.Errorf("replaced = %v (ifindex %d -> %d), want %v", replaced, before.vtepIndex, after.vtepIndex, tc.replaced)
				}
				l, _ := e.nl.LinkByName(vtepName)
				if vx, ok := l.(*netlink.Vxlan); !ok || vx.VxlanId != 1024 || vx.Port != 4789 || vx.Learning ||
					vx.MTU != 1450 || vx.Flags&net.FlagUp == 0 || vx.HardwareAddr.String() != vtepMAC(1).String() {
					t.Errorf("VTEP not repaired: %+v", l.Attrs())
				}
				assertAddrs(t, e.nl, vtepName, "100.64.0.1/16")
				assertNoChange(t, "Resync after repair", resync(t, e.dp, d))
			})
		}
	}
}

// TestForeignDevice: a non-VXLAN device with the VTEP's name that carve did
// not create is not deleted; the reconcile fails with a clear error.
func TestForeignDevice(t *testing.T) {
	e := newEnv(t)
	if err := e.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: vtepName}}); err != nil {
		t.Fatal(err)
	}
	_, err := e.dp.Apply(context.Background(), desiredN(1))
	if err == nil || !strings.Contains(err.Error(), "did not create") {
		t.Fatalf("err = %v, want a refusal", err)
	}
	if l, err := e.nl.LinkByName(vtepName); err != nil || l.Type() != "bridge" {
		t.Fatalf("foreign device touched: %v %v", l, err)
	}
}

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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestBridges(t *testing.T) {
	e := newEnv(t)
	// A pre-existing bridge with the desired name is adopted.
	must(t, e.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "m-carve"}}))
	d := desiredN(1)
	d.Bridges = []vxlan.Bridge{
		{Name: "m-carve", Gateway: netip.MustParsePrefix("10.128.1.1/25"), Gateway6: netip.MustParsePrefix("fd00:1::1/80"), MTU: 1420},
		{Name: "d-carve", Gateway: netip.MustParsePrefix("10.128.1.129/25"), MTU: 1420},
	}
	d.IPv6Forward = true
	rep := apply(t, e.dp, d)
	if rep.Bridges.Added != 1 || rep.Bridges.Updated != 1 {
		t.Errorf("bridges %+v, want 1 added 1 updated (adopted)", rep.Bridges)
	}
	assertAddrs(t, e.nl, "m-carve", "10.128.1.1/25", "fd00:1::1/80")
	assertAddrs(t, e.nl, "d-carve", "10.128.1.129/25")
	for _, link := range []string{vtepName, "m-carve", "d-carve"} {
		if v, _ := e.host.Sysctl("net.ipv6.conf." + link + ".forwarding"); v != "1" {
			t.Errorf("ipv6 forwarding on %s = %s", link, v)
		}
	}
	if v, _ := e.host.Sysctl("net.ipv6.conf.m-carve.accept_dad"); v != "0" {
		t.Errorf("accept_dad on the IPv6 gateway bridge = %s, want 0", v)
	}
	assertNoChange(t, "Resync", resync(t, e.dp, d))

	// The MAC of a created or adopted bridge is pinned: ports with lower
	// MACs (container veths) come and go without changing it.
	for i, name := range []string{"m-carve", "d-carve"} {
		br, err := e.nl.LinkByName(name)
		must(t, err)
		before := br.Attrs().HardwareAddr.String()
		port := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("port%d", i), HardwareAddr: mustMAC("02:00:00:00:00:01"), MTU: 1420},
			PeerName: fmt.Sprintf("peer%d", i)}
		must(t, e.nl.LinkAdd(port))
		must(t, e.nl.LinkSetMaster(port, br))
		must(t, e.nl.LinkSetUp(port))
		after, err := e.nl.LinkByName(name)
		must(t, err)
		if got := after.Attrs().HardwareAddr.String(); got != before {
			t.Errorf("%s: MAC %s became %s when a port joined", name, before, got)
		}
		must(t, e.nl.LinkDel(port))
	}

	// Gateway change, bridge removal (incremental).
	d.Bridges = []vxlan.Bridge{{Name: "m-carve", Gateway: netip.MustParsePrefix("10.128.1.1/26"), MTU: 1400}}
	rep = apply(t, e.dp, d)
	if rep.Bridges.Removed != 1 || rep.Addresses.Added != 1 || rep.Addresses.Removed != 2 {
		t.Errorf("bridges %+v addresses %+v", rep.Bridges, rep.Addresses)
	}
	assertAddrs(t, e.nl, "m-carve", "10.128.1.1/26")
	if _, err := e.nl.LinkByName("d-carve"); err == nil {
		t.Error("d-carve not removed")
	}
	if br, _ := e.nl.LinkByName("m-carve"); br.Attrs().MTU != 1400 {
		t.Errorf("MTU %d", br.Attrs().MTU)
	}
	assertNoChange(t, "Resync", resync(t, e.dp, d))
}

func TestIPv6Subnets(t *testing.T) {
	e := newEnv(t)
	d := desiredN(2)
	d.Peers[0].Subnets = append(d.Peers[0].Subnets, netip.MustParsePrefix("fd00:2::/80"))
	d.Peers[1].Subnets = append(d.Peers[1].Subnets, netip.MustParsePrefix("fd00:3::/80"))
	apply(t, e.dp, d)
	ks := assertKernel(t, e.nl, d)
	if got := ks.routes[netip.MustParsePrefix("fd00:2::/80")]; got != "via fe80::72b3:d5ff:fe40:2 dev vtep1024 metric 1026" {
		t.Errorf("IPv6 route %q", got)
	}
	assertNoChange(t, "Resync", resync(t, e.dp, d))
	// MAC change moves the link-local next hop.
	d.Peers[0].VTEPMAC = mustMAC("70:b3:d5:40:01:02")
	apply(t, e.dp, d)
	assertKernel(t, e.nl, d)
	assertNoChange(t, "Resync", resync(t, e.dp, d))
}

func TestLinkLocal(t *testing.T) {
	if got := vxlan.LinkLocal(mustMAC("70:b3:d5:40:00:03")); got != netip.MustParseAddr("fe80::72b3:d5ff:fe40:3") {
		t.Fatalf("LinkLocal = %s", got)
	}
}

// TestValidation: bad peers are reported and skipped, the good ones still
// programmed; a bad VTEP stops everything before touching the kernel.
func TestValidation(t *testing.T) {
	e := newEnv(t)
	d := desiredN(3)
	good := d
	bad := []vxlan.Peer{
		{ID: "z-badmac", UnderlayIP: underlayIP(9), VTEPIP: vtepIP(9), VTEPMAC: mustMAC("01:00:5e:00:00:01"), Subnets: []netip.Prefix{subnet(9)}},
		{ID: "z-dupip", UnderlayIP: underlayIP(10), VTEPIP: vtepIP(2), VTEPMAC: vtepMAC(10), Subnets: []netip.Prefix{subnet(10)}},
		{ID: "z-dupsubnet", UnderlayIP: underlayIP(11), VTEPIP: vtepIP(11), VTEPMAC: vtepMAC(11), Subnets: []netip.Prefix{subnet(2)}},
		{ID: "z-local", UnderlayIP: underlayIP(12), VTEPIP: vtepIP(12), VTEPMAC: vtepMAC(12), Subnets: []netip.Prefix{netip.MustParsePrefix("10.128.1.0/25")}},
		{ID: "z-self", UnderlayIP: underlayIP(13), VTEPIP: vtepIP(1), VTEPMAC: vtepMAC(13)},
		{ID: "z-family", UnderlayIP: netip.MustParseAddr("2001:db8::1"), VTEPIP: vtepIP(14), VTEPMAC: vtepMAC(14)},
		{ID: "z-noip", VTEPIP: vtepIP(15), VTEPMAC: vtepMAC(15), Subnets: []netip.Prefix{subnet(15)}},
	}
	d.Peers = append(append([]vxlan.Peer{}, d.Peers...), bad...)
	rep, err := e.dp.Apply(context.Background(), d)
	if err == nil {
		t.Fatal("want an error for the bad peers")
	}
	if rep.Rejected != 6 {
		t.Errorf("rejected %d, want 6: %v", rep.Rejected, rep.Errors)
	}
	for _, pe := range rep.Errors {
		if pe.Kind != vxlan.KindPeer || !strings.HasPrefix(pe.Peer, "z-") {
			t.Errorf("unexpected error %v", pe)
		}
	}
	// z-dupsubnet keeps its neighbour and FDB entry, only the route is refused.
	want := expect(good)
	got := readKernel(t, e.nl)
	if len(got.routes) != len(want.routes) || got.fdb[vtepMAC(11).String()] == "" || got.fdb[vtepMAC(15).String()] != "" {
		t.Errorf("kernel routes %v fdb %v", got.routes, got.fdb)
	}

	badVTEP := desiredN(1)
	badVTEP.VTEP.Name = "vtep-with-a-very-long-name"
	if _, err := e.dp.Apply(context.Background(), badVTEP); err == nil {
		t.Fatal("invalid VTEP accepted")
	}
	if _, err := e.nl.LinkByName(badVTEP.VTEP.Name[:15]); err == nil {
		t.Fatal("device created for an invalid VTEP")
	}
}

// TestKernelErrorsPerEntry: with IPv6 disabled in the namespace the kernel
// refuses the IPv6 entries; each is reported with the kernel's message and
// every IPv4 entry of the same batches is still programmed.
func TestKernelErrorsPerEntry(t *testing.T) {
	e := newEnv(t)
	must(t, e.host.SetSysctl("net.ipv6.conf.all.disable_ipv6", "1"))
	must(t, e.host.SetSysctl("net.ipv6.conf.default.disable_ipv6", "1"))
	d := desiredN(40)
	for i := range d.Peers {
		if i%7 == 3 {
			d.Peers[i].Subnets = append(d.Peers[i].Subnets, netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, byte(i)}), 64))
		}
	}
	rep, err := e.dp.Apply(context.Background(), d)
	if err == nil {
		t.Fatal("want errors")
	}
	if rep.Neighbours.Failed != 6 || rep.Routes.Failed != 6 || rep.Neighbours.Added != 40 || rep.Routes.Added != 40 || rep.FDB.Added != 40 {
		t.Fatalf("neigh %+v routes %+v fdb %+v", rep.Neighbours, rep.Routes, rep.FDB)
	}
	for _, ee := range rep.Errors {
		if !strings.HasPrefix(ee.Key, "f") || !strings.Contains(ee.Err.Error(), "IPv6 is disabled") || ee.Peer == "" {
			t.Errorf("error %v", ee)
		}
		var errno unix.Errno
		if !errors.As(ee, &errno) {
			t.Errorf("error %v carries no errno", ee)
		}
	}
	// The failed entries are retried: enable IPv6 and Apply again.
	must(t, e.host.SetSysctl("net.ipv6.conf.all.disable_ipv6", "0"))
	must(t, e.host.SetSysctl("net.ipv6.conf."+vtepName+".disable_ipv6", "0"))
	rep = apply(t, e.dp, d)
	if rep.Neighbours.Added != 6 || rep.Routes.Added != 6 {
		t.Fatalf("retry: neigh %+v routes %+v", rep.Neighbours, rep.Routes)
	}
	assertKernel(t, e.nl, d)
}

func TestCanceled(t *testing.T) {
	e := newEnv(t)
	d := desiredN(20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := e.dp.Apply(ctx, d)
	if err == nil || !errors.Is(rep.Errors[0], context.Canceled) {
		t.Fatalf("canceled Apply: %v", err)
	}
	apply(t, e.dp, d)
	assertKernel(t, e.nl, d)
	assertNoChange(t, "Resync", resync(t, e.dp, d))
}

func TestScale(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	e := newEnv(t)
	d := desiredN(3000)
	rep := apply(t, e.dp, d)
	if rep.Routes.Added != 3000 || rep.Neighbours.Added != 3000 || rep.FDB.Added != 3000 {
		t.Fatalf("%+v", rep)
	}
	assertKernel(t, e.nl, d)
	assertNoChange(t, "Resync", resync(t, e.dp, d))
	d2 := desiredN(2990)
	rep = apply(t, e.dp, d2)
	if rep.Routes.Removed != 10 || rep.Changes() != 30 {
		t.Fatalf("%+v", rep)
	}
	assertKernel(t, e.nl, d2)
}

func TestClose(t *testing.T) {
	e := newEnv(t)
	must(t, e.dp.Close())
	must(t, e.dp.Close())
	if _, err := e.dp.Apply(context.Background(), desiredN(1)); err == nil {
		t.Fatal("Apply after Close")
	}
}

// TestVTEPRename: a new VTEP name (a changed network config) replaces carve's
// old VTEP, incrementally and on a restart alike.
func TestVTEPRename(t *testing.T) {
	for _, restart := range []bool{false, true} {
		e := newEnv(t)
		d := desiredN(2)
		apply(t, e.dp, d)
		d.VTEP.Name = "vtep2048"
		dp := e.dp
		if restart {
			var err error
			if dp, err = vxlan.New(vxlan.Options{NetNS: e.host.NsHandle(), Logger: slog.New(slog.DiscardHandler)}); err != nil {
				t.Fatal(err)
			}
			defer dp.Close()
		}
		rep := apply(t, dp, d)
		if rep.VTEP.Added != 1 || rep.VTEP.Removed != 1 {
			t.Errorf("restart %v: VTEP counts %+v", restart, rep.VTEP)
		}
		if _, err := e.nl.LinkByName(vtepName); err == nil {
			t.Errorf("restart %v: old VTEP left", restart)
		}
		l, err := e.nl.LinkByName("vtep2048")
		if err != nil {
			t.Fatal(err)
		}
		routes, err := e.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: vxlan.Protocol}, netlink.RT_FILTER_PROTOCOL)
		must(t, err)
		if len(routes) != 2 || routes[0].LinkIndex != l.Attrs().Index {
			t.Errorf("restart %v: routes %v", restart, routes)
		}
		assertNoChange(t, "Resync", resync(t, dp, d))
	}
}

// TestGrantedBlockRoutes: a block agent 1 granted agent 2 out of its
// subnet (10.128.1.96/27) is routed to agent 2 on a third host and on the
// donor (a longer prefix than the donor's subnet, which keeps its own
// connected route); the recipient carries a gateway in the block beside its
// own and routes the donor's whole subnet, its block winning by longest
// match. A peer route that would take a local gateway is still refused.
func TestGrantedBlockRoutes(t *testing.T) {
	block := netip.MustParsePrefix("10.128.1.96/27")
	withBlock := func(d vxlan.Desired) vxlan.Desired {
		for i := range d.Peers {
			if d.Peers[i].ID == peer(2).ID {
				d.Peers[i].Subnets = append(d.Peers[i].Subnets, block)
			}
		}
		return d
	}
	t.Run("third host", func(t *testing.T) {
		e := newEnv(t)
		d := withBlock(desiredFor(3, 1, 2))
		apply(t, e.dp, d)
		got := assertKernel(t, e.nl, d)
		if !strings.Contains(got.routes[block], "via "+vtepIP(2).String()) {
			t.Errorf("granted block routed %q", got.routes[block])
		}
	})
	t.Run("donor", func(t *testing.T) {
		e := newEnv(t)
		d := withBlock(desiredFor(1, 2))
		apply(t, e.dp, d)
		assertKernel(t, e.nl, d)
		steal := desiredFor(1, 2)
		steal.Peers[0].Subnets = append(steal.Peers[0].Subnets, netip.MustParsePrefix("10.128.1.0/27"))
		if rep, _ := e.dp.Apply(context.Background(), steal); rep.Rejected != 1 {
			t.Errorf("a peer route over the local gateway: rejected %d (%v)", rep.Rejected, rep.Errors)
		}
	})
	t.Run("recipient", func(t *testing.T) {
		e := newEnv(t)
		d := desiredFor(2, 1)
		d.Bridges[0].Extra = []netip.Prefix{netip.PrefixFrom(block.Addr().Next(), block.Bits())}
		apply(t, e.dp, d)
		assertKernel(t, e.nl, d)
		l, err := e.nl.LinkByName("m-carve")
		if err != nil {
			t.Fatal(err)
		}
		addrs, err := e.nl.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range addrs {
			got = append(got, a.IPNet.String())
		}
		if !slices.Contains(got, "10.128.1.97/27") || !slices.Contains(got, "10.128.2.1/25") {
			t.Errorf("bridge addresses %v", got)
		}
	})
}
