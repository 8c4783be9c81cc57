package vxlan_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

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
